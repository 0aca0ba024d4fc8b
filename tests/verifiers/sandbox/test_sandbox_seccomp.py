"""The seccomp filter's rules, checked by running the BPF program it builds (both
architectures) on sample system calls; the sandbox tests check the installed filter live."""

from __future__ import annotations

import errno
import struct

import pytest

from compassplay.verifiers.sandbox import seccomp as sc

ALLOW = 0x7FFF0000
KILL = 0x80000000


def errno_of(e: int) -> int:
    return 0x00050000 | e


def run_bpf(prog: bytes, arch: int, nr: int, *args: int) -> int:
    """Evaluate a classic-BPF seccomp program on one call: the action it returns."""
    full = list(args) + [0] * (6 - len(args))
    data = struct.pack("<iIQ6Q", nr, arch, 0, *[a & 0xFFFFFFFFFFFFFFFF for a in full])
    insns = [struct.unpack_from("HBBI", prog, i) for i in range(0, len(prog), 8)]
    acc, pc = 0, 0
    for _ in range(len(insns) + 1):  # no backward jumps: at most one pass
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x54:
            acc &= k
        elif code in (0x15, 0x35, 0x45):
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if hit else jf
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected BPF opcode {code:#x}")
        pc += 1
    raise AssertionError("BPF program did not return")


@pytest.fixture(params=sorted(sc._ARCHES))
def arch(request: pytest.FixtureRequest):
    nrs = sc._ARCHES[request.param]
    prog = sc.build_filter(request.param)

    def call(name: str, *args: int) -> int:
        return run_bpf(prog, nrs["arch"], nrs[name], *args)

    call.nrs = nrs  # type: ignore[attr-defined]
    call.prog = prog  # type: ignore[attr-defined]
    return call


MISSING_BEFORE_ISSUE_25 = ("fsopen", "fsconfig", "fsmount", "move_mount", "open_tree", "fspick",
                           "mount_setattr", "syslog", "open_by_handle_at", "memfd_create",
                           "inotify_add_watch")


def test_denied_calls_get_their_errno(arch) -> None:
    for name, err in sc.DENY.items():
        if name in arch.nrs:  # aarch64 has no epoll_create
            assert arch(name) == errno_of(err), name
    for name in MISSING_BEFORE_ISSUE_25:
        assert arch(name) != ALLOW, name
    assert arch("epoll_create1", 0x80000) == errno_of(errno.ENOSYS)  # EPOLL_CLOEXEC


def test_pipes_keep_their_default_size(arch) -> None:
    assert arch("fcntl", 3, sc.F_SETPIPE_SZ, 2**20) == errno_of(errno.EPERM)
    assert arch("fcntl", 3, 1032) == ALLOW       # F_GETPIPE_SZ
    assert arch("fcntl", 3, 2, 1) == ALLOW       # F_SETFD (FD_CLOEXEC)
    assert arch("fcntl", 3, 4, 0x800) == ALLOW   # F_SETFL (O_NONBLOCK)


@pytest.mark.parametrize("name", sorted(sc.SELF_ONLY))
def test_limits_and_scheduling_only_on_the_caller(arch, name: str) -> None:
    checks = sc.SELF_ONLY[name]
    own = [0] * 6
    for i, value in checks:
        own[i] = value
    assert arch(name, *own) == ALLOW
    for i, value in checks:  # any other target, including pid 1 (the zygote)
        for other in (1, 2, 0xFFFFFFFF):
            if other != value:
                args = list(own)
                args[i] = other
                assert arch(name, *args) == errno_of(errno.EPERM), (name, args)


def test_sockets_only_a_unix_stream_pair(arch) -> None:
    cloexec = 0x80000
    assert arch("socket", 1, 1) == errno_of(errno.EACCES)   # AF_UNIX: no host socket paths
    assert arch("socket", 2, 1) == errno_of(errno.EACCES)   # AF_INET
    assert arch("socketpair", 1, 1 | cloexec) == ALLOW      # SOCK_STREAM
    assert arch("socketpair", 1, 5) == ALLOW                # SOCK_SEQPACKET
    assert arch("socketpair", 1, 2 | cloexec) == errno_of(errno.EACCES)  # SOCK_DGRAM
    assert arch("socketpair", 2, 1) == errno_of(errno.EACCES)


def test_socket_send_buffers_cannot_grow(arch) -> None:
    assert arch("setsockopt", 3, 1, 7) == errno_of(errno.EPERM)    # SOL_SOCKET, SO_SNDBUF
    assert arch("setsockopt", 3, 1, 32) == errno_of(errno.EPERM)   # SO_SNDBUFFORCE
    assert arch("setsockopt", 3, 1, 2) == ALLOW                    # SO_REUSEADDR
    assert arch("setsockopt", 3, 6, 7) == ALLOW                    # another level


def test_clone_without_namespaces_and_everything_else_allowed(arch) -> None:
    assert arch("clone", 0x11) == ALLOW                      # SIGCHLD: a plain fork
    assert arch("clone", 0x10000000 | 0x11) == errno_of(errno.EPERM)  # CLONE_NEWUSER
    assert arch("clone3") == errno_of(errno.ENOSYS)
    nrs = arch.nrs
    read_nr = 0 if nrs["arch"] == 0xC000003E else 63
    assert run_bpf(arch.prog, nrs["arch"], read_nr, 0) == ALLOW
    assert run_bpf(arch.prog, 0x40000003, read_nr) == KILL   # another architecture (i386)
    if nrs["arch"] == 0xC000003E:
        assert run_bpf(arch.prog, nrs["arch"], 0x40000000 | 165) == errno_of(errno.ENOSYS)  # x32


def test_bad_architecture_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no seccomp filter for architecture 'vax'"):
        sc.build_filter("vax")
