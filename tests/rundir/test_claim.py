"""Runs never mix: a new run gets a directory of its own, resume reopens one, overwrite is asked
for, and a checkpoint of another run is never loaded (or pruned) by this one."""

import hashlib
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from compassplay.config import load_config
from compassplay.errors import RunError
from compassplay.rundir.checkpoint import latest_checkpoint, prune_checkpoints, save_checkpoint
from compassplay.rundir.claim import RUN_FILE, claim_run_dir, open_run_dir, read_run_id
from compassplay.rundir.runlog import METRICS_FILE, RunLog

ROOT = Path(__file__).resolve().parents[2]
MICRO = ROOT / "compassplay" / "configs" / "micro.yaml"


def test_a_new_run_never_takes_a_directory_that_holds_something(tmp_path):
    base = tmp_path / "runs" / "default"
    first = claim_run_dir(base)
    assert first == base and read_run_id(first)
    (first / METRICS_FILE).write_text('{"step": 0}\n')
    second = claim_run_dir(base)
    third = claim_run_dir(base)
    assert (second.name, third.name) == ("default-2", "default-3")
    assert len({read_run_id(p) for p in (first, second, third)}) == 3
    assert (first / METRICS_FILE).read_text() == '{"step": 0}\n'  # untouched
    stray = tmp_path / "runs" / "other"
    stray.mkdir()
    (stray / "notes.txt").write_text("mine")
    assert claim_run_dir(stray).name == "other-2"  # any content counts, not only runs
    empty = tmp_path / "runs" / "empty"
    empty.mkdir()
    assert claim_run_dir(empty) == empty  # an empty directory is free


def test_overwrite_replaces_only_when_asked(tmp_path):
    base = claim_run_dir(tmp_path / "r")
    (base / METRICS_FILE).write_text("old\n")
    old_id = read_run_id(base)
    again = claim_run_dir(tmp_path / "r", overwrite=True)
    assert again == base and not (base / METRICS_FILE).exists()
    assert read_run_id(base) != old_id


def test_concurrent_runs_claim_distinct_directories(tmp_path):
    got: list[Path] = []
    barrier = threading.Barrier(6)

    def claim():
        barrier.wait()
        got.append(claim_run_dir(tmp_path / "same"))

    threads = [threading.Thread(target=claim) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == 6 and len(set(got)) == 6


def test_resume_needs_a_run_directory(tmp_path):
    with pytest.raises(RunError, match="no such run directory"):
        open_run_dir(tmp_path / "missing")
    (tmp_path / "x").mkdir()
    with pytest.raises(RunError, match="no config.yaml"):
        open_run_dir(tmp_path / "x")
    (tmp_path / "x" / "config.yaml").write_text("run: {}\n")
    assert open_run_dir(tmp_path / "x") == tmp_path / "x"
    assert read_run_id(tmp_path / "x")  # an older run gets an id when it is resumed


def test_runlog_refuses_to_start_over_another_runs_metrics(tmp_path):
    cfg = load_config(MICRO)
    (tmp_path / METRICS_FILE).write_text('{"step": 0}\n')
    with pytest.raises(RunError, match="another run"):
        RunLog(tmp_path, cfg)
    assert (tmp_path / METRICS_FILE).read_text() == '{"step": 0}\n'
    RunLog(tmp_path, cfg, resume=True).close()  # resuming it is fine


class _Learner:
    def __init__(self, value: float) -> None:
        self.value = value

    def save(self, path: Path, model_dir: Path | None = None) -> None:
        path.mkdir(parents=True, exist_ok=True)
        torch.save({"w": torch.tensor([self.value])}, path / "w.pt")


def test_a_checkpoint_of_another_run_is_never_loaded_nor_pruned(tmp_path):
    a, b = claim_run_dir(tmp_path / "a"), claim_run_dir(tmp_path / "b")
    foreign = save_checkpoint(a, 9, _Learner(9.0), {"step": 9})
    own = save_checkpoint(b, 1, _Learner(1.0), {"step": 1})
    shutil.copytree(foreign, b / "checkpoints" / foreign.name)  # a newer step, another run
    assert latest_checkpoint(b) == own
    prune_checkpoints(b, keep_last=1)
    assert (b / "checkpoints" / foreign.name).is_dir()
    assert json.loads((own / "COMPLETE").read_text())["run_id"] == read_run_id(b)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compassplay.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def _digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file() and p.suffix != ".log"}


@pytest.mark.slow
def test_two_runs_in_a_row_keep_the_first_and_resume_continues_it(tmp_path):
    """What `make run` twice does (same name, same output dir), on the micro config."""
    args = ["run", "--config", str(MICRO), "--executor", "local", "pipeline.steps=1",
            "run.name=default", f"run.output_dir={tmp_path}", "logging.progress=false"]
    first = _cli(*args, cwd=ROOT)
    assert first.returncode == 0, first.stderr[-3000:]
    run1 = tmp_path / "default"
    before = _digest(run1)
    assert before[METRICS_FILE] and latest_checkpoint(run1) is not None
    second = _cli(*args, cwd=ROOT)
    assert second.returncode == 0, second.stderr[-3000:]
    run2 = tmp_path / "default-2"
    assert "writes to" in second.stderr and str(run2) in second.stdout
    assert _digest(run1) == before  # the first run's results, byte for byte
    assert "name: default-2" in (run2 / "config.yaml").read_text()
    assert read_run_id(run1) != read_run_id(run2)
    rows = [json.loads(x) for x in (run2 / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [0]
    both = _cli("run", "--resume", str(run1), "--overwrite", cwd=ROOT)
    assert both.returncode == 2 and "--overwrite" in both.stderr
    resumed = _cli("run", "--executor", "local", "--resume", str(run1), "pipeline.steps=2",
                   cwd=ROOT)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = [json.loads(x) for x in (run1 / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert not (tmp_path / "default-3").exists()
    replaced = _cli(*args, "--overwrite", cwd=ROOT)
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    rows = [json.loads(x) for x in (run1 / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [0] and RUN_FILE in _digest(run1)
