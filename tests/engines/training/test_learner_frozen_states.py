"""learner.frozen_states: the learner's forward from the generators' states entering its
lowest trained layer. The oracle is the plain forward of every layer: log-probs, entropies and
gradients equal it (float32, with and without a shared prefix), the learner's update equals
the one without states, and states that are wrong or missing fall back to the plain forward."""

from __future__ import annotations

import pytest
import torch

from compassplay.engines import make_learner
from compassplay.engines.frozen_states import states_key
from compassplay.engines.generation.base import SamplingParams
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.engines.training.logprobs import pack, token_logprobs_entropy
from compassplay.records import Generation, Trajectory
from compassplay.workers.builders import freeze_except
from tests.tiny_models import tiny_causal_lm

K = 2  # a 4-layer model training its top 2 layers (+ the final norm)


def _model(seed: int = 0) -> torch.nn.Module:
    model = tiny_causal_lm(seed=seed, num_layers=4)
    freeze_except(model, "last:2", "learner.trainable")
    return model


def _sampled(model, tokenizer, decode_dtype: str = "model"
             ) -> tuple[list[Generation], dict[str, torch.Tensor]]:
    """Two tasks' prompts (sharing 20 tokens), three samples each, and their states."""
    g = torch.Generator().manual_seed(5)
    head = torch.randint(0, 256, (20,), generator=g).tolist()
    prompts = [head + torch.randint(0, 256, (n,), generator=g).tolist() for n in (6, 11)]
    eng = HFGenerationEngine(model, tokenizer, capture_layer=K, decode_dtype=decode_dtype)
    gens = eng.generate([prompts[i % 2] for i in range(6)],
                        SamplingParams(max_new_tokens=9, temperature=1.0, seed=1))
    return gens, eng.take_states()


def _run(model, b, states=None, share=False):
    model.zero_grad(set_to_none=True)
    lp, ent = token_logprobs_entropy(model, b["input_ids"], b["attention_mask"], b["targets"],
                                     b["mask"], share_prefix=share, states=states,
                                     from_layer=K if states is not None else 0)
    (lp * torch.linspace(-1, 1, lp.shape[1])).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), ent, grads


@pytest.mark.parametrize("share", [False, True])
def test_log_probs_and_gradients_from_states_equal_the_full_forward(share, tokenizer):
    model = _model().train()
    gens, states = _sampled(model, tokenizer)
    b = pack(gens[:3], pad_token_id=259)
    width = b["input_ids"].shape[1] - 1
    start = torch.zeros((3, width, 64))
    for i, g in enumerate(gens[:3]):
        s = states[states_key(g.prompt_ids, g.completion_ids)]
        start[i, :len(s)] = s
    seen = []  # the positions layer 0 computes: none when starting from the states
    model.model.layers[0].register_forward_hook(lambda m, a, o: seen.append(a[0].shape))
    lp0, ent0, g0 = _run(model, b, share=share)
    assert seen
    seen.clear()
    lp1, ent1, g1 = _run(model, b, start, share=share)
    assert not seen
    mask = b["mask"].bool()
    torch.testing.assert_close(lp1[mask], lp0[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent1[mask], ent0[mask], rtol=1e-5, atol=1e-5)
    assert g1.keys() == g0.keys() and all(n.startswith(("model.layers.2", "model.layers.3",
                                                        "model.norm")) for n in g0)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-4, atol=1e-6, msg=n)
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == [0, 1, 2, 3]


def _trajectories(gens: list[Generation]) -> list[Trajectory]:
    return [Trajectory(generation=g, reward=float(i), role="solver", task_type="deduction")
            for i, g in enumerate(gens)]


def _update(learner_cfg, gens, states, **cfg) -> tuple[dict, object, torch.nn.Module]:
    """The gradient the learner's optimizer gets for `gens` with `states`, and its learner."""
    model = _model()
    learner = make_learner(learner_cfg.model_copy(update={"micro_batch": 3, **cfg}), model)
    slot, grads = learner.slots["policy"], {}
    step = slot.step

    def record():
        grads.update({n: p.grad.clone() for n, p in model.named_parameters()
                      if p.grad is not None})
        return step()

    slot.step = record
    learner.step(_trajectories(gens), states)
    return grads, learner.frozen["policy"], model


def test_the_learner_update_from_states_equals_the_full_forward(learner_cfg, tokenizer):
    gens, states = _sampled(_model(), tokenizer)
    plain, off, _ = _update(learner_cfg, gens, {}, frozen_states="recompute")
    assert off is None
    got, frozen, _ = _update(learner_cfg, gens, states)
    assert frozen.k == K and frozen.rows_from_states == 6 and frozen.rows_recomputed == 0
    assert frozen.checked_diff is not None and frozen.checked_diff < 1e-5
    assert got.keys() == plain.keys()
    for n in plain:
        torch.testing.assert_close(got[n], plain[n], rtol=1e-4, atol=1e-6, msg=n)
    # a micro-batch with a row whose states are missing runs the full forward
    part = dict(states)
    part.pop(states_key(gens[0].prompt_ids, gens[0].completion_ids))
    got, frozen, _ = _update(learner_cfg, gens, part)
    assert frozen.rows_recomputed == 3 and frozen.rows_from_states == 3
    for n in plain:
        torch.testing.assert_close(got[n], plain[n], rtol=1e-4, atol=1e-6, msg=n)


def test_states_that_differ_from_the_learners_own_turn_the_hand_over_off(learner_cfg, tokenizer,
                                                                         caplog):
    gens, states = _sampled(_model(seed=1), tokenizer)  # other frozen weights
    plain, _, _ = _update(learner_cfg, gens, {}, frozen_states="recompute")
    got, frozen, _ = _update(learner_cfg, gens, states)
    assert frozen.k == 0 and frozen.checked_diff > 1e-3 and frozen.rows_from_states == 0
    assert "runs every layer from now on" in caplog.text
    for n in plain:
        torch.testing.assert_close(got[n], plain[n], rtol=1e-4, atol=1e-6, msg=n)


def test_no_hand_over_where_every_layer_trains(learner_cfg):
    model = tiny_causal_lm(seed=0, num_layers=4)
    learner = make_learner(learner_cfg, model)
    assert not learner.frozen["policy"].enabled


def test_an_autocast_learner_takes_a_bfloat16_decoders_states(learner_cfg, tokenizer):
    """learner.autocast=bfloat16 with bfloat16 decoders (what "auto" picks on a CPU with
    bfloat16 dot products): the states are checked in autocast (3.9e-3 of their scale here)
    and taken, and the update is the full autocast forward's up to bfloat16 rounding (the
    gradient's cosine with it above 0.9999, its norm within 0.1%; measured 0.999986 and
    1.0003). States of other weights (1.8 of the scale away) still turn the hand-over off."""
    cfg = {"autocast": "bfloat16"}
    gens, states = _sampled(_model(), tokenizer, decode_dtype="bfloat16")
    plain, _, _ = _update(learner_cfg, gens, {}, frozen_states="recompute", **cfg)
    got, frozen, _ = _update(learner_cfg, gens, states, **cfg)
    assert frozen.autocast is torch.bfloat16 and frozen.k == K
    assert frozen.rows_from_states == 6 and frozen.rows_recomputed == 0
    assert frozen.checked_diff is not None and frozen.checked_diff < frozen.tolerance
    assert got.keys() == plain.keys()
    a = torch.cat([got[n].flatten() for n in plain])
    b = torch.cat([plain[n].flatten() for n in plain])
    assert float(torch.nn.functional.cosine_similarity(a, b, dim=0)) > 0.9999
    assert abs(float(a.norm() / b.norm()) - 1) < 1e-3
    gens, states = _sampled(_model(seed=1), tokenizer, decode_dtype="bfloat16")
    _, frozen, _ = _update(learner_cfg, gens, states, **cfg)
    assert frozen.k == 0 and frozen.checked_diff > 20 * frozen.tolerance
