"""Per-worker cgroup v2 memory limits, used where the machine delegates the memory controller.

On top of RLIMIT_AS (per process) and the zygote's watchdog, each worker sandbox can live in its
own cgroup below the pool process's cgroup, with ``memory.max`` (and ``memory.swap.max = 0``),
so the kernel bounds a run's whole process tree and reports OOM kills in ``memory.events``.
When that is not possible, `reason` says why (it is logged and shown in the pool's stats).
"""

from __future__ import annotations

import errno
import itertools
import os
import threading

_counter = itertools.count()
_lock = threading.Lock()


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _cgroup2_mount(mountinfo: str) -> str | None:
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return left.split()[4]
    return None


class CgroupMemory:
    """Finds (or is given) the parent cgroup and creates one memory-limited child per worker."""

    def __init__(self, parent: str | None = None) -> None:
        self.parent: str | None = None
        self.reason = ""
        try:
            parent = parent or self._own_cgroup()
        except OSError as exc:
            self.reason = f"no cgroup v2 hierarchy ({exc})"
            return
        if parent is None:
            self.reason = "no cgroup v2 hierarchy mounted (cgroup v1 only)"
            return
        try:
            controllers = _read(os.path.join(parent, "cgroup.controllers")).split()
            if "memory" not in controllers:
                self.reason = (f"cgroup v2 at {parent} does not offer the memory controller "
                               f"(cgroup.controllers: {' '.join(controllers) or 'empty'})")
                return
            subtree = _read(os.path.join(parent, "cgroup.subtree_control")).split()
            if "memory" not in subtree:
                self._enable_memory(parent)
            if not os.access(parent, os.W_OK):
                raise PermissionError(f"{parent} is not writable")
        except OSError as exc:
            self.reason = f"cgroup v2 at {parent} is not delegated to this user ({exc})"
            return
        self.parent = parent

    @staticmethod
    def _enable_memory(parent: str) -> None:
        """Turn on the memory controller for `parent`'s children. A cgroup that holds processes
        cannot (cgroup v2's no-internal-processes rule): then this process first moves into a
        leaf of its own, as systemd does, and tries again."""
        control = os.path.join(parent, "cgroup.subtree_control")
        try:
            with open(control, "w") as f:
                f.write("+memory")
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
        leaf = os.path.join(parent, f"compassplay-host-{os.getpid()}")
        os.makedirs(leaf, exist_ok=True)
        with open(os.path.join(leaf, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        with open(control, "w") as f:
            f.write("+memory")

    @staticmethod
    def _own_cgroup() -> str | None:
        mount = _cgroup2_mount(_read("/proc/self/mountinfo"))
        if mount is None:
            return None
        for line in _read("/proc/self/cgroup").splitlines():
            if line.startswith("0::"):
                return os.path.join(mount, line[3:].lstrip("/"))
        return None

    @property
    def available(self) -> bool:
        return self.parent is not None

    def describe(self) -> str:
        return f"on (below {self.parent})" if self.parent else f"off: {self.reason}"

    def create(self, limit_bytes: int) -> str | None:
        """A fresh child cgroup limited to `limit_bytes`; None (and `reason` set) on failure."""
        if self.parent is None:
            return None
        with _lock:
            n = next(_counter)
        path = os.path.join(self.parent, f"compassplay-sandbox-{os.getpid()}-{n}")
        try:
            os.mkdir(path)
            with open(os.path.join(path, "memory.max"), "w") as f:
                f.write(str(limit_bytes))
            if os.path.exists(os.path.join(path, "memory.swap.max")):
                with open(os.path.join(path, "memory.swap.max"), "w") as f:
                    f.write("0")
        except OSError as exc:
            self.reason = f"could not create a cgroup below {self.parent} ({exc})"
            self.remove(path)
            return None
        return path

    @staticmethod
    def oom_kills(path: str | None) -> int:
        """The kernel's count of OOM kills in this cgroup (0 when unknown)."""
        if path is None:
            return 0
        try:
            for line in _read(os.path.join(path, "memory.events")).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    @staticmethod
    def remove(path: str | None) -> None:
        if path is not None:
            try:
                os.rmdir(path)
            except OSError:
                pass
