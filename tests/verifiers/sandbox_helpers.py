"""Helpers shared by the sandbox tests (host-state snapshots, isolation gate)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compassplay.verifiers.sandbox.isolation import (
    ROOT,
    ROOTLESS,
    SandboxUnavailableError,
    preflight,
)

HOST_SECRET = "COMPASSPLAY_TEST_HOST_SECRET"
MODES = {"root": ROOT, "rootless": ROOTLESS}


def require_isolation(mode: str = "bwrap") -> None:
    """Skip (or fail under CI=1) when this machine cannot provide the isolation. Root mode is
    skipped, never failed, when the tests do not run as root."""
    if mode == ROOT and os.geteuid() != 0:
        pytest.skip("root mode needs root")
    try:
        preflight(mode)
    except SandboxUnavailableError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"sandbox isolation unavailable: {exc}")


def _status_field(pid: int, key: str) -> str:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def leftovers(sandbox) -> list[int]:
    """Host pids inside the pool's sandboxes other than bwrap and the zygotes (pid 1 inside)."""
    out = []
    for root in sandbox.worker_pids():
        for pid in descendants(root):
            if _status_field(pid, "Name") == "bwrap" or _status_field(pid, "NSpid").split()[-1:] == ["1"]:
                continue
            out.append(pid)
    return out


def processes_of(uids: list[int]) -> list[int]:
    """Host pids whose real uid is one of `uids`."""
    wanted, found = {str(u) for u in uids}, []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Uid:") and line.split()[1] in wanted:
                found.append(int(name))
    return found


def dir_state(path: Path) -> dict[str, bytes]:
    """Name -> content of every regular file directly under `path`."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


def descendants(pid: int) -> list[int]:
    """Host pids of all descendants of `pid`."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(k) for k in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            continue
        out += kids
        todo += kids
    return out


def rss_kb(pid: int) -> int:
    """Resident set size of a host process in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# --- /dev (issue 34). Both programs walk /dev without following symlinks; /dev/shm is writable
# by design (emptied and restored after every run, see test_sandbox_fresh_state), so only its
# mode, listing and extended attributes are compared.
DEV_WALK = (
    "import os, stat\n"
    "def walk(p):\n"
    "    yield p\n"
    "    if p != '/dev/shm' and stat.S_ISDIR(os.lstat(p).st_mode):\n"
    "        try:\n"
    "            names = sorted(os.listdir(p))\n"
    "        except OSError as e:\n"
    "            names = []\n"
    "            print('UNREADABLE', p, e.errno)\n"
    "        for n in names:\n"
    "            yield from walk(os.path.join(p, n))\n"
)
# One line per entry, then a line naming the sandbox (its /tmp mount's device number).
DEV_SNAPSHOT = DEV_WALK + (
    "for p in walk('/dev'):\n"
    "    st = os.lstat(p)\n"
    "    if p == '/dev/shm':\n"
    "        print(p, oct(st.st_mode), st.st_uid, os.listdir(p), os.listxattr(p))\n"
    "        continue\n"
    "    link = os.readlink(p) if stat.S_ISLNK(st.st_mode) else ''\n"
    "    print(p, st.st_ino, oct(st.st_mode), st.st_uid, st.st_gid, st.st_nlink, st.st_rdev,\n"
    "          st.st_mtime_ns, st.st_ctime_ns, link)\n"
    "print('SANDBOX', os.stat('/tmp').st_dev)\n"
)
# Everything a program might try on every entry of /dev (and on the issue's /dev/ptmx and
# /dev/pts where they exist); prints "CHANGED <what> <path>" for each attempt that succeeded.
DEV_ATTACK = DEV_WALK + (
    "uid, gid = os.getuid(), os.getgid()\n"
    "paths = list(dict.fromkeys([*walk('/dev'), '/dev/ptmx', '/dev/pts', '/dev/pts/ptmx']))\n"
    "changed, denied = [], []\n"
    "def attempt(what, p, f):\n"
    "    try:\n"
    "        f()\n"
    "    except OSError:\n"
    "        denied.append(what)\n"
    "    else:\n"
    "        changed.append(f'{what} {p}')\n"
    "def make_node(q):\n"
    "    os.mknod(q, 0o666 | stat.S_IFCHR, os.makedev(1, 3))\n"
    "MAKE = (('file', lambda q: open(q, 'x').close()), ('dir', os.mkdir), ('fifo', os.mkfifo),\n"
    "        ('symlink', lambda q: os.symlink('/tmp', q)), ('node', make_node))\n"
    "for p in paths:\n"
    "    if p == '/dev/shm' or not os.path.lexists(p):\n"
    "        continue\n"
    "    mode = os.lstat(p).st_mode\n"
    "    attempt('setxattr', p, lambda: os.setxattr(p, 'user.leak', b'1', follow_symlinks=False))\n"
    "    attempt('chown', p, lambda: os.chown(p, uid, gid, follow_symlinks=False))\n"
    "    attempt('touch', p, lambda: os.utime(p, None, follow_symlinks=False))\n"
    "    attempt('utime', p, lambda: os.utime(p, (1, 1), follow_symlinks=False))\n"
    "    if not stat.S_ISLNK(mode):\n"
    "        attempt('chmod', p, lambda: os.chmod(p, 0))\n"
    "    if stat.S_ISCHR(mode):\n"
    "        for flags in (os.O_RDONLY, os.O_WRONLY):\n"
    "            try:\n"
    "                fd = os.open(p, flags)\n"
    "            except OSError:\n"
    "                continue\n"
    "            attempt('futimens', p, lambda: os.utime(fd))\n"
    "            attempt('fchmod', p, lambda: os.fchmod(fd, 0))\n"
    "            os.close(fd)\n"
    "    if stat.S_ISDIR(mode):\n"
    "        for name, make in MAKE:\n"
    "            q = os.path.join(p, 'leftover_' + name)\n"
    "            attempt('create ' + name, q, lambda: make(q))\n"
    "    attempt('link', p, lambda: os.link(p, '/dev/leftover_link', follow_symlinks=False))\n"
    "    attempt('rename', p, lambda: os.rename(p, p + '.moved'))\n"
    "    attempt('remove', p, lambda: (os.rmdir if stat.S_ISDIR(mode) else os.unlink)(p))\n"
    "print(len(paths), 'paths', len(denied), 'denied')\n"
    "for c in changed:\n"
    "    print('CHANGED', c)\n"
    "print('SANDBOX', os.stat('/tmp').st_dev)\n"
)
