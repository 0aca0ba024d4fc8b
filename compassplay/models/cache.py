"""A model cache entry built once, safely under concurrency: lock, private temp dir, manifest.

`prepare_cached(cache_dir, name, build)` returns `cache_dir/name`, building it with
`build(tmp_dir)` only if no complete entry exists. Many processes (the proposer, solver, scorer
and learner actors of one run, or several runs) may call it at once:

- one inter-process lock per entry (`fcntl.flock` on `name.lock`): one process builds, the
  others wait (with a log line saying what they wait for) and then load the finished entry;
- each builder writes into its own `name.tmp-<pid>-<random>` directory, writes the manifest
  `COMPLETE.json` (size and sha256 of every file) last, and renames the directory into place;
- a temp dir left by a crashed builder is removed by the next lock holder (the lock proves its
  writer is gone); an entry without a manifest, or whose files do not match it (partial copy,
  truncated file, bit rot), is rebuilt, never loaded.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from compassplay.errors import RunError
from compassplay.fileio import fsync_path, sha256_file

log = logging.getLogger(__name__)

MANIFEST = "COMPLETE.json"


class CacheError(RunError):
    """A cache entry could not be prepared; the message names the path and the cause."""


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(root: Path) -> None:
    """Record size and sha256 of every file under `root`, then fsync (written last)."""
    entries = {str(p.relative_to(root)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
               for p in _files(root)}
    path = root / MANIFEST
    with path.open("w") as f:
        json.dump({"files": entries}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def entry_problem(root: Path) -> str | None:
    """None if `root` is a complete entry; otherwise what is wrong with it (for the log)."""
    if not root.is_dir():
        return "missing"
    try:
        files = json.loads((root / MANIFEST).read_text())["files"]
    except FileNotFoundError:
        return f"no {MANIFEST} (partial or pre-manifest entry)"
    except (ValueError, KeyError, TypeError):
        return f"unreadable {MANIFEST}"
    if not files:
        return "empty manifest"
    for rel, want in files.items():
        p = root / rel
        if not p.is_file():
            return f"missing file {rel}"
        if p.stat().st_size != want["bytes"]:
            return f"{rel} has {p.stat().st_size} bytes, manifest says {want['bytes']}"
        if sha256_file(p) != want["sha256"]:
            return f"{rel} does not match its sha256"
    return None


@contextmanager
def entry_lock(cache_dir: Path, name: str, timeout_s: float,
               log_every_s: float = 10.0) -> Iterator[None]:
    """Hold the inter-process lock of entry `name`; log while waiting, fail after `timeout_s`."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    lock_path = cache_dir / f"{name}.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        start = last_log = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                now = time.monotonic()
                if now - start > timeout_s:
                    raise CacheError(
                        f"waited {timeout_s:.0f} s for the lock {lock_path} held by another "
                        f"process preparing {cache_dir / name}; if no such process runs, "
                        "the lock is stale on a network filesystem: delete it") from None
                if now - last_log >= log_every_s:
                    log.info("waiting for another process to finish preparing %s (lock %s, "
                             "%.0f s so far)", cache_dir / name, lock_path, now - start)
                    last_log = now
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def _remove_stale(cache_dir: Path, name: str) -> None:
    """Temp and trash dirs of `name`: the lock holder knows their writers are gone."""
    for p in cache_dir.glob(f"{name}.tmp-*"):
        log.warning("removing %s left by an interrupted preparation", p)
        shutil.rmtree(p, ignore_errors=True)
    for p in cache_dir.glob(f"{name}.trash-*"):
        shutil.rmtree(p, ignore_errors=True)


def prepare_cached(cache_dir: Path, name: str, build: Callable[[Path], None],
                   what: str = "", timeout_s: float = 1800.0) -> Path:
    """`cache_dir/name`, built by `build(empty_dir)` once; safe under concurrent callers."""
    out = cache_dir / name
    if entry_problem(out) is None:
        return out
    with entry_lock(cache_dir, name, timeout_s):
        problem = entry_problem(out)
        if problem is None:  # another process built it while we waited
            return out
        _remove_stale(cache_dir, name)
        if problem != "missing":
            log.warning("cache entry %s is incomplete (%s): rebuilding it", out, problem)
        log.info("preparing %s in %s (once)", what or name, out)
        tmp = cache_dir / f"{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            build(tmp)
            write_manifest(tmp)
            if out.exists():
                trash = cache_dir / f"{name}.trash-{uuid.uuid4().hex[:8]}"
                out.rename(trash)
                shutil.rmtree(trash, ignore_errors=True)
            tmp.rename(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_path(cache_dir)
    return out
