"""Mode selection, the rootless error message, and the cgroup v2 memory limit (fake tree)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from compassplay.verifiers.sandbox import isolation
from compassplay.verifiers.sandbox.cgroup import CgroupMemory
from compassplay.verifiers.sandbox.pool import PythonSandbox


def test_auto_mode_is_root_mode_only_for_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation.os, "geteuid", lambda: 0)
    assert isolation.resolve("bwrap") == isolation.ROOT
    monkeypatch.setattr(isolation.os, "geteuid", lambda: 1000)
    assert isolation.resolve("bwrap") == isolation.ROOTLESS
    assert isolation.resolve(isolation.UNSAFE_OPT_OUT) == isolation.UNSAFE_OPT_OUT
    with pytest.raises(ValueError):
        isolation.resolve("none")


def test_root_mode_refused_for_ordinary_users(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(isolation.shutil, "which", lambda name: "/usr/bin/bwrap")
    with pytest.raises(isolation.SandboxUnavailableError, match="must run as root"):
        isolation.preflight(isolation.ROOT)


@pytest.mark.parametrize("sysctl,value,expect", [
    ("kernel.apparmor_restrict_unprivileged_userns", "1", "apparmor_parser"),
    ("kernel.unprivileged_userns_clone", "0", "kernel.unprivileged_userns_clone=1"),
    ("user.max_user_namespaces", "0", "user.max_user_namespaces=15000"),
    ("none", "", "no known sysctl"),
])
def test_rootless_failure_names_cause_fix_and_opt_out(monkeypatch: pytest.MonkeyPatch,
                                                      sysctl: str, value: str,
                                                      expect: str) -> None:
    monkeypatch.setattr(isolation.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(isolation.shutil, "which", lambda name: "/usr/bin/bwrap")
    monkeypatch.setattr(isolation, "_sysctl", lambda name: value if name == sysctl else None)
    failed = subprocess.CompletedProcess([], 1, b"", b"bwrap: setting up uid map: Permission denied")
    monkeypatch.setattr(isolation.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(isolation.SandboxUnavailableError) as info:
        PythonSandbox(workers=1, isolation="bwrap").start()
    msg = str(info.value)
    assert expect in msg and "uid map: Permission denied" in msg
    assert isolation.UNSAFE_OPT_OUT in msg and "run as root" in msg


def _fake_cgroup(tmp_path: Path, controllers: str) -> Path:
    (tmp_path / "cgroup.controllers").write_text(controllers + "\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    return tmp_path


def test_cgroup_memory_limit_per_worker(tmp_path: Path) -> None:
    cg = CgroupMemory(str(_fake_cgroup(tmp_path, "cpu memory pids")))
    assert cg.available and cg.describe().startswith("on")
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory"
    path = cg.create(300 << 20)
    assert path is not None and Path(path, "memory.max").read_text() == str(300 << 20)
    assert cg.oom_kills(path) == 0
    Path(path, "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    assert cg.oom_kills(path) == 1
    for f in Path(path).iterdir():
        f.unlink()
    cg.remove(path)
    assert not Path(path).exists()


def test_cgroup_unavailable_is_reported(tmp_path: Path) -> None:
    cg = CgroupMemory(str(_fake_cgroup(tmp_path, "cpu hugetlb")))
    assert not cg.available and cg.create(1 << 20) is None
    assert "memory controller" in cg.describe() and cg.describe().startswith("off")
    here = CgroupMemory()  # this machine: either delegated or a reason
    assert here.available or here.reason


def test_pool_reports_isolation_and_cgroup(sandbox: PythonSandbox) -> None:
    snap = sandbox.stats.snapshot()
    assert snap["isolation"] == sandbox.mode
    assert snap["cgroup_memory"].startswith(("on", "off: "))


def test_cgroup_moves_itself_into_a_leaf_when_the_parent_holds_processes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    from compassplay.verifiers.sandbox import cgroup as sandbox_cgroup

    parent = _fake_cgroup(tmp_path, "memory")
    moved: list[str] = []
    real_open = open

    def fake_open(path, mode="r", *a, **k):  # the kernel refuses +memory until we moved out
        if str(path).endswith("cgroup.subtree_control") and "w" in mode and not moved:
            raise OSError(errno.EBUSY, "Device or resource busy")
        if str(path).endswith("cgroup.procs") and "w" in mode:
            moved.append(str(path))
        return real_open(path, mode, *a, **k)

    monkeypatch.setattr(sandbox_cgroup, "open", fake_open, raising=False)
    cg = CgroupMemory(str(parent))
    assert cg.available, cg.reason
    assert moved == [str(parent / f"compassplay-host-{os.getpid()}" / "cgroup.procs")]
    assert (parent / "cgroup.subtree_control").read_text() == "+memory"
