"""Helpers shared by the sandbox tests (host-state snapshots, isolation gate)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compassplay.verifiers.isolation import SandboxUnavailableError, preflight

HOST_SECRET = "COMPASSPLAY_TEST_HOST_SECRET"


def require_isolation() -> None:
    """Skip (or fail under CI=1) when this machine cannot provide the isolation."""
    try:
        preflight("bwrap")
    except SandboxUnavailableError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"sandbox isolation unavailable: {exc}")


def processes_of(uids: list[int]) -> list[int]:
    """Host pids whose real uid is one of `uids`."""
    wanted, found = {str(u) for u in uids}, []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Uid:") and line.split()[1] in wanted:
                found.append(int(name))
    return found


def dir_state(path: Path) -> dict[str, bytes]:
    """Name -> content of every regular file directly under `path`."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


def descendants(pid: int) -> list[int]:
    """Host pids of all descendants of `pid`."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(k) for k in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            continue
        out += kids
        todo += kids
    return out


def rss_kb(pid: int) -> int:
    """Resident set size of a host process in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0
