"""Realized utility: the weights come back bit for bit, the AdamW step equals a real AdamW step
(fresh, and continuing a saved state), the plain and direction steps have their lengths, and
the first-order prediction -<delta, g_ref> matches the realized drop for a small step, with the
inner product the scorer computes."""

import copy

import pytest
import torch

from compassplay.rewards.batch import Example, mean_example_loss
from compassplay.rewards.fixed_set_loss import FixedSetLoss, frozen_prefix_layers
from compassplay.rewards.gradient import GradientScorer
from compassplay.rewards.preconditioner import metric_cosine
from compassplay.rewards.soar import mean_loss
from compassplay.rewards.utility import (
    adamw_delta,
    direction_delta,
    grad_norm,
    loss_gradient,
    predicted_drop,
    sgd_delta,
    step_drops,
)
from tests.tiny_models import tiny_causal_lm


def _examples(seed: int, n: int) -> list[Example]:
    g = torch.Generator().manual_seed(seed)
    return [Example(torch.randint(0, 256, (5 + i % 3,), generator=g).tolist(),
                    torch.randint(0, 256, (4 + i % 4,), generator=g).tolist()) for i in range(n)]


def test_fresh_adamw_step_equals_adamw_on_a_copy_and_restores_the_weights():
    model = tiny_causal_lm(seed=1)
    cand, held, ref = _examples(0, 1)[0], _examples(1, 5), _examples(2, 4)
    losses = {"held": FixedSetLoss(model, held), "ref": FixedSetLoss(model, ref)}
    before = {"held": mean_example_loss(model, held), "ref": mean_example_loss(model, ref)}
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    delta = adamw_delta(model, loss_gradient(model, [cand]), None, lr=1e-3, max_grad_norm=1.0)
    got = step_drops(model, delta, losses, before)
    for n, p in model.named_parameters():
        assert torch.equal(p, start[n]), n
    oracle = copy.deepcopy(model)
    mean_loss(oracle, [cand]).backward()
    torch.nn.utils.clip_grad_norm_(oracle.parameters(), 1.0)
    torch.optim.AdamW(oracle.parameters(), lr=1e-3, weight_decay=0.0).step()
    with torch.no_grad():
        want_h = before["held"] - float(mean_loss(oracle, held))
        want_r = before["ref"] - float(mean_loss(oracle, ref))
    assert got["held"] == pytest.approx(want_h, abs=1e-6)
    assert got["ref"] == pytest.approx(want_r, abs=1e-6)
    assert abs(got["ref"]) > 1e-5  # the step changed something


def test_adamw_step_continues_a_saved_optimizer_state_exactly():
    """adamw_delta with a state_dict saved after two real steps equals the third step of that
    optimizer (its moments, step count and learning rate), not a fresh one's."""
    model = tiny_causal_lm(seed=6)
    for name, p in model.named_parameters():
        p.requires_grad_("layers.1." in name or "norm" in name)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    for k in range(2):
        opt.zero_grad()
        mean_loss(model, _examples(10 + k, 3)).backward()
        opt.step()
    opt.zero_grad()
    state = copy.deepcopy(opt.state_dict())
    cand = _examples(20, 2)
    grad = loss_gradient(model, cand)
    delta = adamw_delta(model, grad, state, lr=1.0, max_grad_norm=1e9)  # lr from the state
    fresh = adamw_delta(model, grad, None, lr=3e-3, max_grad_norm=1e9)
    start = [p.detach().clone() for p in params]
    for p, g in zip(params, grad, strict=True):
        p.grad = g.clone()
    opt.step()
    for d, p, s in zip(delta, params, start, strict=True):
        assert torch.allclose(d, p.detach() - s, atol=1e-9, rtol=1e-5)
    assert max(float((d - f).abs().max()) for d, f in zip(delta, fresh, strict=True)) > 1e-4


def test_direction_and_sgd_steps_have_their_lengths_and_first_order_drops():
    model = tiny_causal_lm(seed=7)
    cand, ref = _examples(30, 1)[0], _examples(31, 5)
    grad, g_ref = loss_gradient(model, [cand]), loss_gradient(model, ref)
    loss = {"ref": FixedSetLoss(model, ref)}
    before = {"ref": mean_example_loss(model, ref)}
    d = direction_delta(grad, 1e-3)
    assert grad_norm(d) == pytest.approx(1e-3, rel=1e-6)
    s = sgd_delta(grad, 1e-4)
    assert grad_norm(s) == pytest.approx(1e-4 * grad_norm(grad), rel=1e-6)
    for delta in (d, s):
        pred = predicted_drop(delta, g_ref)
        assert step_drops(model, delta, loss, before)["ref"] == pytest.approx(pred, rel=0.05)
    # the direction step's prediction is length x ||g_ref|| x cos(g, g_ref)
    cos = metric_cosine(grad, g_ref, None)
    assert predicted_drop(d, g_ref) == pytest.approx(1e-3 * grad_norm(g_ref) * cos, rel=1e-6)
    assert all(float(t.abs().sum()) == 0 for t in direction_delta([torch.zeros(3)], 1.0))


def test_first_order_prediction_matches_the_realized_drop_for_small_eta():
    """realized - predicted is the second-order remainder: O(eta^2). A wrong prediction (a
    wrong inner product, sign or scale) leaves an O(eta) error instead."""
    model = tiny_causal_lm(seed=2)
    cands, ref = _examples(3, 4), _examples(4, 6)
    before = {"ref": mean_example_loss(model, ref)}
    scorer = GradientScorer(model, params="all")
    scorer.set_reference(ref)
    inner = scorer.partials(cands).inner
    g_ref, loss = loss_gradient(model, ref), {"ref": FixedSetLoss(model, ref)}
    for i, cand in enumerate(cands):
        grad = loss_gradient(model, [cand])
        small, big = sgd_delta(grad, 1e-3), sgd_delta(grad, 1e-2)
        small_pred, big_pred = predicted_drop(small, g_ref), predicted_drop(big, g_ref)
        assert small_pred == pytest.approx(1e-3 * float(inner[i]), rel=1e-4)
        small_real = step_drops(model, small, loss, before)["ref"]
        big_real = step_drops(model, big, loss, before)["ref"]
        assert small_real == pytest.approx(small_pred, rel=0.06)  # measured 1-5%
        # 10x the step: the remainder grows ~100x (measured 51-134x); linear error: 10x
        assert abs(big_real - big_pred) > 25 * abs(small_real - small_pred)


def _freeze_below(model, k: int) -> None:
    """Embeddings and decoder layers < k frozen, the rest trainable."""
    for name, p in model.named_parameters():
        frozen = "embed_tokens" in name or any(f"layers.{i}." in name for i in range(k))
        p.requires_grad_(not frozen)


@pytest.mark.parametrize("tie", [True, False])
def test_fixed_set_loss_with_a_cached_frozen_prefix_equals_the_plain_forward(tie):
    """After the trainable top changes (as one optimizer step changes it), the loss from the
    cached layer-k hidden states equals the whole model's forward (the oracle)."""
    model = tiny_causal_lm(seed=3, num_layers=3, tie=tie)
    if tie:
        for p in model.parameters():  # the tied head is the embedding: freezing it is the point
            p.requires_grad_(True)
        model.model.layers[0].requires_grad_(False)
        model.model.embed_tokens.requires_grad_(False)
    else:
        _freeze_below(model, 2)
    held = _examples(5, 7)
    start = mean_example_loss(model, held)
    loss = FixedSetLoss(model, held, max_batch_tokens=24)  # several micro-batches
    assert loss.prefix_layers == (1 if tie else 2)
    assert loss(model) == pytest.approx(mean_example_loss(model, held), abs=1e-6)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    moved = mean_example_loss(model, held)
    assert abs(moved - start) > 1e-3  # the cache is not stale: the loss moved
    assert loss(model) == pytest.approx(moved, abs=1e-5)


def test_fixed_set_loss_runs_the_whole_model_when_the_embeddings_train():
    model = tiny_causal_lm(seed=4, num_layers=2)
    assert frozen_prefix_layers(model) == 0
    held = _examples(6, 3)
    loss = FixedSetLoss(model, held)
    assert loss.prefix_layers == 0 and loss(model) == mean_example_loss(model, held)
    _freeze_below(model, 2)  # everything but the final norm (and an untied head) frozen
    assert frozen_prefix_layers(model) == 2


def test_fixed_set_loss_falls_back_to_the_plain_forward_when_its_check_disagrees(caplog):
    """A negative tolerance makes any check fail: the loss must then run the whole model."""
    model = tiny_causal_lm(seed=5, num_layers=3)
    _freeze_below(model, 2)
    held = _examples(7, 4)
    loss = FixedSetLoss(model, held, check_tol=-1.0)
    assert loss.prefix_layers == 0 and "using the plain forward" in caplog.text
    assert loss(model) == mean_example_loss(model, held)
