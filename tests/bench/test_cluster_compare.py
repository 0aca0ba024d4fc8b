"""`bench cluster`'s comparison of a run with its local twin: tasks lost and counted twice
from samples.jsonl, step rows that differ (timings and weight versions aside)."""

import json

from compassplay.bench.cluster import compare_runs, exit_code


def _write(run, steps, samples):
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))


def _step(i, valid=2, version=None, seconds=1.0):
    return {"step": i, "valid": valid, "weight_version": i + 1 if version is None else version,
            "step_seconds": seconds}


def test_an_equal_run_differs_in_nothing_but_timing_and_versions(tmp_path):
    tasks = [{"step": s, "task_id": f"s{s}-{k}"} for s in range(2) for k in range(3)]
    _write(tmp_path / "local", [_step(0), _step(1)], tasks)
    _write(tmp_path / "ray", [_step(0, seconds=9.0), _step(1, version=7)], tasks)
    cmp = compare_runs(tmp_path / "ray", tmp_path / "local")
    assert cmp == {"steps_completed": 2, "steps_expected": 2, "tasks_lost": 0,
                   "tasks_counted_twice": 0, "tasks": 6, "rows_differing": 0,
                   "first_differing_fields": []}


def test_lost_doubled_and_differing_are_each_counted(tmp_path):
    tasks = [{"step": s, "task_id": f"s{s}-{k}"} for s in range(2) for k in range(3)]
    _write(tmp_path / "local", [_step(0), _step(1)], tasks)
    ray_tasks = tasks[:2] + tasks[3:] + tasks[3:4]  # s0-2 lost, s1-0 twice
    _write(tmp_path / "ray", [_step(0), _step(1, valid=1)], ray_tasks)
    cmp = compare_runs(tmp_path / "ray", tmp_path / "local")
    assert (cmp["tasks_lost"], cmp["tasks_counted_twice"]) == (1, 1)
    assert cmp["rows_differing"] == 1 and cmp["first_differing_fields"] == ["valid"]
    (tmp_path / "short").mkdir()
    (tmp_path / "short/metrics.jsonl").write_text(json.dumps(_step(0)) + "\n")
    assert compare_runs(tmp_path / "short", tmp_path / "local")["steps_completed"] == 1
    assert exit_code({"ok": False}) == 1 and exit_code({"ok": True}) == 0
