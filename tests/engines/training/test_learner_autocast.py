"""learner.autocast: the learner's forward under torch.autocast(bfloat16) against the float32
forward of the same model (the oracle): log-probs within bfloat16 rounding and not equal to
them (autocast really ran), gradients in the same direction, float32 state everywhere, and
"auto" reading the machine's kept bfloat16 choice."""

from __future__ import annotations

import pytest
import torch

from compassplay.engines import dtype_choice, make_learner
from compassplay.engines.training.advantages import broadcast_to_tokens, trajectory_advantages
from compassplay.engines.training.logprobs import pack, token_logprobs
from tests.tiny_models import synthetic_trajectories, tiny_causal_lm


def _pg_grads(model: torch.nn.Module, trajs, autocast: torch.dtype | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(completion log-probs [N], the flat gradient of sum(adv * log p)) of `model`."""
    b = pack([t.generation for t in trajs])
    adv = broadcast_to_tokens(torch.tensor(trajectory_advantages(trajs)), b["mask"])
    model.zero_grad(set_to_none=True)
    lp = token_logprobs(model, b["input_ids"], b["attention_mask"], b["targets"], b["mask"],
                        autocast=autocast)
    (lp * adv * b["mask"]).sum().backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return lp[b["mask"] > 0].detach(), grad


def test_bfloat16_autocast_log_probs_and_gradients_follow_the_float32_oracle():
    model = tiny_causal_lm(seed=0, hidden_size=128)
    trajs = synthetic_trajectories(model, n=6)
    lp32, g32 = _pg_grads(model, trajs, None)
    lp16, g16 = _pg_grads(model, trajs, torch.bfloat16)
    assert lp16.dtype == torch.float32 and g16.dtype == torch.float32
    diff = (lp16 - lp32).abs()
    assert 0 < diff.max() < 0.02, diff.max()  # bfloat16 matmuls ran, and only rounded
    assert diff.mean() < 0.005
    cos = torch.nn.functional.cosine_similarity(g16, g32, dim=0)
    assert cos > 0.999, cos
    assert g16.norm() == pytest.approx(float(g32.norm()), rel=0.01)


def test_the_autocast_learner_keeps_float32_state_and_improves_the_objective(learner_cfg):
    model = tiny_causal_lm(seed=0)
    learner = make_learner(learner_cfg.model_copy(update={"autocast": "bfloat16"}), model)
    assert learner.autocast is torch.bfloat16
    trajs = synthetic_trajectories(model, n=8)

    b = pack([t.generation for t in trajs])
    adv = trajectory_advantages(trajs)

    def weighted() -> float:
        with torch.no_grad():
            lp = token_logprobs(model, b["input_ids"], b["attention_mask"], b["targets"])
        return float(sum(a * s for a, s in zip(adv, (lp * b["mask"]).sum(-1).tolist(),
                                               strict=True)))

    before = weighted()
    for k in range(3):
        stats = learner.step(trajs)
        assert stats.weight_version == k + 1 and stats.grad_norm > 0
    assert weighted() > before + 0.5
    assert all(p.dtype == torch.float32 for p in model.parameters())
    state = learner.slots["policy"].optimizer.state
    assert state and all(v["exp_avg"].dtype == torch.float32 for v in state.values())


def test_autocast_choices(monkeypatch, tmp_path):
    model = tiny_causal_lm(seed=0)
    assert dtype_choice.resolve_autocast("none", model) is None
    assert dtype_choice.resolve_autocast("bfloat16", model) is torch.bfloat16
    with pytest.raises(ValueError, match="learner.autocast"):
        dtype_choice.resolve_autocast("fp16", model)
    kept = {"dtype": "bfloat16"}
    monkeypatch.setattr(dtype_choice, "measured_choice", lambda m, cache_dir=None: kept)
    assert dtype_choice.resolve_autocast("auto", model) is torch.bfloat16
    kept["dtype"] = "float32"
    assert dtype_choice.resolve_autocast("auto", model) is None
    kept["dtype"] = "bfloat16"
    assert dtype_choice.resolve_autocast("auto", tiny_causal_lm(seed=0).to(torch.bfloat16)) \
        is None  # bfloat16 weights: nothing to gain
    monkeypatch.undo()
    entry = dtype_choice.measured_choice(model, tmp_path)  # the real timing, kept
    assert entry["dtype"] in ("bfloat16", "float32") and entry["float32_ms"] > 0
