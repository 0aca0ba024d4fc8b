"""The sandbox zygote's start-up steps (stdlib only; loaded inside the sandbox by the
bootstrap under the bare name `sandbox_startup`, see `isolation.bootstrap_frames`):
`ZygoteStartup`, the base class of `zygote.Zygote` whose `__init__` runs them in order
(settings, the process's own locks, limits, what every program inherits, the programs'
interpreter state, the kernel sizes, bookkeeping, the scratch space, the frozen heap)."""

from __future__ import annotations

import _signal as signal  # the C module: `signal` would build its enums in every zygote
import gc
import io
import os
import resource
import select
import sys

try:  # inside the sandbox: preloaded by the bootstrap under their bare names
    import sandbox_child  # type: ignore[import-not-found]
    import sandbox_kernel  # type: ignore[import-not-found]
    import sandbox_scratch  # type: ignore[import-not-found]
except ImportError:  # imported on the host
    from compassplay.verifiers.sandbox import child as sandbox_child
    from compassplay.verifiers.sandbox import kernel as sandbox_kernel
    from compassplay.verifiers.sandbox import scratch as sandbox_scratch

ROOTS = ("/tmp", "/dev/shm")  # the sandbox's only writable places (scratch is /tmp/work)
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36


class ZygoteStartup:
    """The start-up steps of `zygote.Zygote` (its `__init__` sets `cfg` and `_libc`, the C
    library for prctl and malloc_trim, then calls them)."""

    cfg: dict

    def _read_settings(self, cfg: dict) -> tuple[str, ...]:
        """Isolation, the run's uid/gid, scratch path and limits (fsize in bytes) from `cfg`;
        returns the scratch roots."""
        self.isolated = bool(cfg["isolated"])
        self.setuid = bool(cfg.get("setuid", self.isolated))
        self.uid = int(cfg.get("uid", -1)) if self.setuid else os.getuid()
        self.gid = int(cfg.get("gid", -1)) if self.setuid else os.getgid()
        roots = ROOTS if self.isolated else (cfg["scratch_root"],)
        self.scratch = os.path.join(roots[0], "work")
        self.nproc = int(cfg.get("nproc", 32))
        self.fsize = int(cfg.get("fsize_mb", 16)) * 1024 * 1024
        self.nofile = int(cfg.get("nofile", 256))
        return tuple(roots)

    def _lock_process(self) -> None:
        """Isolated: pid 1 of its namespace, loopback down if asked, not dumpable; else the
        subreaper of its runs. No SIGINT handler either way."""
        if self.isolated:
            if os.getpid() != 1:
                raise SystemExit("isolated zygote must be pid 1 of its own pid namespace")
            if self.cfg.get("loopback_down"):
                sandbox_kernel.loopback_down(self._libc)
            # Same-uid programs (rootless mode) must not read or write our memory via /proc.
            self._libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        else:
            self._libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        # pid 1 only receives signals it has handlers for: keep none (Python installs SIGINT;
        # programs inherit SIG_DFL too, so SIGINT ends them like any fatal signal).
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    def _set_limits(self) -> None:
        """Limits that do not depend on the request bind the zygote too (harmless: its process
        count is tiny, and in root mode it is exempt) and are inherited by every run."""
        limits = [(resource.RLIMIT_FSIZE, self.fsize), (resource.RLIMIT_CORE, 0),
                  (resource.RLIMIT_NOFILE, self.nofile)]
        if self.isolated:  # unisolated, the count would include all the host user's processes
            limits.append((resource.RLIMIT_NPROC, self.nproc))
        for which, value in limits:
            resource.setrlimit(which, (value, value))

    def _set_inheritance(self) -> None:
        """What every fork inherits: the programs' environment, the seccomp filter (when
        configured), umask 077 and no supplementary groups (setuid mode)."""
        seed = os.environ.get("PYTHONHASHSEED", "0")  # the one this interpreter runs with
        os.environ.clear()  # the programs' environment (no LD_BIND_NOW), inherited by every fork
        os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": self.scratch,
                           "TMPDIR": self.scratch, "LANG": "C.UTF-8", "PYTHONHASHSEED": seed})
        if self.cfg.get("seccomp"):
            sandbox_seccomp = sys.modules["sandbox_seccomp"]  # preloaded by the bootstrap
            sandbox_seccomp.install(sandbox_seccomp.build_filter())  # inherited by every run
        os.umask(0o077)  # the programs' umask, inherited (the zygote only makes 0700 dirs)
        if self.setuid:
            os.setgroups([])  # no supplementary groups here, so none in any run

    def _prepare_programs(self) -> None:
        """The programs' stdio objects (built once on fds 0-2: /dev/null here, the run's pipes
        in the child), a warmed-up child path, their argv and __main__, and their uid."""
        stdio = (
            io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8"),
            io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                             errors="backslashreplace"),
            io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                             errors="backslashreplace", line_buffering=True),
        )
        sandbox_child.warm_up(stdio)  # before the freeze: ~15 fewer child page faults a run
        self.main = sandbox_child.prepare(stdio)  # the programs' stdio, argv and __main__
        self.child_uid = self.uid if self.setuid else None

    def _measure_kernel(self) -> None:
        """Sizes the supervisor measures runs against: this process's anonymous RSS (kB), a
        socket's buffer and a pipe's capacity (bytes)."""
        self.base_anon_kb = sandbox_kernel.status_number(os.getpid(), b"RssAnon:")
        self.socket_bytes = 2 * sandbox_kernel.read_int("/proc/sys/net/core/wmem_default",
                                                        212992)
        # the most one open fd can hold in a pipe (16 pages: the filter refuses F_SETPIPE_SZ)
        self.pipe_bytes = 16 * os.sysconf("SC_PAGE_SIZE")

    def _open_bookkeeping(self) -> None:
        """The poller, the 'alone' flag and (isolated) this pid namespace's ns_last_pid."""
        self._poller = select.poll()
        self._clean = True  # no process here but the zygote (see `_alone_with`)
        self._last_pid_fd = -1
        if self.isolated:  # this pid namespace's last handed-out pid
            try:
                self._last_pid_fd = os.open("/proc/sys/kernel/ns_last_pid",
                                            os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                pass

    def _prepare_scratch(self, roots: tuple[str, ...]) -> None:
        """The programs' scratch space under `roots`, fresh (SystemExit when it cannot be)."""
        self.state = sandbox_scratch.Scratch(
            roots, self.uid if self.setuid else None, self.gid, count_bytes=self.isolated,
            wipe_budget_s=float(self.cfg.get("wipe_budget_s", sandbox_scratch.WIPE_BUDGET_S)))
        if not self.state.fresh:
            raise SystemExit(f"cannot prepare the sandbox's scratch space under {roots}")

    def _freeze_heap(self) -> None:
        """Collect and freeze the heap (a child's collections never walk, and copy, the
        zygote's pages), then hand freed heap back (fewer resident pages per fork)."""
        gc.collect()
        gc.freeze()
        try:
            self._libc.malloc_trim(0)
        except AttributeError:  # not glibc
            pass
