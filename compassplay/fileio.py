"""File helpers for the durable writes of checkpoints and the model cache, and where that cache
lives."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory: so a rename inside it is durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def default_cache_dir() -> Path:
    """`$COMPASSPLAY_CACHE` or `$XDG_CACHE_HOME/compassplay` or `~/.cache/compassplay`."""
    if os.environ.get("COMPASSPLAY_CACHE"):
        return Path(os.environ["COMPASSPLAY_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "compassplay"
