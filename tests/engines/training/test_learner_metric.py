"""The learner's AdamW metric (reward.kind=precond_cosine): `Slot.preconditioner` against the
optimizer's own state, the scorer snapshot that carries it, and the config checks."""

from __future__ import annotations

import pytest
import torch

from compassplay.config import ConfigError, LearnerSection, load_config
from compassplay.engines import make_learner
from compassplay.workers.learner_worker import metric_names
from compassplay.workers.versioned import split_metric, with_metric
from tests.tiny_models import synthetic_trajectories, tiny_causal_lm


def test_preconditioner_is_the_adamw_metric_of_the_optimizer_state():
    model = tiny_causal_lm(seed=0)
    for n, p in model.named_parameters():  # freeze one block: no optimizer state there
        if n.startswith("model.layers.0."):
            p.requires_grad_(False)
    learner = make_learner(LearnerSection(lr=1e-2, micro_batch=2), model)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    before = learner.preconditioner(names)
    assert all(torch.equal(m, torch.ones_like(m)) for m in before.values())  # no state: ones
    for seed in range(3):
        learner.step(synthetic_trajectories(model, n=4, seed=seed))
    got = learner.preconditioner(names)
    slot = learner.slots["policy"]
    params = dict(model.named_parameters())
    group = slot.optimizer.param_groups[0]
    beta2, eps = group["betas"][1], group["eps"]
    moved = 0
    for n in names:
        st = slot.optimizer.state[params[n]]
        step = int(st["step"])
        assert step == 3
        v_hat = st["exp_avg_sq"].double() / (1 - beta2 ** step)
        want = (1.0 / (v_hat.sqrt() + eps)).float()
        m = got[n]
        assert m.device.type == "cpu" and m.dtype == torch.float32 and m.shape == params[n].shape
        torch.testing.assert_close(m, want, rtol=1e-5, atol=0)
        moved += int((m != 1).sum())
    assert moved > 0.5 * sum(params[n].numel() for n in names)  # far from the identity
    with pytest.raises(ValueError, match="not a parameter this learner trains"):
        learner.preconditioner(["model.layers.0.mlp.up_proj.weight"])


def test_scorer_snapshot_metric_roundtrip():
    weights = {"a.weight": torch.zeros(2, 3), "b.bias": torch.ones(4)}
    metric = {"a.weight": torch.full((2, 3), 7.0)}
    state, got = split_metric(with_metric(weights, metric))
    assert set(state) == set(weights) and set(got) == {"a.weight"}
    assert torch.equal(got["a.weight"], metric["a.weight"])
    assert split_metric(weights) == (weights, None)


MICRO = "compassplay/configs/micro.yaml"


@pytest.mark.parametrize("override,match", [
    ("learner.backend=deepspeed", "learner.backend=torch"),
    ("scorer.params=proj:64", "projection"),
    ("reward.reference=local", "reference=global"),
    ("learner.weight_sync=nccl", "weight_sync"),
])
def test_precond_cosine_config_checks(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(MICRO, ["reward.kind=precond_cosine", override])
    load_config(MICRO, ["reward.kind=cosine", override])  # the check is precond_cosine's


def test_scorer_params_must_be_trainable():
    cfg = load_config(MICRO, ["reward.kind=precond_cosine", "learner.trainable=last:1",
                              "scorer.params=all"])
    model = tiny_causal_lm(seed=0)
    from compassplay.workers.builders import freeze_except

    freeze_except(model, cfg.learner.trainable, "learner.trainable")
    with pytest.raises(ConfigError, match="scorer.params"):
        metric_names(cfg, model)
    cfg = load_config(MICRO, ["reward.kind=precond_cosine", "learner.trainable=last:1",
                              "scorer.params=last:1"])
    names = metric_names(cfg, model)
    assert names and all(p.requires_grad for n, p in model.named_parameters() if n in names)
    assert set(names) == {n for n, p in model.named_parameters() if p.requires_grad}
