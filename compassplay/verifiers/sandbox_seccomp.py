"""Seccomp-BPF filter for sandboxed children (stdlib only; loaded inside the sandbox).

The filter is defence in depth on top of the namespaces: it refuses every socket family
except AF_UNIX (so no connect to any IP address can even start), namespace creation,
io_uring, SysV/POSIX IPC objects that would outlive a run, ptrace, cross-process memory and fd
access, mount and friends. The zygote installs it on itself once; every run inherits it.
Unknown architectures and the x32 ABI are rejected outright.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000

_OFF_NR = 0
_OFF_ARCH = 4
_OFF_ARG0 = 16  # low 32 bits of args[0] (little endian)

_AF_UNIX = 1
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

_ARCHES: dict[str, dict[str, int]] = {
    "x86_64": {
        "arch": 0xC000003E, "socket": 41, "clone": 56, "clone3": 435,
        "ptrace": 101, "chroot": 161, "mount": 165, "umount2": 166, "pivot_root": 155,
        "unshare": 272, "setns": 308, "bpf": 321, "perf_event_open": 298,
        "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240,
        "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438,
    },
    "aarch64": {
        "arch": 0xC00000B7, "socket": 198, "clone": 220, "clone3": 435,
        "ptrace": 117, "chroot": 51, "mount": 40, "umount2": 39, "pivot_root": 41,
        "unshare": 97, "setns": 268, "bpf": 280, "perf_event_open": 241,
        "userfaultfd": 282, "keyctl": 219, "add_key": 217, "request_key": 218,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "shmget": 194, "semget": 190, "msgget": 186, "mq_open": 180,
        "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438,
    },
}

_DENY_EPERM = (
    "ptrace", "chroot", "mount", "umount2", "pivot_root", "unshare", "setns", "bpf",
    "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "shmget", "semget", "msgget", "mq_open",
    "process_vm_readv", "process_vm_writev", "pidfd_getfd",
)


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k & 0xFFFFFFFF)


def supported() -> bool:
    """True when a filter can be built for this machine's architecture."""
    return platform.machine() in _ARCHES


def build_filter() -> bytes:
    """Return the raw BPF program (a sequence of struct sock_filter)."""
    nrs = _ARCHES[platform.machine()]
    prog = [
        _insn(_LD_W_ABS, 0, 0, _OFF_ARCH),
        _insn(_JEQ_K, 1, 0, nrs["arch"]),
        _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),
        _insn(_LD_W_ABS, 0, 0, _OFF_NR),
        _insn(_JGE_K, 0, 1, 0x40000000),  # x32 ABI numbers
        _insn(_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
        # socket(domain, ...): only AF_UNIX
        _insn(_JEQ_K, 0, 4, nrs["socket"]),
        _insn(_LD_W_ABS, 0, 0, _OFF_ARG0),
        _insn(_JEQ_K, 0, 1, _AF_UNIX),
        _insn(_RET_K, 0, 0, _RET_ALLOW),
        _insn(_RET_K, 0, 0, _RET_ERRNO | errno.EACCES),
        # clone(flags, ...): no new namespaces
        _insn(_JEQ_K, 0, 4, nrs["clone"]),
        _insn(_LD_W_ABS, 0, 0, _OFF_ARG0),
        _insn(_JSET_K, 0, 1, _CLONE_NS_FLAGS),
        _insn(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),
        _insn(_RET_K, 0, 0, _RET_ALLOW),
        # clone3 hides its flags in memory: report ENOSYS so libc falls back to clone
        _insn(_JEQ_K, 0, 1, nrs["clone3"]),
        _insn(_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
    ]
    for name in _DENY_EPERM:
        prog.append(_insn(_JEQ_K, 0, 1, nrs[name]))
        prog.append(_insn(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM))
    prog.append(_insn(_RET_K, 0, 0, _RET_ALLOW))
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
