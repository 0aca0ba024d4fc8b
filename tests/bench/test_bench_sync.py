"""`compassplay bench sync`: both modes' trips through a real local Ray object store, on the
tiny model, with the bound beside them (the figures themselves are the bench's to report)."""

import json

import pytest

from compassplay.cli import main

pytestmark = pytest.mark.ray


def test_bench_sync_reports_both_modes_against_the_copy_bound(capsys):
    assert main(["bench", "sync", "--model", "micro", "--reps", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # the tiny model ties its embeddings: the packed buffer holds them once
    assert 0 < out["packed_bytes"] < out["state_dict_bytes"]
    assert out["copy_gb_per_s"] > 0
    assert out["bound_s"] == pytest.approx(2 * out["packed_bytes"] / (out["copy_gb_per_s"] * 1e9),
                                           rel=2e-3)
    for mode in ("plain", "packed"):
        row = out[mode]
        assert min(row["snapshot_s"], row["fetch_s"], row["load_s"]) > 0
        assert row["total_s"] == pytest.approx(
            row["snapshot_s"] + row["fetch_s"] + row["load_s"], rel=2e-3)
        assert row["of_bound"] == pytest.approx(out["bound_s"] / row["total_s"], rel=2e-3)
    assert out["packed_speedup"] == pytest.approx(
        out["plain"]["total_s"] / out["packed"]["total_s"], rel=2e-3)
