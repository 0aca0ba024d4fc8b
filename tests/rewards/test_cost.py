import pytest

from compassplay.rewards.cost import LinearCost
from compassplay.rewards.gradient import GradientScorer

from .conftest import rand_example, tiny_model


def test_cost_model_prefers_ghost_for_short_and_materialize_for_long():
    short, long = LinearCost(16, 8, 576, 1536), LinearCost(16, 320, 576, 1536)
    assert short.choose() == "ghost" and long.choose() == "materialize"
    assert long.choose("ghost") == "ghost" and short.choose("materialize") == "materialize"
    # SmolLM2's head (49k vocabulary) at 257 tokens: ghost has more flops, but a materialized
    # G is 113 MB per sample of memory traffic (measured: ghost 0.57 s, materialize 0.98 s)
    head = LinearCost(4, 257, 576, 49152)
    assert head.choose() == "ghost"
    assert head.materialize_flops == 4 * (2 * 257 * 576 * 49152 + 4 * 576 * 49152)
    rep = head.report("ghost")
    assert rep["path"] == "ghost" and rep["d_out"] == 49152
    assert rep["ghost_gflop"] > rep["materialize_gflop"] > 0
    assert rep["ghost_mb"] < rep["materialize_mb"] / 8
    # its MLP and attention matrices at the same length stay materialized (G fits in cache)
    for d_in, d_out in [(576, 1536), (1536, 576), (576, 576), (576, 192)]:
        assert LinearCost(4, 320, d_in, d_out).choose() == "materialize"


def test_scorer_reports_decisions_and_profile(gen):
    model = tiny_model("llama", True)
    scorer = GradientScorer(model)
    scorer.set_reference([rand_example(gen, 3, 5)])
    cands = [rand_example(gen, 2, 6), rand_example(gen, 4, 3)]
    scorer.score(cands)
    report = scorer.cost_report()
    assert report["lm_head"]["path"] in scorer.layer_paths["lm_head"]
    assert report["model.layers.0.mlp.up_proj"]["t"] == 8
    prof = scorer.profile(cands)
    s = prof["summary"]
    assert s["total_s"] >= s["forward_s"] > 0 and s["hooks_s"] > 0
    assert {"lm_head", "q_proj", "embed_tokens", "input_layernorm"} <= set(prof["hooks_by_kind"])
    assert prof["hooks_by_kind"]["lm_head"]["gflop"] >= 0
    assert scorer.engine.ctx.timings is None  # profiling is off again
    assert scorer.score(cands) == scorer.score(cands)


@pytest.mark.parametrize("path", ["ghost", "materialize"])
def test_forced_path_is_recorded(path, gen):
    scorer = GradientScorer(tiny_model("qwen2", False), path=path)
    scorer.set_reference([rand_example(gen, 2, 3)])
    scorer.score([rand_example(gen, 2, 4)])
    assert {d["path"] for d in scorer.cost_report().values()} == {path}
