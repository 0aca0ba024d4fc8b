"""Atomic, pruned run checkpoints.

Layout of ``run_dir/checkpoints/step_{step:06d}/``::

    model/          the policy (the solver's model when the roles have separate models) as a
                    complete HF folder: config.json, generation_config.json, model.safetensors
                    (full weights; DeepSpeed gathers them from every rank) and the tokenizer
                    files, so `AutoModelForCausalLM.from_pretrained`, `AutoTokenizer.
                    from_pretrained`, `vllm.LLM` and `compassplay eval --model` load it as it is
    proposer_model/ the proposer's model, the same way (only with learner.shared_model=false)
    learner/        Learner.save: the optimizer and scheduler state (the proposer's under
                    learner/proposer/), DeepSpeed's optimizer.safetensors/.json, learner.json
                    (weight version); the weights are the ones in model/ (one copy on disk)
    state.json      the caller's JSON-able run state (task buffers, step, metrics.jsonl lines)
    rng.json        python `random` and numpy global RNG states
    torch_rng.bin   torch CPU RNG state (raw bytes); cuda_rng.bin per device when CUDA is used
    COMPLETE        manifest: step, the run's id (`run.json`, see `rundir.claim`), sha256 and
                    size of every other file. Written last.

A checkpoint is written into a hidden temp dir, fsynced, then renamed into place, so a crash
leaves either no `step_*` dir or a complete one; `latest_checkpoint` also ignores any dir
without a readable COMPLETE manifest, and any whose run id is not the run directory's (a
checkpoint never loads into another run). No pickle: everything loads without executing code
(torch files with ``weights_only=True``).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from compassplay.engines.training.model_dirs import PROPOSER_MODEL
from compassplay.fileio import fsync_path, sha256_file
from compassplay.rundir.claim import read_run_id

log = logging.getLogger(__name__)

MANIFEST = "COMPLETE"
_PREFIX = "step_"


def rng_state() -> tuple[dict[str, Any], dict[str, bytes]]:
    """(JSON-able python/numpy states, raw torch states by file name)."""
    version, internal, gauss = random.getstate()
    js: dict[str, Any] = {"python": [version, list(internal), gauss]}
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        js["numpy"] = [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    except ImportError:
        pass
    raw = {"torch_rng.bin": torch.get_rng_state().numpy().tobytes()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            raw[f"cuda_rng_{i}.bin"] = s.numpy().tobytes()
    return js, raw


def set_rng_state(js: dict[str, Any], raw: dict[str, bytes]) -> None:
    """Inverse of `rng_state`."""
    version, internal, gauss = js["python"]
    random.setstate((version, tuple(internal), gauss))
    if "numpy" in js:
        import numpy as np

        kind, keys, pos, has_gauss, cached = js["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.frombuffer(bytearray(raw["torch_rng.bin"]), dtype=torch.uint8))
    cuda = sorted(k for k in raw if k.startswith("cuda_rng_"))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(
            [torch.frombuffer(bytearray(raw[k]), dtype=torch.uint8) for k in cuda])


MODEL_DIR = "model"


def save_checkpoint(run_dir: str | Path, step: int, learner: Any, state: dict[str, Any],
                    keep_last: int = 2, tokenizer: Any = None) -> Path:
    """Write checkpoint `step` atomically, then keep only the newest `keep_last`. Returns its path.

    `learner` needs `save(dir, model_dir)`; `state` must be JSON-serializable; `tokenizer`
    (the run's) is saved into every model folder.
    """
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{step:06d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    learner.save(tmp / "learner", tmp / MODEL_DIR)
    if tokenizer is not None:
        for d in model_folders(tmp):
            tokenizer.save_pretrained(str(d))
    (tmp / "state.json").write_text(json.dumps(state, indent=1, sort_keys=True))
    js, raw = rng_state()
    (tmp / "rng.json").write_text(json.dumps(js))
    for name, data in raw.items():
        (tmp / name).write_bytes(data)
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    manifest = {"step": step, "run_id": read_run_id(run_dir), "files": {str(p.relative_to(tmp)): {
        "sha256": sha256_file(p), "bytes": p.stat().st_size} for p in files}}
    for p in files:
        fsync_path(p)
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    fsync_path(tmp / MANIFEST)
    for d in [tmp, *(p for p in tmp.rglob("*") if p.is_dir())]:
        fsync_path(d)
    if final.exists():  # re-saving a step: move the old one aside first
        old = root / f".old-{final.name}-{os.getpid()}"
        os.replace(final, old)
        shutil.rmtree(old)
    os.replace(tmp, final)
    fsync_path(root)
    prune_checkpoints(run_dir, keep_last)
    return final


def model_folders(path: str | Path) -> list[Path]:
    """The HF model folders of checkpoint `path`: model/ and, when separate, proposer_model/."""
    return [d for d in (Path(path) / MODEL_DIR, Path(path) / PROPOSER_MODEL) if d.is_dir()]


def _manifest(path: Path) -> dict[str, Any] | None:
    try:
        m = json.loads((path / MANIFEST).read_text())
        return m if isinstance(m, dict) and "files" in m else None
    except (OSError, ValueError):
        return None


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints (with a readable manifest) of this run, oldest first: one written
    by a run of another id (`run.json`) is ignored with a warning."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    run_id = read_run_id(run_dir)
    found = []
    for p in root.iterdir():
        if not (p.is_dir() and p.name.startswith(_PREFIX) and p.name[len(_PREFIX):].isdigit()):
            continue
        m = _manifest(p)
        if m is None:
            continue
        if run_id is not None and m.get("run_id") not in (None, run_id):
            log.warning("%s belongs to another run (run id %s, this run %s): ignored",
                        p, m.get("run_id"), run_id)
            continue
        found.append((int(p.name[len(_PREFIX):]), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1] if ckpts else None


def prune_checkpoints(run_dir: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` complete checkpoints of this run, and stale
    temp/incomplete dirs older than the newest complete one. Returns what was removed."""
    root = Path(run_dir) / "checkpoints"
    ckpts = list_checkpoints(run_dir)
    doomed = ckpts[:-keep_last] if keep_last > 0 else ckpts
    if ckpts:
        newest = ckpts[-1].stat().st_mtime
        doomed += [p for p in root.iterdir() if p.is_dir() and p not in ckpts
                   and (p.name.startswith((".tmp-", ".old-", _PREFIX)))
                   and _manifest(p) is None  # another run's complete checkpoint stays
                   and p.stat().st_mtime < newest]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def verify_checkpoint(path: str | Path) -> None:
    """Raise ValueError if any file listed in the manifest is missing or changed."""
    path = Path(path)
    m = _manifest(path)
    if m is None:
        raise ValueError(f"{path}: no valid {MANIFEST} manifest (incomplete checkpoint)")
    for rel, info in m["files"].items():
        f = path / rel
        if not f.is_file() or f.stat().st_size != info["bytes"] or sha256_file(f) != info["sha256"]:
            raise ValueError(f"{path}: {rel} is missing or does not match the manifest")


def load_checkpoint(path: str | Path, learner: Any, verify: bool = True) -> dict[str, Any]:
    """Restore `learner` (weights, optimizer, scheduler, version) and the global RNG states from
    checkpoint `path`; returns the saved run state."""
    path = Path(path)
    if verify:
        verify_checkpoint(path)
    # checkpoints written before model/ existed hold the weights in learner/
    learner.load(path / "learner", path / MODEL_DIR if (path / MODEL_DIR).is_dir() else None)
    raw = {p.name: p.read_bytes() for p in path.glob("*.bin")}
    set_rng_state(json.loads((path / "rng.json").read_text()), raw)
    return json.loads((path / "state.json").read_text())
