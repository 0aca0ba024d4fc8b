"""A tiny benchmark for evaluation during training, and checks of a run dir's eval and cost
lines (shared by the local and the Ray executor tests)."""

from __future__ import annotations

import json
from pathlib import Path

from compassplay.eval.report import build_report
from compassplay.eval.report.data import load_run
from compassplay.rundir.runlog import read_metrics
from tests.eval.conftest import CRUX

ROLES = {"proposer", "solver", "verifier", "scorer", "learner"}


def write_cruxeval(data_dir: Path, copies: int = 1) -> Path:
    """cruxeval.jsonl with `copies` x the 3 items of the eval tests (more copies: slower)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    rows = [dict(r, id=f"{r['id']}-{k}") for k in range(copies) for r in CRUX]
    (data_dir / "cruxeval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data_dir


def check_run(run: Path, steps: int, items: int, out: Path) -> tuple[list[dict], list[dict]]:
    """Eval lines for every step with increasing versions and accuracies in [0, 1]; cost
    fields on every step line; `compassplay report` draws accuracy against compute."""
    rows = read_metrics(run / "metrics.jsonl")
    evals = read_metrics(run / "metrics.jsonl", "eval")
    assert [r["step"] for r in rows] == list(range(steps))
    assert [(e["step"], e["version"], e["benchmark"]) for e in evals] == [
        (s, s + 1, "cruxeval-o") for s in range(steps)]
    assert all(0.0 <= e["accuracy"] <= 1.0 and e["n"] == items for e in evals)
    for r in rows:
        assert set(r["device_seconds"]) == ROLES and all(v >= 0 for v in r["device_seconds"].values())
        assert set(r["device_kind"].values()) <= {"cpu", "gpu"}
        assert r["step_start"] <= min(r["stage_start"].values())
        assert r["step_end"] == max(r["stage_end"].values()) >= r["step_start"] > 1e9
        assert r["step_device_seconds"] == sum(r["device_seconds"].values()) > 0
    cumulative = [r["cumulative_device_seconds"] for r in rows]
    assert cumulative[0] == rows[0]["step_device_seconds"]
    assert all(a < b for a, b in zip(cumulative, cumulative[1:], strict=False))
    loaded = load_run(run)
    assert sorted(loaded.cost) == list(range(steps))
    assert [s for s, _ in loaded.evals["cruxeval-o"]] == list(range(steps))
    build_report([str(run)], out)
    assert (out / "accuracy_vs_compute.png").is_file()
    return rows, evals
