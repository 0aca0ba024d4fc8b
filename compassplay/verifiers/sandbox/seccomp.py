"""Seccomp-BPF filter for sandboxed children (stdlib only; loaded inside the sandbox).

Defence in depth on top of the namespaces and mounts. The filter is a table of rules, read top
to bottom (first match decides; anything not named is allowed):

* `DENY`: refused outright with the errno given (mount and the new mount API, namespaces,
  ptrace and cross-process memory/fd access, kernel keyrings, io_uring, bpf/perf, SysV/POSIX IPC
  objects that would outlive a run, `memfd_create`/`memfd_secret` (memory that no mapping, so no
  RSS, would show), `inotify_add_watch` and `epoll_create`/`epoll_create1` (kernel memory per
  watch that nothing counts; a watch on a dup'ed fd outlives that fd, so the fd limit does not
  bound them, and Python's `selectors`, so asyncio and subprocess, fall back to poll on ENOSYS),
  `syslog`, `open_by_handle_at`, and `socket()` of every family: no connect to an IP address or
  to a host unix socket can even start).
* `SELF_ONLY`: allowed only when the pid-like arguments name the caller itself (pid 0):
  `prlimit64`, `sched_set*`, `setpriority`, `ioprio_set`, `migrate_pages`, `move_pages`. A run
  can change its own limits and scheduling, never the zygote's or another process's.
* `socketpair`: AF_UNIX stream/seqpacket only (a connected pair, what multiprocessing's pipes and
  asyncio use; a datagram pair could `sendto` any socket path).
* `setsockopt`: no SO_SNDBUF/SO_SNDBUFFORCE, so every socket's kernel buffer stays at the default
  the zygote's watchdog counts per socket (`net.core.wmem_default`).
* `fcntl`: no F_SETPIPE_SZ, so every pipe holds at most its default 16 pages, the size the
  zygote's watchdog charges per open fd.
* `clone`: no namespace flags; `clone3` (flags in memory) answers ENOSYS so libc falls back.

The zygote installs it on itself once; every run inherits it. Unknown architectures are
refused at start and the x32 ABI is answered with ENOSYS.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

_LD_W_ABS = 0x20
_ALU_AND_K = 0x54
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000

_OFF_NR = 0
_OFF_ARCH = 4
_OFF_ARGS = 16  # args[i] at 16 + 8*i; the low 32 bits come first (little endian)

_AF_UNIX = 1
_SOCK_DGRAM = 2
_SOCK_TYPE_MASK = 0xF  # the rest of socketpair's type argument is SOCK_CLOEXEC/SOCK_NONBLOCK
_SOL_SOCKET, _SO_SNDBUF, _SO_SNDBUFFORCE = 1, 7, 32
F_SETPIPE_SZ = 1031
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# Numbers >= 424 are shared by every architecture (the unified syscall table).
_COMMON = {
    "pidfd_getfd": 438, "clone3": 435, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "process_madvise": 440,
    "mount_setattr": 442, "memfd_secret": 447, "process_mrelease": 448, "open_tree_attr": 467,
}
_ARCHES: dict[str, dict[str, int]] = {
    "x86_64": {
        **_COMMON, "arch": 0xC000003E, "socket": 41, "socketpair": 53, "setsockopt": 54,
        "clone": 56,
        "ptrace": 101, "syslog": 103, "chroot": 161, "mount": 165, "umount2": 166,
        "pivot_root": 155, "unshare": 272, "setns": 308, "bpf": 321, "perf_event_open": 298,
        "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249,
        "shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240,
        "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
        "memfd_create": 319, "name_to_handle_at": 303, "open_by_handle_at": 304,
        "prlimit64": 302, "sched_setaffinity": 203, "sched_setscheduler": 144,
        "sched_setparam": 142, "sched_setattr": 314, "setpriority": 141, "ioprio_set": 251,
        "migrate_pages": 256, "move_pages": 279, "inotify_add_watch": 254,
        "epoll_create": 213, "epoll_create1": 291, "fcntl": 72,
    },
    "aarch64": {
        **_COMMON, "arch": 0xC00000B7, "socket": 198, "socketpair": 199, "setsockopt": 208,
        "clone": 220,
        "ptrace": 117, "syslog": 116, "chroot": 51, "mount": 40, "umount2": 39,
        "pivot_root": 41, "unshare": 97, "setns": 268, "bpf": 280, "perf_event_open": 241,
        "userfaultfd": 282, "keyctl": 219, "add_key": 217, "request_key": 218,
        "shmget": 194, "semget": 190, "msgget": 186, "mq_open": 180,
        "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
        "memfd_create": 279, "name_to_handle_at": 264, "open_by_handle_at": 265,
        "prlimit64": 261, "sched_setaffinity": 122, "sched_setscheduler": 119,
        "sched_setparam": 118, "sched_setattr": 274, "setpriority": 140, "ioprio_set": 30,
        "migrate_pages": 238, "move_pages": 239, "inotify_add_watch": 27,
        "epoll_create1": 20, "fcntl": 25,  # (no epoll_create on aarch64)
    },
}

_MOUNT_API = ("mount", "umount2", "pivot_root", "chroot", "open_tree", "open_tree_attr",
              "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr")
DENY: dict[str, int] = {
    **{name: errno.EPERM for name in _MOUNT_API},
    **{name: errno.EPERM for name in (
        "unshare", "setns", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
        "kcmp", "process_madvise", "process_mrelease", "bpf", "perf_event_open",
        "userfaultfd", "keyctl", "add_key", "request_key", "io_uring_setup", "io_uring_enter",
        "io_uring_register", "shmget", "semget", "msgget", "mq_open", "syslog",
        "name_to_handle_at", "open_by_handle_at")},
    "memfd_create": errno.ENOSYS, "memfd_secret": errno.ENOSYS,  # callers fall back to files
    "inotify_add_watch": errno.ENOSYS,  # kernel memory per watch that nothing counts
    "epoll_create": errno.ENOSYS, "epoll_create1": errno.ENOSYS,  # the same; poll instead
    "socket": errno.EACCES,
    "clone3": errno.ENOSYS,
}
# (argument index, the only value allowed): every pair must hold, else EPERM.
SELF_ONLY: dict[str, tuple[tuple[int, int], ...]] = {
    "prlimit64": ((0, 0),),
    "sched_setaffinity": ((0, 0),),
    "sched_setscheduler": ((0, 0),),
    "sched_setparam": ((0, 0),),
    "sched_setattr": ((0, 0),),
    "migrate_pages": ((0, 0),),
    "move_pages": ((0, 0),),
    "setpriority": ((0, 0), (1, 0)),   # which = PRIO_PROCESS, who = 0
    "ioprio_set": ((0, 1), (1, 0)),    # which = IOPRIO_WHO_PROCESS, who = 0
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)


def _arg(i: int) -> bytes:
    return _insn(_LD_W_ABS, 0, 0, _OFF_ARGS + 8 * i)


def _ret(action: int) -> bytes:
    return _insn(_RET_K, 0, 0, action)


def _rule(nr: int, body: list[bytes]) -> list[bytes]:
    """`if (nr == syscall) { body }`: every path through `body` returns, so the accumulator
    (the syscall number) is intact for the next rule."""
    return [_insn(_JEQ_K, 0, len(body), nr)] + body


def _all_equal(checks: tuple[tuple[int, int], ...], err: int) -> list[bytes]:
    """Allow when args[i] == value for every (i, value), else ERRNO(err)."""
    body: list[bytes] = []
    for n, (i, value) in enumerate(checks):
        left = 2 * (len(checks) - n - 1)  # instructions after this JEQ before ALLOW
        body += [_arg(i), _insn(_JEQ_K, 0, left + 1, value)]
    return body + [_ret(_RET_ALLOW), _ret(_RET_ERRNO | err)]


def supported() -> bool:
    """True when a filter can be built for this machine's architecture."""
    return os.uname().machine in _ARCHES


def build_filter(machine: str | None = None) -> bytes:
    """The raw BPF program (a sequence of struct sock_filter) for `machine` (default: this one)."""
    machine = machine or os.uname().machine  # (what platform.machine() returns)
    if machine not in _ARCHES:
        raise ValueError(f"no seccomp filter for architecture {machine!r} "
                         f"(known: {', '.join(sorted(_ARCHES))})")
    nrs = _ARCHES[machine]
    prog = [
        _insn(_LD_W_ABS, 0, 0, _OFF_ARCH),
        _insn(_JEQ_K, 1, 0, nrs["arch"]),
        _ret(_RET_KILL_PROCESS),
        _insn(_LD_W_ABS, 0, 0, _OFF_NR),
        _insn(_JGE_K, 0, 1, 0x40000000),  # x32 ABI numbers
        _ret(_RET_ERRNO | errno.ENOSYS),
    ]
    for name, err in DENY.items():
        if name in nrs:  # a call an architecture lacks needs no rule
            prog += _rule(nrs[name], [_ret(_RET_ERRNO | err)])
    for name, checks in SELF_ONLY.items():
        prog += _rule(nrs[name], _all_equal(checks, errno.EPERM))
    prog += _rule(nrs["socketpair"], [  # AF_UNIX, and not SOCK_DGRAM
        _arg(0), _insn(_JEQ_K, 0, 4, _AF_UNIX),
        _arg(1), _insn(_ALU_AND_K, 0, 0, _SOCK_TYPE_MASK), _insn(_JEQ_K, 1, 0, _SOCK_DGRAM),
        _ret(_RET_ALLOW), _ret(_RET_ERRNO | errno.EACCES)])
    prog += _rule(nrs["setsockopt"], [  # (fd, level, optname, ...): no larger send buffers
        _arg(1), _insn(_JEQ_K, 0, 3, _SOL_SOCKET),
        _arg(2), _insn(_JEQ_K, 2, 0, _SO_SNDBUF), _insn(_JEQ_K, 1, 0, _SO_SNDBUFFORCE),
        _ret(_RET_ALLOW), _ret(_RET_ERRNO | errno.EPERM)])
    prog += _rule(nrs["fcntl"], [  # (fd, cmd, arg): pipes keep their default size
        _arg(1), _insn(_JEQ_K, 0, 1, F_SETPIPE_SZ),
        _ret(_RET_ERRNO | errno.EPERM), _ret(_RET_ALLOW)])
    prog += _rule(nrs["clone"], [  # clone(flags, ...): no new namespaces
        _arg(0), _insn(_JSET_K, 0, 1, _CLONE_NS_FLAGS),
        _ret(_RET_ERRNO | errno.EPERM), _ret(_RET_ALLOW)])
    prog.append(_ret(_RET_ALLOW))
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


def install(program: bytes) -> None:
    """Set no_new_privs and load `program` into the calling process (irreversible)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    buf = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
