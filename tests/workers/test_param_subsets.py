"""Training and scoring a subset of the parameters (`learner.trainable`, `scorer.params`)."""

import pytest
import torch

from compassplay.config import ConfigError, LearnerSection
from compassplay.engines import make_learner
from compassplay.workers.builders import freeze_except, param_globs, scorer_params
from tests.tiny_models import synthetic_trajectories, tiny_causal_lm


def test_last_k_selects_the_top_blocks_and_the_final_norm():
    model = tiny_causal_lm(num_layers=3)
    assert param_globs("last:1", model) == ["model.layers.2.*", "model.norm.*"]
    assert param_globs("all", model) is None and scorer_params("all", model) == "all"
    assert scorer_params("proj:64", model)["dim"] == 64


def test_frozen_parameters_stay_put_and_the_rest_learn():
    model = tiny_causal_lm(num_layers=3, seed=1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    kept = freeze_except(model, "last:1", "learner.trainable")
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(("model.layers.2.", "model.norm.")) for n in trainable)
    assert kept == sum(p.numel() for p in model.parameters() if p.requires_grad)
    trajs = synthetic_trajectories(model, n=4, seed=2)
    make_learner(LearnerSection(lr=1e-2, micro_batch=2), model, total_steps=1).step(trajs)
    for n, p in model.named_parameters():
        moved = not torch.equal(p, before[n])
        assert moved == (n in trainable) or (n in trainable and "k_proj.bias" in n), n


def test_a_spec_that_matches_nothing_names_the_field():
    with pytest.raises(ConfigError, match="learner.trainable"):
        freeze_except(tiny_causal_lm(), "nothing.*", "learner.trainable")
