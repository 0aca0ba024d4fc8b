"""Helpers shared by the sandbox tests (host-state snapshots, isolation gate)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compassplay.verifiers.isolation import ROOT, ROOTLESS, SandboxUnavailableError, preflight

HOST_SECRET = "COMPASSPLAY_TEST_HOST_SECRET"
MODES = {"root": ROOT, "rootless": ROOTLESS}


def require_isolation(mode: str = "bwrap") -> None:
    """Skip (or fail under CI=1) when this machine cannot provide the isolation. Root mode is
    skipped, never failed, when the tests do not run as root."""
    if mode == ROOT and os.geteuid() != 0:
        pytest.skip("root mode needs root")
    try:
        preflight(mode)
    except SandboxUnavailableError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"sandbox isolation unavailable: {exc}")


def _status_field(pid: int, key: str) -> str:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def leftovers(sandbox) -> list[int]:
    """Host pids inside the pool's sandboxes other than bwrap and the zygotes (pid 1 inside)."""
    out = []
    for root in sandbox.worker_pids():
        for pid in descendants(root):
            if _status_field(pid, "Name") == "bwrap" or _status_field(pid, "NSpid").split()[-1:] == ["1"]:
                continue
            out.append(pid)
    return out


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
