"""The zygote's view of the kernel: draining a finished run's pipes, killing and reaping
its processes, reading /proc (memory of a process, a sysctl, unix sockets in the namespace), and
bringing loopback down. Stdlib only; preloaded into the sandbox under its bare name."""

from __future__ import annotations

import _signal as signal  # the C module: `signal` would build its enums in every zygote
import os
import struct


def drain(fd: int, most: int) -> bytes:
    """Up to `most` bytes from a pipe that no process can write to any more (at its end)."""
    data = b""
    while len(data) < most:
        chunk = os.read(fd, 65536)
        data += chunk
        if len(chunk) < 65536:  # a pipe read returns all it holds: short means empty, and no
            break               # writer is left, so nothing more will come
    return data


def kill_quiet(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def reap_all() -> bool:
    """Reap finished children; True while some child is still alive."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def status_numbers(pid: int, *keys: bytes) -> list[int]:
    """The numbers after `keys` in /proc/<pid>/status, read once (kB for the Rss fields);
    0 for a key that is absent or a process that is gone."""
    found = dict.fromkeys(keys, 0)
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                key = line[:line.find(b":") + 1]
                if key in found:
                    found[key] = int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return [found[k] for k in keys]


def status_number(pid: int, key: bytes) -> int:
    """The number after `key` in /proc/<pid>/status; 0 if absent."""
    return status_numbers(pid, key)[0]


def open_fds(pid: int, fd_table_size: int) -> int:
    """Open fds of a process: the size of /proc/<pid>/fd (Linux 6.2+; no ptrace access
    needed), else `fd_table_size` (its status FDSize, the fd table's capacity: an upper
    bound)."""
    try:
        count = os.stat(f"/proc/{pid}/fd").st_size
    except OSError:
        return 0  # gone
    return count if count > 0 else fd_table_size


def read_int(path: str, default: int) -> int:
    try:
        with open(path, "rb") as fh:
            return int(fh.read().split()[0])
    except (OSError, IndexError, ValueError):
        return default


def unix_sockets() -> int:
    """Unix sockets alive in this network namespace (in a process or in flight)."""
    try:
        with open("/proc/net/unix", "rb") as fh:
            return max(0, fh.read().count(b"\n") - 1)
    except OSError:
        return 0


def loopback_down(libc) -> None:
    """Bring `lo` down so even loopback has no route (needs CAP_NET_ADMIN in this netns).
    Through libc, not the socket module: every extension module the zygote loads adds
    mappings that each fork has to copy."""
    import ctypes

    fd = libc.socket(2, 2, 0)  # AF_INET, SOCK_DGRAM
    if fd < 0:
        raise OSError(ctypes.get_errno(), "socket")
    try:
        req = ctypes.create_string_buffer(struct.pack("16sH14x", b"lo", 0), 40)
        if libc.ioctl(fd, 0x8914, req) != 0:  # SIOCSIFFLAGS
            raise OSError(ctypes.get_errno(), "ioctl(SIOCSIFFLAGS, lo)")
    finally:
        os.close(fd)
