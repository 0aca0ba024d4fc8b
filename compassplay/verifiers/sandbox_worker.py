"""Zygote server that runs *inside* one sandbox (stdlib only, started by path).

Protocol: length-prefixed (4-byte big-endian) JSON frames on the fds inherited as stdin
(requests) and stdout (replies). For each request the zygote forks a fresh child that drops
to the worker's unprivileged uid, applies rlimits and a seccomp filter, chdirs into a fresh
scratch directory and execs the program in a fresh ``__main__``. Afterwards every process
left in the sandbox's pid namespace is killed and the scratch space is wiped.
"""

from __future__ import annotations

import json
import os
import resource
import select
import shutil
import signal
import struct
import sys
import time

sandbox_seccomp = sys.modules["sandbox_seccomp"]  # preloaded by isolation.worker_bootstrap

# Warm imports: the forked child finds these already loaded.
import bisect  # noqa: E402,F401
import collections  # noqa: E402,F401
import copy  # noqa: E402,F401
import functools  # noqa: E402,F401
import heapq  # noqa: E402,F401
import io  # noqa: E402
import itertools  # noqa: E402,F401
import math  # noqa: E402,F401
import operator  # noqa: E402,F401
import re  # noqa: E402,F401
import string  # noqa: E402,F401
import threading  # noqa: E402
import traceback  # noqa: E402
import types  # noqa: E402

MEMORY_EXIT = 113
MAX_REQUEST = 8 * 1024 * 1024
SCRATCH_ROOT = "/tmp"
WIPE_DIRS = ("/tmp", "/dev/shm")
_PR_SET_CHILD_SUBREAPER = 36


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def read_frame(fd: int) -> dict | None:
    head = _read_exact(fd, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">I", head)
    if size > MAX_REQUEST:
        raise ValueError("request too large")
    body = _read_exact(fd, size)
    return None if body is None else json.loads(body)


def write_frame(fd: int, obj: dict) -> None:
    data = json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


class Zygote:
    """One warm interpreter that forks a fresh, locked-down child per run."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.isolated = bool(cfg["isolated"])
        self.uid = int(cfg.get("uid", -1))
        self.gid = int(cfg.get("gid", -1))
        self.filter = sandbox_seccomp.build_filter() if cfg.get("seccomp") else None
        if self.isolated:
            if os.getpid() > 3:
                raise SystemExit("isolated zygote must run in its own pid namespace")
            if cfg.get("loopback_down"):
                _loopback_down()
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self.scratch_root = cfg.get("scratch_root") or SCRATCH_ROOT

    # ---------------------------------------------------------------- child side
    def _child(self, req: dict, scratch: str, out_w: int, err_w: int) -> None:
        code = 1
        try:
            os.setsid()
            devnull = os.open("/dev/null", os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.closerange(3, 1 << 16)
            os.chdir(scratch)
            os.umask(0o077)
            mem = int(req["memory_mb"]) * 1024 * 1024
            limits = [
                (resource.RLIMIT_AS, mem),
                (resource.RLIMIT_NPROC, int(self.cfg.get("nproc", 32))),
                (resource.RLIMIT_FSIZE, int(self.cfg.get("fsize_mb", 16)) * 1024 * 1024),
                (resource.RLIMIT_CORE, 0),
                (resource.RLIMIT_NOFILE, int(self.cfg.get("nofile", 256))),
                (resource.RLIMIT_CPU, int(float(req["timeout_s"])) + 2),
            ]
            for which, value in limits:
                resource.setrlimit(which, (value, value))
            if self.isolated:
                os.setgroups([])
                os.setgid(self.gid)
                os.setuid(self.uid)
                if os.getuid() != self.uid or os.geteuid() != self.uid:
                    raise OSError("setuid did not take effect")
            if self.filter is not None:
                sandbox_seccomp.install(self.filter)
            for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGALRM):
                signal.signal(sig, signal.SIG_DFL)
            os.environ.clear()
            os.environ.update(
                {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch,
                 "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
            )
            sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                          errors="backslashreplace")
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                          errors="backslashreplace", line_buffering=True)
            sys.argv = ["<program>"]
            code = _run_program(req["code"])
        except BaseException:  # setup failure: report and die
            try:
                os.write(2, traceback.format_exc().encode()[-4000:])
            except BaseException:
                pass
            code = 1
        os._exit(code)

    # ---------------------------------------------------------------- parent side
    def run(self, req: dict) -> dict:
        scratch = os.path.join(self.scratch_root, "work")
        if os.path.lexists(scratch):
            self._wipe()
        os.mkdir(scratch, 0o700)
        if self.isolated:
            os.chown(scratch, self.uid, self.gid)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.close(out_r)
            os.close(err_r)
            self._child(req, scratch, out_w, err_w)
        os.close(out_w)
        os.close(err_w)
        try:
            result = self._supervise(pid, req, out_r, err_r, start)
        finally:
            self._sweep(pid)
            os.close(out_r)
            os.close(err_r)
            self._wipe()
        result["duration_s"] = time.monotonic() - start
        return result

    def _supervise(self, pid: int, req: dict, out_r: int, err_r: int, start: float) -> dict:
        limit = int(req["max_output_bytes"])
        deadline = start + float(req["timeout_s"])
        mem_cap = int(req["memory_mb"]) * 1024 * 1024
        bufs = {out_r: bytearray(), err_r: bytearray()}
        open_fds = {out_r, err_r}
        pidfd = os.pidfd_open(pid)
        verdict: str | None = None
        wstatus: int | None = None
        last_mem_check = start
        try:
            while wstatus is None or open_fds:
                now = time.monotonic()
                if now >= deadline and verdict is None and wstatus is None:
                    verdict = "timeout"
                if verdict is not None:
                    break
                wait = [*open_fds] + ([pidfd] if wstatus is None else [])
                ready, _, _ = select.select(wait, [], [], min(0.05, max(0.0, deadline - now)))
                for fd in ready:
                    if fd == pidfd:
                        wstatus = os.waitpid(pid, 0)[1]
                        self._sweep(pid, reaped=True)  # leftovers may hold the pipes open
                        continue
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        open_fds.discard(fd)
                        continue
                    bufs[fd] += chunk
                    if len(bufs[out_r]) + len(bufs[err_r]) > limit:
                        verdict = "output_limit"
                if (verdict is None and wstatus is None and self.isolated
                        and now - start > 0.1 and now - last_mem_check > 0.05):
                    last_mem_check = now
                    if _sandbox_rss() > mem_cap:
                        verdict = "memory"
        finally:
            os.close(pidfd)
        if wstatus is None:
            self._sweep(pid)
            try:
                wstatus = os.waitpid(pid, 0)[1]
            except ChildProcessError:
                wstatus = 0
        out, err = bufs[out_r], bufs[err_r]
        if verdict == "output_limit":
            out = out[:limit]
            err = err[: max(0, limit - len(out))]
        exit_code: int | None = os.waitstatus_to_exitcode(wstatus)
        if verdict is not None:  # the supervisor intervened and killed the program
            exit_code = None
        if verdict is None:
            if exit_code == 0:
                verdict = "ok"
            elif exit_code == MEMORY_EXIT:
                verdict = "memory"
            elif exit_code < 0:
                verdict = "killed"
            else:
                verdict = "error"
        return {
            "status": verdict,
            "stdout": out.decode("utf-8", "replace"),
            "stderr": err.decode("utf-8", "replace"),
            "exit_code": exit_code,
        }

    def _sweep(self, pid: int, reaped: bool = False) -> None:
        """Kill every process left in the sandbox (or the child's group when not isolated)."""
        if not reaped:
            _kill_quiet(pid)
        for _ in range(10000):
            if self.isolated:
                try:  # pid namespace: -1 reaches every process here except us and init
                    os.kill(-1, signal.SIGKILL)
                    alive = True
                except ProcessLookupError:
                    alive = False
            else:
                try:
                    os.killpg(pid, signal.SIGKILL)
                    alive = True
                except (ProcessLookupError, PermissionError):
                    alive = False
            children = _reap_all()
            if not alive and not children:
                return
            if children:
                time.sleep(0.0005)

    def _wipe(self) -> None:
        for root in WIPE_DIRS if self.isolated else (self.scratch_root,):
            try:
                entries = list(os.scandir(root))
            except OSError:
                continue
            for entry in entries:
                path = entry.path
                if not self.isolated and entry.name != "work":
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass


def _run_program(code: str) -> int:
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    status = 0
    try:
        exec(compile(code, "<program>", "exec"), main.__dict__)
        for t in threading.enumerate():
            if t is not threading.main_thread() and not t.daemon:
                t.join()
    except SystemExit as exc:
        if exc.code is None:
            status = 0
        elif isinstance(exc.code, int):
            status = exc.code & 0xFF
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except MemoryError:
        status = MEMORY_EXIT
        _try_write_err("MemoryError\n")
    except BaseException as exc:
        status = MEMORY_EXIT if _caused_by_memory(exc) else 1
        try:
            tb = exc.__traceback__
            traceback.print_exception(type(exc), exc, tb.tb_next if tb else None)
        except BaseException:
            _try_write_err(f"{type(exc).__name__}\n")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return status


def _caused_by_memory(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 50:
        if isinstance(exc, MemoryError):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _try_write_err(text: str) -> None:
    try:
        os.write(2, text.encode())
    except OSError:
        pass


def _kill_quiet(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap_all() -> bool:
    """Reap finished children; True while some child is still alive."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def _sandbox_rss() -> int:
    """Total proportional memory (PSS) of all processes in this pid namespace except init and us."""
    total, me = 0, os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (1, me):
            continue
        try:  # proportional set size: copy-on-write pages shared with the zygote count once
            with open(f"/proc/{name}/smaps_rollup", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, IndexError, ValueError):
            pass
    return total


def _loopback_down() -> None:
    """Bring `lo` down so even loopback has no route (needs CAP_NET_ADMIN in this netns)."""
    import fcntl
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s.fileno(), 0x8914, struct.pack("16sH14x", b"lo", 0))  # SIOCSIFFLAGS


def main() -> None:
    cfg = json.loads(sys.argv[1])
    in_fd, out_fd = os.dup(0), os.dup(1)
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    zygote = Zygote(cfg)
    write_frame(out_fd, {"ready": True, "pid": os.getpid(), "uid": zygote.uid})
    while True:
        req = read_frame(in_fd)
        if req is None or req.get("op") == "exit":
            return
        if req.get("op") == "ping":
            write_frame(out_fd, {"pong": True})
            continue
        write_frame(out_fd, zygote.run(req))


if __name__ == "__main__":
    main()
