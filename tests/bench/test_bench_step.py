"""`bench step` on the micro run: every stage's work recorded and set against its bound."""

from __future__ import annotations

import argparse

import pytest

from compassplay.bench import roofline, step


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    step.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.slow
def test_bench_step_micro_reports_each_stage_against_its_bound():
    out = step.run(_args("--config", "micro_warm", "--steps", "1", "--baseline"))
    assert out["steps"] == 1 and out["baseline_run"]["steps"] == 1
    assert all(out["work"][k] > 0 for k in ("generate", "learn", "score"))
    for k in ("generate", "learn", "score"):
        assert out["bound_s"][k] > 0 and 0 < out["fraction_of_bound"][k]
    assert out["stage_seconds"]["propose"] > 0 and out["speedup"]["step"] > 0
    # the same seed gives the same tasks whichever decoder runs
    assert out["valid"] == out["baseline_run"]["valid"]
    assert out["decode_dtypes"] == ["float32"] and "generate_bf16" not in out["bound_s"]
    assert out["learn_dtypes"] == ["model"] and "learn_bf16" not in out["bound_s"]
    # the bounds are measured at the threads the stages ran with
    assert out["threads"]["bounds"] == max(out["threads"]["stages"])


@pytest.mark.slow
def test_bench_step_sets_bfloat16_generation_and_learning_against_their_own_bounds():
    out = step.run(_args("--config", "micro_warm", "--steps", "1",
                         "proposer.decode_dtype=bfloat16", "solver.decode_dtype=bfloat16",
                         "learner.autocast=bfloat16"))
    assert out["decode_dtypes"] == ["bfloat16"] and out["learn_dtypes"] == ["bfloat16"]
    assert 0 < out["bound_s"]["generate_bf16"]
    assert out["fraction_of_bound"]["generate_bf16"] == pytest.approx(
        out["bound_s"]["generate_bf16"] / (out["stage_seconds"]["propose"]
                                           + out["stage_seconds"]["solve"]))
    # the bfloat16 bound is the shorter one where this CPU's bfloat16 matmuls are the faster
    # (AVX512-BF16, AMX); on an AVX2-only CPU bfloat16 is emulated and its bound the longer
    faster16 = out["matmul_bf16_gflop_per_s"] > out["matmul_gflop_per_s"]
    assert out["bound_s"]["learn_bf16"] > 0
    assert (out["bound_s"]["learn_bf16"] < out["bound_s"]["learn"]) == faster16
    assert out["fraction_of_bound"]["learn_bf16"] == pytest.approx(
        out["bound_s"]["learn_bf16"] / out["stage_seconds"]["learn"])


def test_torch_threads_sets_the_count_inside_and_restores_it():
    import torch

    before = torch.get_num_threads()
    other = 1 if before > 1 else 2
    with roofline.torch_threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), roofline.torch_threads(other):
        raise RuntimeError("restored on error too")
    assert torch.get_num_threads() == before


def test_settled_keeps_the_best_of_its_rounds():
    values = iter([3.0, 1.0, 2.0])
    assert roofline.settled(lambda: next(values), min, rounds=3, pause_s=0.0) == 1.0
    values = iter([3.0, 5.0, 2.0])
    assert roofline.settled(lambda: next(values), max, rounds=3, pause_s=0.0) == 5.0


def test_in_dtype_copies_only_when_the_dtype_differs():
    import torch

    model = torch.nn.Linear(4, 3)
    assert roofline.in_dtype(model, torch.float32) is model
    copy16 = roofline.in_dtype(model, torch.bfloat16)
    assert copy16 is not model and copy16.weight.dtype == torch.bfloat16
    assert model.weight.dtype == torch.float32


def _toy_ledger() -> step.Ledger:
    """An empty ledger of a 4-layer toy shape (400 block parameters, vocabulary 10)."""
    ledger = step.Ledger()
    ledger.shape = roofline.ModelShape(layers=4, hidden=8, heads=2, head_dim=4,
                                       block_params=400, vocab=10, weight_bytes=0)
    return ledger


def test_backward_bound_counts_only_the_crossed_blocks():
    ledger = _toy_ledger()
    ledger.calls["learn"] = [{"rows": 1, "width": 2, "head_rows": 1, "loss_rows": 1,
                              "crossed": 0}]
    frozen = step.stage_bounds(ledger, 1e-3, 1.0, 0)["learn"]
    ledger.calls["learn"][0]["crossed"] = 4
    full = step.stage_bounds(ledger, 1e-3, 1.0, 0)["learn"]
    # forward 2*400*2 + attention 4*4*2*4*3 + head 2*10*8; backward twice the blocks
    assert frozen == pytest.approx(1600 + 384 + 160 + 160)
    assert full - frozen == pytest.approx(2 * (1600 + 384))
    # an autocast learner's float32 head (160 forward + 160 backward FLOPs) at its own rate
    split = step.stage_bounds(ledger, 1e-3, 1.0, 0, head_rate=0.5)["learn"]
    assert split == pytest.approx(full + 320)


def test_a_shared_prefix_is_counted_once():
    ledger = _toy_ledger()
    ledger.calls["learn"] = [{"rows": 3, "width": 5, "head_rows": 2, "loss_rows": 2,
                              "crossed": 0, "shared": 0}]
    plain = step.stage_bounds(ledger, 1e-3, 1.0, 0)["learn"]
    ledger.calls["learn"][0]["shared"] = 3
    shared = step.stage_bounds(ledger, 1e-3, 1.0, 0)["learn"]
    # positions 3 x 5 = 15 -> 3 + 3 x 2 = 9; query-key pairs 3 x 15 = 45 -> 6 + 3 x (6 + 3) = 33
    assert plain - shared == pytest.approx(2 * 400 * 6 + 4 * 4 * 2 * 4 * 12)


def test_autocast_score_passes_are_counted_at_their_own_rate():
    ledger = _toy_ledger()
    ledger.calls["score"] = [{"rows": 1, "width": 2, "head_rows": 1, "grad": False,
                              "autocast": True},
                             {"rows": 1, "width": 2, "head_rows": 1, "grad": False}]
    plain = step.stage_bounds(ledger, 1e-3, 1.0, 0)["score"]
    mixed = step.stage_bounds(ledger, 1e-3, 1.0, 0, autocast_rate=2.0)["score"]
    assert mixed == pytest.approx(plain * 3 / 4)  # one of two equal passes at twice the rate


def test_spec_layers():
    assert step.spec_layers("last:6", 30) == 6 and step.spec_layers("last:60", 30) == 30
    assert step.spec_layers("all", 30) == 30 and step.spec_layers(["*.mlp.*"], 4) == 4


def test_a_learner_pass_from_the_generators_states_counts_only_the_blocks_it_runs():
    ledger = step.Ledger()
    ledger.shape = roofline.ModelShape(layers=30, hidden=576, heads=9, head_dim=64,
                                       block_params=106_000_000, vocab=49152,
                                       weight_bytes=538_000_000)
    call = {"rows": 4, "width": 300, "shared": 0, "head_rows": 80, "crossed": 6}
    ledger.calls["learn"] = [call]
    full = step.stage_bounds(ledger, 0.02, 1e11, 6)["learn"]
    ledger.calls["learn"] = [{**call, "below": 24}]
    top = step.stage_bounds(ledger, 0.02, 1e11, 6)["learn"]
    s, tokens = ledger.shape, 4 * 300
    pairs = 4 * 300 * 301 / 2
    blocks = 2.0 * s.block_params * tokens + 4.0 * s.layers * s.heads * s.head_dim * pairs
    assert full - top == pytest.approx(blocks * 24 / 30 / 1e11)


def test_the_learner_wrapper_passes_the_states_through(monkeypatch):
    """`instrumented` records a pass from states at its real width and forwards them."""
    import torch

    from compassplay.engines.training import learner

    seen = {}
    monkeypatch.setattr(learner, "token_logprobs_entropy",
                        lambda *a, **kw: seen.setdefault("args", a) and (None, None))
    from tests.tiny_models import tiny_causal_lm

    ledger = step.Ledger()
    model = tiny_causal_lm(num_layers=2).train()
    ids = torch.zeros((2, 9), dtype=torch.long)
    states = torch.zeros((2, 8, 64))
    with step.instrumented(ledger, baseline=False):
        learner.token_logprobs_entropy(model, ids, torch.ones_like(ids), ids[:, 1:],
                                       torch.ones((2, 8)), None, False, states, 1)
    assert seen["args"][-2] is states and seen["args"][-1] == 1
    assert ledger.calls["learn"][0]["width"] == 8 and ledger.calls["learn"][0]["below"] == 1
