import argparse
import json

import pytest

from compassplay.bench import scorer as bench


@pytest.mark.slow
def test_bench_scorer_runs_and_reports(capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--n-candidates", "4", "--seq-len", "24", "--hidden", "32",
                              "--layers", "2", "--vocab", "97", "--reps", "1", "--n-ref", "2",
                              "--proj-dims", "64", "--last-k", "1"])
    out = bench.run(args)
    for key in ("n_candidates", "seq_len", "params", "naive_s", "batched_s", "floor_s", "ratio",
                "floor_ratio", "max_abs_cos_err", "peak_mem_batched_mb", "peak_mem_floor_mb",
                "layer_paths", "subspaces"):
        assert key in out, key
    assert out["n_candidates"] == 4 and out["max_abs_cos_err"] <= 1e-4
    assert out["ratio"] > 0 and out["floor_ratio"] > 0
    assert {r["subspace"] for r in out["subspaces"]} == {"last_1_blocks", "projection_64"}
    assert all(-1.0 <= r["spearman_vs_full"] <= 1.0 for r in out["subspaces"])
    json.dumps(out)
    bench.main(["--n-candidates", "2", "--seq-len", "8", "--hidden", "32", "--layers", "1",
                "--vocab", "50", "--reps", "1", "--n-ref", "1", "--no-subspaces", "--json"])
    line = capsys.readouterr().out.strip()
    assert json.loads(line)["n_candidates"] == 2


def test_spearman():
    assert abs(bench.spearman([1, 2, 3], [10, 20, 30]) - 1.0) < 1e-12
    assert abs(bench.spearman([1, 2, 3], [3, 2, 1]) + 1.0) < 1e-12
    assert abs(bench.spearman([1, 1, 2], [1, 1, 2]) - 1.0) < 1e-12
    assert abs(bench.spearman([1, 2, 3, 4], [1, 3, 2, 4]) - 0.8) < 1e-12


@pytest.mark.slow
def test_bench_real_shape_truncated():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--shape", "smollm2-135m", "--layers", "1", "--candidates", "2",
                              "--prompt-tokens", "3", "--target-tokens", "5", "--reps", "1",
                              "--n-ref", "1", "--profile", "--no-subspaces", "--memory",
                              "profiler"])
    out = bench.run(args)
    assert out["shape"] == "smollm2-135m" and out["layers"] == 1 and out["n_candidates"] == 2
    assert out["tokens_per_candidate"] == [8, 8] and out["max_abs_cos_err"] <= 1e-4
    assert out["cost_model"]["lm_head"]["d_out"] == 49152
    assert "sparse-rows" in out["layer_paths"] and out["mem_ratio"] > 0
    assert "lm_head" in out["profile"]["hooks_by_kind"]
    json.dumps(out)


def test_bench_scorer_with_several_solutions_per_candidate():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--n-candidates", "3", "--seq-len", "16", "--hidden", "32",
                              "--layers", "1", "--vocab", "50", "--reps", "1", "--n-ref", "1",
                              "--solutions", "3", "--no-subspaces", "--memory", "none"])
    out = bench.run(args)
    assert out["solutions_per_candidate"] == 3 and out["rows"] == 9
    assert out["max_abs_cos_err"] <= 1e-4  # batched vs the naive loop, both on the mean loss
