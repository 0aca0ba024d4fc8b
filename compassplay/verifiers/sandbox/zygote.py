"""Zygote server that runs *inside* one sandbox (stdlib only; its source reaches it on stdin).

Protocol: `sandbox_proto` (binary length-prefixed frames on stdin/stdout, pipelined). The
forked child's side (lock-down, then the program) is `sandbox_child`, the per-run fresh state
`sandbox_scratch`, the zygote's start-up steps `sandbox_startup`; the bootstrap preloads them,
and `sandbox_seccomp`, under their bare names (see `isolation.bootstrap_frames`).

The zygote is pid 1 of the sandbox's pid namespace (so a program can signal it only where the
kernel drops the signal), non-dumpable, and already under the seccomp filter and the programs'
environment, so a run inherits them for free (and /dev is sealed before it starts:
`sandbox_dev`). For each request it forks a fresh child that
(root mode) drops to the worker's unprivileged uid, applies rlimits, chdirs into a fresh scratch
directory and execs the program in a fresh ``__main__``. Afterwards every process left in the
pid namespace is killed, /tmp and /dev/shm are emptied and restored and a new scratch directory
is made when the run touched them (`sandbox_scratch.Scratch.reset`). If that fails, the zygote
answers the next request with RETIRE and exits: the host runs it on a fresh worker. (Its own
rlimits and scheduling, which every run inherits, no program can change: the seccomp filter
allows those calls on pid 0 only.)

Every status but ok/error is the supervisor's own observation: "timeout" (it hit the deadline,
or the kernel's CPU accounting reached RLIMIT_CPU), "output_limit" (it counted the bytes),
"memory" (its watchdog measured the run's memory above the cap: RSS, files in /tmp and /dev/shm
and unix socket buffers together; or the run ended with its kernel-measured peak RSS plus its
files above the cap; or it failed with its peak RSS at >= 75% of the cap; the host adds the
cgroup's OOM kills), "killed" (the kernel reports death by a signal the supervisor did not
send). An exit
code only ever decides between ok (0) and error (anything else).
"""

from __future__ import annotations

import _signal as signal  # the C module: `signal` would build its enums in every zygote
import json
import os
import select
import sys
import time
from collections.abc import Callable

try:  # inside the sandbox: preloaded by the bootstrap under their bare names
    import sandbox_child  # type: ignore[import-not-found]
    import sandbox_kernel  # type: ignore[import-not-found]
    import sandbox_proto  # type: ignore[import-not-found]
    import sandbox_startup  # type: ignore[import-not-found]
except ImportError:  # imported on the host
    from compassplay.verifiers.sandbox import child as sandbox_child
    from compassplay.verifiers.sandbox import kernel as sandbox_kernel
    from compassplay.verifiers.sandbox import proto as sandbox_proto
    from compassplay.verifiers.sandbox import zygote_startup as sandbox_startup

STATUSES = sandbox_proto.STATUSES
REQ_HEAD = sandbox_proto.REQ_HEAD
REPLY_HEAD = sandbox_proto.REPLY_HEAD
LENGTH = sandbox_proto.LENGTH
CODE_AT = 1 + REQ_HEAD.size  # a request's program source starts here
HELLO = sandbox_proto.HELLO
RETIRE = sandbox_proto.RETIRE
WATCHDOG_EVERY_S = 0.05
FAST_WAIT_MS = 20  # first wait on the child's exit alone (below the watchdog's first check)
PEAK_MEMORY_FRACTION = 0.75  # a failed run whose kernel-measured peak RSS reached this is "memory"


class Zygote(sandbox_startup.ZygoteStartup):
    """One warm interpreter that forks a fresh, locked-down child per run."""

    def __init__(self, cfg: dict) -> None:
        """Start the zygote, in this order (each step binds every later fork): the settings,
        the process's own locks, resource limits, what every program inherits (environment,
        seccomp filter, umask, groups), the programs' prepared interpreter state, the sizes
        the supervisor measures against, the scratch space, then a frozen, trimmed heap."""
        import ctypes

        self.cfg = cfg
        roots = self._read_settings(cfg)
        self._libc = ctypes.CDLL(None, use_errno=True)  # prctl, malloc_trim
        self._lock_process()
        self._set_limits()
        self._set_inheritance()
        self._prepare_programs()
        self._measure_kernel()
        self._open_bookkeeping()
        self._prepare_scratch(roots)
        self.healthy = True
        # Called before anything that may take long (a run past the fast wait, a wipe, a sweep
        # of leftovers): `main` makes it send the replies held back for a batch.
        self.before_long_wait: Callable[[], None] = lambda: None
        self._touched = False  # whether the last run touched the scratch space (`Scratch.touched`)
        self._freeze_heap()

    # ---------------------------------------------------------------- parent side
    def run(self, body: bytes) -> bytes:
        """Run the request `body`; the reply frame (length prefix included)."""
        timeout, mem_mb, limit = REQ_HEAD.unpack_from(body, 1)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            sandbox_child.child_main(body[CODE_AT:], timeout, mem_mb, out_w, err_w,
                                     self.scratch, self.child_uid, self.gid, self.main)
        os.close(out_w)
        os.close(err_w)
        try:
            status, exit_code, cpu_s, peak_kb, out, err = self._supervise(
                pid, timeout, mem_mb * 1024 * 1024, limit, out_r, err_r, start)
        except BaseException:
            self._sweep(pid)
            raise
        finally:
            os.close(out_r)
            os.close(err_r)
        duration = time.monotonic() - start
        if self._touched:
            self.before_long_wait()  # the wipe may take up to `wipe_budget_s`
        self.healthy = self.state.reset(self._touched)
        head = REPLY_HEAD.pack(STATUSES.index(status), exit_code is not None,
                               exit_code or 0, duration, cpu_s, peak_kb / 1024, len(out), len(err))
        return b"".join((LENGTH.pack(len(head) + len(out) + len(err)), head, out, err))

    def _supervise(self, pid: int, timeout: float, mem_cap: int, limit: int, out_r: int,
                   err_r: int, start: float) -> tuple:
        pidfd = os.pidfd_open(pid)
        try:
            reaped = self._fast_wait(pidfd, pid, timeout)
            if reaped is None:
                self.before_long_wait()  # replies held for a batch go out now
            if reaped is not None and self.isolated:
                # Every process of the sandbox is gone (`_sweep`): the pipes hold all the output
                # there will ever be, so read them to the end without waiting on them.
                out = sandbox_kernel.drain(out_r, limit + 1)
                err = sandbox_kernel.drain(err_r, limit + 1 - len(out))
                verdict = "output_limit" if len(out) + len(err) > limit else None
            else:
                reaped, verdict, out, err = self._watch(pid, pidfd, reaped, timeout, mem_cap,
                                                        limit, out_r, err_r, start)
        finally:
            os.close(pidfd)
        if reaped is None:
            self._sweep(pid)
            try:
                reaped = os.wait4(pid, 0)
            except ChildProcessError:
                reaped = (pid, 0, None)
        self._touched = self.state.touched()  # (nothing runs that could still touch it)
        _, wstatus, usage = reaped
        cpu_s = usage.ru_utime + usage.ru_stime if usage is not None else 0.0
        peak_kb = usage.ru_maxrss if usage is not None else 0
        if verdict == "output_limit":
            out = out[:limit]
            err = err[:max(0, limit - len(out))]
        exit_code: int | None = None
        if verdict is None:  # the program ended on its own: the kernel says how
            exit_code = os.waitstatus_to_exitcode(wstatus)
            if peak_kb * 1024 + self.state.held_bytes(self._touched) > mem_cap:
                verdict = "memory"  # its peak RSS and the tmpfs files it left exceed the limit
            elif exit_code == 0:
                verdict = "ok"
            elif peak_kb * 1024 >= PEAK_MEMORY_FRACTION * mem_cap:
                verdict = "memory"  # it failed after really holding most of its memory
            elif exit_code > 0:
                verdict = "error"
            elif cpu_s >= int(timeout) + 2 - 0.05:  # RLIMIT_CPU (SIGXCPU/SIGKILL) reached
                verdict, exit_code = "timeout", None
            else:
                verdict = "killed"
        return verdict, exit_code, cpu_s, peak_kb, bytes(out), bytes(err)

    def _fast_wait(self, pidfd: int, pid: int, timeout: float) -> tuple | None:
        """Most programs end within a few ms: sleep on the pidfd alone, so the zygote wakes
        once per run (not per output chunk) and writes none of its pages (copy-on-write faults
        while the child still shares them). The child's wait4 result once it has ended (every
        process left in the sandbox then killed and reaped: they may hold the pipes open),
        else None (output beyond the pipe buffer waits for `_watch`)."""
        poller = self._poller
        poller.register(pidfd, select.POLLIN)
        try:
            if not poller.poll(min(FAST_WAIT_MS, int(timeout * 1000))):
                return None
        finally:
            poller.unregister(pidfd)
        alone = self._alone_with(pid)
        reaped = os.wait4(pid, 0)
        if not alone:
            self._sweep(pid, reaped=True)
        return reaped

    def _alone_with(self, pid: int) -> bool:
        """True when nothing but this zygote and `pid` (ended, not yet reaped) is in the
        sandbox, so there is nothing to sweep: the last sweep left it empty and no pid was
        handed out since `pid`'s (any fork or thread since would show in ns_last_pid; `pid` is
        still held, so its number cannot have come round again). Isolated mode only."""
        return (self._clean and self._last_pid_fd >= 0
                and os.pread(self._last_pid_fd, 16, 0) == b"%d\n" % pid)

    def _watch(self, pid: int, pidfd: int, reaped: tuple | None, timeout: float, mem_cap: int,
               limit: int, out_r: int, err_r: int, start: float) -> tuple:
        """Read the output as it comes until the child has ended and both pipes are closed,
        or until the deadline, output limit or memory watchdog decides: (wait4 result or None,
        verdict or None, stdout, stderr)."""
        deadline = start + timeout
        out, err = bytearray(), bytearray()
        poller = self._poller
        watched = {out_r, err_r} if reaped is not None else {pidfd, out_r, err_r}
        verdict: str | None = None
        next_mem_check = start + 2 * WATCHDOG_EVERY_S
        for fd in watched:
            poller.register(fd, select.POLLIN)
        try:
            while reaped is None or watched:  # (pidfd leaves `watched` once reaped)
                now = time.monotonic()
                if now >= deadline:
                    verdict = "timeout"
                    break
                wait_s = min(deadline, next_mem_check) - now if self.isolated else deadline - now
                for fd, _ in poller.poll(max(0, int(wait_s * 1000) + 1)):
                    if fd == pidfd:
                        reaped = os.wait4(pid, 0)
                        poller.unregister(pidfd)
                        watched.discard(pidfd)
                        self._sweep(pid, reaped=True)  # leftovers may hold the pipes open
                        continue
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        poller.unregister(fd)
                        watched.discard(fd)
                        continue
                    (out if fd == out_r else err).extend(chunk)
                    if len(out) + len(err) > limit:
                        verdict = "output_limit"
                if verdict is not None:
                    break
                if self.isolated and reaped is None and now >= next_mem_check:
                    next_mem_check = now + WATCHDOG_EVERY_S
                    if self._run_memory() + self.state.held_bytes() > mem_cap:
                        verdict = "memory"
                        break
        finally:
            for fd in watched:
                poller.unregister(fd)
        return reaped, verdict, out, err

    def _run_memory(self) -> int:
        """Bytes the run added or could hold in the kernel, summed over every process here but
        the zygote (read from /proc/<pid>/, which needs no ptrace access to non-dumpable
        children):
        - anonymous RSS beyond the zygote's own, and shared RSS;
        - `pipe_bytes` per open fd (any fd may be a pipe end, whose buffer lives as long as
          one end is open);
        plus `socket_bytes` per unix socket in this network namespace (the most a socket's send
        buffer, whose size programs cannot raise, holds), and, while any exists, `pipe_bytes`
        for each of the `nofile` fds the kernel lets one user have in flight over them."""
        total, fds, me = 0, 0, os.getpid()
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != me:
                pid = int(name)
                anon, shmem, fd_table = sandbox_kernel.status_numbers(
                    pid, b"RssAnon:", b"RssShmem:", b"FDSize:")
                total += max(0, anon - self.base_anon_kb) + shmem
                fds += sandbox_kernel.open_fds(pid, fd_table)
        sockets = sandbox_kernel.unix_sockets()
        in_flight = self.nofile if sockets else 0
        return total * 1024 + (fds + in_flight) * self.pipe_bytes + sockets * self.socket_bytes

    def _sweep(self, pid: int, reaped: bool = False) -> None:
        """Kill every process left in the sandbox (or the child's group when not isolated)."""
        if not reaped:
            sandbox_kernel.kill_quiet(pid)
        for n in range(10000):
            try:
                if self.isolated:
                    os.kill(-1, signal.SIGKILL)  # as pid 1: everything here but us
                else:
                    os.killpg(pid, signal.SIGKILL)
                alive = True
            except (ProcessLookupError, PermissionError):
                alive = False
            children = sandbox_kernel.reap_all()
            if not alive and not children:
                self._clean = True
                return
            self._clean = False
            if n == 0:
                self.before_long_wait()  # leftovers: reaping them all may take a while
            if children:
                time.sleep(0.0005)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    in_fd, out_fd = os.dup(0), os.dup(1)
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    if "" in sys.path:
        sys.path.remove("")
    zygote = Zygote(cfg)
    proto = sandbox_proto
    proto.write_all(out_fd, proto.frame(b"H" + HELLO.pack(os.getpid(), zygote.uid)))
    channel = proto.Channel(in_fd, out_fd)
    zygote.before_long_wait = channel.flush
    try:
        while True:
            body = channel.request()
            if body is None or body[:1] == b"X":
                return
            if body[:1] == b"R":
                if not zygote.healthy:  # an earlier run left state we could not restore
                    channel.reply(proto.frame(RETIRE))
                    return
                channel.reply(zygote.run(body))
            else:
                channel.reply(proto.frame(b"?"))
    finally:
        channel.flush()


if __name__ == "__main__":
    main()
