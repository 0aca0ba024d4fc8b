from __future__ import annotations

import pytest
import torch

from compassplay.config import LearnerSection
from compassplay.engines import make_learner
from compassplay.engines.training.logprobs import head_on_hidden
from tests.engines.adam_steps import assert_same_adam_step
from tests.engines.helpers import assert_reset_replays_first_step
from tests.tiny_models import synthetic_trajectories, tiny_causal_lm

pytest.importorskip("deepspeed")


@pytest.mark.slow
def test_deepspeed_zero2_matches_torch(tmp_path):
    cfg = LearnerSection(lr=1e-3, micro_batch=2, max_grad_norm=0.5, schedule="linear",
                         mini_batch_size=0)
    results = {}
    for backend in ("torch", "deepspeed"):
        model = tiny_causal_lm(seed=2)
        learner = make_learner(cfg.model_copy(update={"backend": backend, "zero_stage": 2}),
                               model, total_steps=4)
        stats = [learner.step(synthetic_trajectories(model, n=5, seed=s)) for s in range(2)]
        results[backend] = (stats, learner.state_dict_for_sync(), learner)
    (ts, tw, _), (ds, dw, dl) = results["torch"], results["deepspeed"]
    # both backends take the vocabulary head at completion positions only (the same sums)
    assert head_on_hidden(dl.slots["policy"].module)
    for a, b in zip(ts, ds, strict=True):
        assert b.loss == pytest.approx(a.loss, rel=1e-5, abs=1e-7)
        assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-5)
        assert b.lr == pytest.approx(a.lr) and b.weight_version == a.weight_version
    assert ts[0].grad_norm > cfg.max_grad_norm  # clipping was active
    assert set(tw) == set(dw)
    for k in tw:  # Adam divides by |g|: tolerance relative to the lr
        torch.testing.assert_close(dw[k], tw[k], atol=1e-3 * cfg.lr, rtol=1e-5)
    # DeepSpeed checkpoints round-trip into a fresh engine
    # (full weights gathered into the checkpoint's model/ folder, optimizer state apart)
    dl.save(tmp_path / "ck", tmp_path / "model")
    assert (tmp_path / "model" / "model.safetensors").is_file()
    assert (tmp_path / "model" / "generation_config.json").is_file()
    assert not (tmp_path / "ck" / "model.safetensors").exists()
    other = make_learner(cfg.model_copy(update={"backend": "deepspeed"}), tiny_causal_lm(seed=9),
                         total_steps=4)
    other.load(tmp_path / "ck", tmp_path / "model")
    ow = other.state_dict_for_sync()
    assert all(torch.equal(ow[k], dw[k]) for k in dw) and other.weight_version == 2
    batch = synthetic_trajectories(other.slots["policy"].engine.module, n=5, seed=7)
    assert other.step(batch).loss == pytest.approx(dl.step(batch).loss, rel=1e-6)


def test_zero3_accumulates_every_micro_batch_as_torch_does():
    """Three micro-batches on one rank: DeepSpeed 0.19 (0.19.8 here) advances ZeRO's
    micro-step (copy the first micro-batch's gradient, add the later ones) in
    `engine.forward`, which the learner's forward on the base model's hidden states never
    calls; without `Slot.begin_pass` every micro-batch overwrote the one before and the
    update was the last one's alone."""
    cfg = LearnerSection(lr=1e-3, micro_batch=2, max_grad_norm=100.0, schedule="constant",
                         mini_batch_size=0)
    before = tiny_causal_lm(seed=2).state_dict()
    stats, weights = {}, {}
    for backend in ("torch", "deepspeed"):
        model = tiny_causal_lm(seed=2)
        learner = make_learner(cfg.model_copy(update={"backend": backend, "zero_stage": 3}),
                               model, total_steps=2)
        stats[backend] = learner.step(synthetic_trajectories(tiny_causal_lm(seed=2), n=5,
                                                             seed=4))
        weights[backend] = learner.state_dict_for_sync()
    assert stats["deepspeed"].loss == pytest.approx(stats["torch"].loss, rel=1e-5, abs=1e-7)
    assert stats["deepspeed"].grad_norm == pytest.approx(stats["torch"].grad_norm, rel=1e-5)
    tight = total = 0
    for k in weights["torch"]:  # Adam's first step: a sign step but near zero gradients
        t, n = assert_same_adam_step(weights["deepspeed"][k], weights["torch"][k], before[k],
                                     cfg.lr, atol=1e-3 * cfg.lr, name=k)
        tight, total = tight + t, total + n
    assert tight > 0.99 * total


@pytest.mark.slow
def test_zero3_reset_in_place_equals_a_fresh_learner():
    """LearnerWorker.restore without a checkpoint: back to the initial weights in place (the
    ZeRO-3 parameters are partitioned: no load_state_dict), fresh AdamW and schedule."""
    cfg = LearnerSection(backend="deepspeed", zero_stage=3, lr=1e-3, micro_batch=2,
                         schedule="linear", mini_batch_size=0)
    model = tiny_causal_lm(seed=2)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    batch = synthetic_trajectories(tiny_causal_lm(seed=2), n=5, seed=3)
    learner = make_learner(cfg, model, total_steps=4)
    assert_reset_replays_first_step(learner, batch, initial)


@pytest.mark.slow
def test_deepspeed_mini_batches_match_torch():
    """learner.mini_batch_size: several optimizer steps per batch, the same on both backends."""
    cfg = LearnerSection(lr=1e-3, micro_batch=2, max_grad_norm=0.5, mini_batch_size=2)
    weights, stats = {}, {}
    for backend in ("torch", "deepspeed"):
        model = tiny_causal_lm(seed=2)
        learner = make_learner(cfg.model_copy(update={"backend": backend, "zero_stage": 2}),
                               model)
        stats[backend] = learner.step(synthetic_trajectories(model, n=5, seed=0))
        weights[backend] = learner.state_dict_for_sync()
    assert stats["deepspeed"].loss == pytest.approx(stats["torch"].loss, rel=1e-5, abs=1e-7)
    assert stats["deepspeed"].grad_norm == pytest.approx(stats["torch"].grad_norm, rel=1e-5)
    one = make_learner(cfg.model_copy(update={"mini_batch_size": 0}), tiny_causal_lm(seed=2))
    one.step(synthetic_trajectories(tiny_causal_lm(seed=2), n=5, seed=0))
    for k in weights["torch"]:
        torch.testing.assert_close(weights["deepspeed"][k], weights["torch"][k],
                                   atol=1e-3 * cfg.lr, rtol=1e-5)
    # 3 optimizer steps (1 + 2 + 2 trajectories) end elsewhere than one step on all 5
    single = one.state_dict_for_sync()
    assert sum(float((weights["torch"][k] - single[k]).abs().sum()) for k in single) > 0
