import pytest
import torch

from compassplay.config import ModelSection
from compassplay.models import load_model
from compassplay.rewards.batch import Example
from compassplay.rewards.soar import mean_loss, measured_utility, split_groups


def test_split_groups_covers_everything_once():
    groups = split_groups(5, 2)
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3, 4]
    assert sorted(len(g) for g in groups) == [2, 3]
    assert split_groups(2, 4) == [[0], [1]]
    assert split_groups(0, 3) == [[]]


def test_utility_is_reference_loss_drop_and_weights_are_restored():
    model, _ = load_model(ModelSection(), seed=0)
    ref = [Example([1, 2, 3], [4, 5]), Example([7], [8, 9, 10])]
    same = [Example([1, 2, 3], [4, 5])]
    other = [Example([200, 201], [202, 203, 204])]
    model.lm_head.weight.grad = torch.ones_like(model.lm_head.weight)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    util = measured_utility(model, [same, other], ref, lr=0.05)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert torch.equal(model.lm_head.weight.grad, torch.ones_like(model.lm_head.weight))
    # training on a reference item itself lowers the reference loss more than unrelated data
    assert util[0] > 0 and util[0] > util[1]
    # the value is exactly the loss difference of one SGD step, recomputed by hand
    params = [p for p in model.parameters()]
    grads = torch.autograd.grad(mean_loss(model, same), params, allow_unused=True)
    with torch.no_grad():
        l0 = float(mean_loss(model, ref))
        for p, g in zip(params, grads, strict=True):
            if g is not None:
                p.sub_(0.05 * g)
        l1 = float(mean_loss(model, ref))
    assert util[0] == pytest.approx(l0 - l1, rel=1e-5, abs=1e-7)


def test_empty_reference_is_an_error():
    model, _ = load_model(ModelSection(), seed=0)
    with pytest.raises(ValueError, match="reference set is empty"):
        measured_utility(model, [[Example([1], [2])]], [])
