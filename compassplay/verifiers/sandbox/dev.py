"""Sealing a sandbox's /dev before the zygote starts (stdlib only).

bubblewrap binds a device node only writable (any program could then set its timestamps, which
are the host node's), and a read-only bind it makes is also nodev, which would leave no working
/dev/null. So bubblewrap's command is first a short-lived interpreter running this file's source
(`isolation.seal_prefix`) with `SETUP_CAPS` on top of the zygote's: `seal_dev` remounts each
device bind read-only with device access kept and drops those capabilities from every set, then
`main` execs the zygote's command line, which keeps only the ambient capabilities (root mode's
`isolation.ROOT_CAPS`, rootless mode's none). The zygote itself runs none of this code, so its
heap, which every run's fork copies, is what it was before.
"""

from __future__ import annotations

import os

# The device nodes bound into every sandbox's /dev (`isolation.dev_layout`), read-only.
DEV_NODES = ("full", "null", "random", "urandom", "zero")
# Held only while `seal_dev` remounts those binds, then dropped from every set.
SETUP_CAPS = {"CAP_SETPCAP": 8, "CAP_SYS_ADMIN": 21}
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_RELATIME = 1, 32, 4096, 1 << 21
_KEPT_FLAGS = os.ST_NOSUID | os.ST_NODEV | os.ST_NOEXEC | os.ST_NOATIME | os.ST_NODIRATIME
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_LOWER = 24, 47, 3
_CAP_VERSION_3 = 0x20080522


def seal_dev(libc, nodes: tuple[str, ...] = DEV_NODES) -> None:
    """Remount each device bind ``/dev/<node>`` read-only with device access kept, then drop
    `SETUP_CAPS` from every capability set. Raises OSError on any failure (the sandbox's
    command then never starts)."""
    import ctypes

    for name in nodes:
        path = "/dev/" + name
        flags = os.statvfs(path).f_flag
        ms = (_MS_REMOUNT | _MS_BIND | _MS_RDONLY | (flags & _KEPT_FLAGS)
              | (_MS_RELATIME if flags & os.ST_RELATIME else 0))
        if libc.mount(None, path.encode(), None, ms, None) != 0:
            raise OSError(ctypes.get_errno(), f"remount {path} read-only")
        if os.statvfs(path).f_flag & (os.ST_RDONLY | os.ST_NODEV) != os.ST_RDONLY:
            raise OSError(f"{path} is not a read-only device bind")
    drop_capabilities(libc, tuple(SETUP_CAPS.values()))


def drop_capabilities(libc, caps: tuple[int, ...]) -> None:
    """Remove `caps` (numbers below 32) from this process's bounding, ambient, effective,
    permitted and inheritable sets (the bounding set first: that needs CAP_SETPCAP); OSError
    unless /proc/self/status then shows none of them in any set."""
    import ctypes

    mask = 0
    for cap in caps:
        mask |= 1 << cap
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"drop capability {cap} from the bounding set")
        libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_LOWER, cap, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # {effective, permitted, inheritable} for caps 0-31, 32-63
    if libc.capget(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for i in range(3):
        data[i] &= ~mask & 0xFFFFFFFF
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    held = capability_sets(os.getpid())
    if any(v & mask for v in held.values()):
        raise OSError(f"capabilities {sorted(caps)} still held: {held}")


def capability_sets(pid: int) -> dict[str, int]:
    """CapInh, CapPrm, CapEff, CapBnd and CapAmb of a process (from /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status", "rb") as fh:
        return {line[:6].decode(): int(line.split()[1], 16) for line in fh
                if line.startswith(b"Cap")}


def main() -> None:
    """Entry of the sealing interpreter (``python -c <this source> main-call argv...``): seal
    /dev, then exec ``sys.argv[1:]`` (same pid, same stdin: the zygote's bootstrap pipe)."""
    import ctypes
    import sys

    seal_dev(ctypes.CDLL(None, use_errno=True))
    os.execv(sys.argv[1], sys.argv[1:])
