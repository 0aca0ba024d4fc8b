"""SOAR as the paper describes it: a trained copy per group, gains on held-out problems."""

from __future__ import annotations

import copy

import pytest
import torch

from compassplay.rewards.batch import Example, example_loss
from compassplay.rewards.soar import (
    HeldOutItem,
    check_disjoint,
    greedy_ids,
    make_groups,
    soar_gains,
    split_groups,
    train_copy,
)
from tests.rewards.conftest import tiny_model

GROUPS = [[Example([1, 2, 3], [4, 5]), Example([6, 7], [8, 9, 10])],
          [Example([20, 21], [22, 23, 24])],
          [Example([30], [31]), Example([32, 33, 34], [35])]]
HELDOUT = [Example([1, 2], [4, 5, 6]), Example([40, 41, 42], [43, 44])]
REFERENCE = [Example([50, 51], [52, 53])]


def _oracle_copy(model, group, steps, lr):
    """Plain autograd: per-example unpadded losses, mean, SGD update on a deep copy."""
    m = copy.deepcopy(model)
    params = [p for p in m.parameters() if p.requires_grad]
    for _ in range(steps):
        loss = torch.stack([example_loss(m, e) for e in group]).mean()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                if g is not None:
                    p.sub_(lr * g)
    return m


def _oracle_loss(model, items):
    with torch.no_grad():
        return float(torch.stack([example_loss(model, e) for e in items]).mean())


def test_loss_gain_matches_hand_oracle_and_leaves_model_untouched():
    model = tiny_model("qwen2", tied=True).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = soar_gains(model, GROUPS, [HeldOutItem(e) for e in HELDOUT], metric="loss",
                     inner_steps=2, lr=0.5, reference=REFERENCE)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    l0 = _oracle_loss(model, HELDOUT)
    want = [l0 - _oracle_loss(_oracle_copy(model, g, 2, 0.5), HELDOUT) for g in GROUPS]
    assert res.gains == pytest.approx(want, rel=1e-4, abs=1e-6)
    assert res.before == pytest.approx(l0, rel=1e-5)
    assert max(abs(g) for g in res.gains) > 1e-4  # the copies really moved
    # cost: 2 inner steps over every group's tokens; one held-out pass per copy + the base
    assert res.train_tokens == 2 * sum(len(e) for g in GROUPS for e in g)
    assert res.eval_tokens == 4 * sum(len(e) for e in HELDOUT)
    assert res.seconds > 0


def test_accuracy_gain_matches_hand_oracle():
    model = tiny_model("qwen2", tied=True).eval()
    # grade: "correct" when the greedy completion's first token equals the base model's
    # (so the base scores 1.0 and a copy scores the fraction it still agrees on)
    base = [greedy_ids(model, e.prompt_ids, 3) for e in HELDOUT]
    items = [HeldOutItem(e, grade=(lambda ids, b=b: ids[:1] == b[:1]))
             for e, b in zip(HELDOUT, base, strict=True)]
    res = soar_gains(model, GROUPS, items, metric="accuracy", inner_steps=3, lr=2.0,
                     max_new_tokens=3)
    assert res.before == 1.0
    want = []
    for g in GROUPS:
        m = _oracle_copy(model, g, 3, 2.0)
        acc = sum(greedy_ids(m, e.prompt_ids, 3)[:1] == b[:1]
                  for e, b in zip(HELDOUT, base, strict=True)) / len(HELDOUT)
        want.append(acc - 1.0)
    assert res.gains == pytest.approx(want)


def test_reference_items_are_never_held_out():
    with pytest.raises(ValueError, match="overlaps the reference set"):
        check_disjoint(REFERENCE, [HELDOUT[0], Example([50, 51], [99])])
    model = tiny_model("qwen2", tied=True)
    with pytest.raises(ValueError, match="overlaps the reference set"):
        soar_gains(model, GROUPS, [HeldOutItem(e) for e in REFERENCE], reference=REFERENCE)
    with pytest.raises(ValueError, match="non-empty held-out"):
        soar_gains(model, GROUPS, [])


def test_copy_trained_in_small_passes_matches_the_full_batch_oracle():
    """max_batch_tokens=1: every example is a pass of its own (the activations of one
    sequence, not the group's), and the update is still the group's mean-loss step."""
    model = tiny_model("qwen2", tied=True).eval()
    group = GROUPS[0] + GROUPS[2]
    trained, tokens = train_copy(model, group, inner_steps=2, lr=0.5, max_batch_tokens=1)
    want = _oracle_copy(model, group, 2, 0.5)
    for (name, a), b in zip(trained.named_parameters(), want.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    assert tokens == 2 * sum(len(e) for e in group)
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), model.parameters(),
                                                     strict=True))


def test_adamw_inner_optimizer_runs():
    model = tiny_model("qwen2", tied=True)
    res = soar_gains(model, GROUPS[:1], [HeldOutItem(e) for e in HELDOUT],
                     optimizer="adamw", lr=1e-2, inner_steps=2)
    assert len(res.gains) == 1 and res.gains[0] != 0.0


def test_groups_by_count_or_size():
    assert make_groups(5, 2) == split_groups(5, 2)
    assert make_groups(5, 4, group_size=2) == [[0, 1], [2, 3], [4]]
    assert make_groups(0, 3) == [] and make_groups(0, 3, group_size=2) == []
