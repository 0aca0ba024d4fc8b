"""deploy/gpu_sync_check.py, the prepared GPU device check: importable and --help-able without
CUDA, its argument parsing and JSON writer, and its CPU-capable sections (the bucketed
broadcast over gloo between two processes, a learner step at a toy shape) run on CPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "gpu_sync_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_sync_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_needs_no_gpu():
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "--device" in done.stdout and "$OUT" in done.stdout


def test_arguments_and_the_json_writer(tmp_path, monkeypatch):
    mod = _module()
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    args = mod.parse_args(["--only", "buckets, learner", "--device", "cpu"])
    assert args.sections == ["buckets", "learner"] and args.out == str(tmp_path / "out")
    with pytest.raises(SystemExit):
        mod.parse_args(["--only", "ipc,nvlink"])
    path = mod.write_result(tmp_path / "deep" / "er", {"ok": True, "sections": {"a": 1}})
    assert json.loads(path.read_text()) == {"ok": True, "sections": {"a": 1}}
    assert path.name == "gpu_sync_check.json" and not list(path.parent.glob("*.tmp"))


def test_the_cpu_sections_run_and_write_their_results(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--only", "ipc,buckets,learner",
         "--shape", "toy", "--tokens", "32", "--bucket-mb", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_sync_check.json").read_text())
    s = result["sections"]
    assert result["ok"] and s["ipc"] == {"ok": None, "skipped": "needs CUDA"}
    assert s["buckets"]["ok"] and s["buckets"]["checksums_equal"]
    assert s["buckets"]["largest_tensor_mib"] == 4 * s["buckets"]["bucket_mib"]  # > a bucket
    assert s["learner"]["ok"] and s["learner"]["live_shares_storage"]
    assert s["learner"]["trainable_params"] < s["learner"]["params"]
