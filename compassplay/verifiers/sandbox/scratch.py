"""The writable places of one sandbox, made fresh for every run (stdlib only; loaded inside the
sandbox by the bootstrap, see `isolation.bootstrap_frames`).

Inside a sandbox the only writable places are the tmpfs mounts `/tmp` and `/dev/shm` (the
"roots"). After every run `Scratch.reset` checks whether the run touched them: the scratch
directory and both roots keep their inode, mode, owner, link count and access, modify and
change times (a new or removed entry, a chmod, utime or extended attribute all move the change
time). If anything moved, it empties both roots, creates a new scratch directory (a new inode:
no extended attribute, timestamp or mode an earlier run set on it survives) and puts the roots'
own mode, timestamps and extended attributes back as they were when the worker started
(rootless mode: programs share the roots' owner uid, so they can change those). It returns False
when that cannot be done (then the worker retires and the host starts a fresh one).

`held_bytes` is what the run keeps in the roots (file blocks plus about `INODE_BYTES` per
inode): tmpfs memory that no process's RSS shows, counted toward the run's memory limit.
"""

from __future__ import annotations

import os
import stat
import time

INODE_BYTES = 1024   # kernel memory per tmpfs inode and dentry, about (bytes)
WIPE_BUDGET_S = 1.0  # a tree that takes longer to remove retires the worker instead (seconds)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Scratch:
    """Resets `roots` and the scratch directory `roots[0]/work` between runs."""

    def __init__(self, roots: tuple[str, ...], uid: int | None, gid: int,
                 count_bytes: bool = True, wipe_budget_s: float = WIPE_BUDGET_S) -> None:
        self.roots = roots
        self.wipe_budget_s = wipe_budget_s
        self.path = os.path.join(roots[0], "work")
        self.uid, self.gid = uid, gid
        self.count_bytes = count_bytes
        self._saved = {root: self._attrs(root) for root in roots}
        self._base = 0
        self._sigs: list[tuple[int, ...]] | None = None  # of scratch and roots after a reset
        self.fresh = self.reset()
        self._base = self._used() if count_bytes else 0

    @staticmethod
    def _attrs(root: str) -> tuple[int, int, int, list[str]]:
        st = os.lstat(root)
        return (stat.S_IMODE(st.st_mode), st.st_atime_ns, st.st_mtime_ns,
                sorted(x for x in os.listxattr(root) if not x.startswith("user.")))

    def _signature(self) -> list[tuple[int, ...]]:
        out = []
        for path in (self.path, *self.roots):
            st = os.lstat(path)
            out.append((st.st_ino, st.st_mode, st.st_uid, st.st_nlink, st.st_atime_ns,
                        st.st_mtime_ns, st.st_ctime_ns))
        return out

    def touched(self) -> bool:
        """True unless the scratch dir and the roots are exactly as the last reset left them."""
        try:
            return self._sigs is None or self._signature() != self._sigs
        except OSError:
            return True

    def reset(self, touched: bool | None = None) -> bool:
        """Empty the roots, restore their attributes, create a fresh scratch dir (nothing to do
        when the run touched none of it: `touched`, or `touched()` when None); False if any of
        it fails or takes longer than `wipe_budget_s`."""
        if not (self.touched() if touched is None else touched):
            return True
        self._sigs = None
        try:
            try:
                os.rmdir(self.path)  # the common case: the run left its scratch dir empty
            except OSError:
                pass  # gone, not empty, locked or replaced: the full wipe below
            deadline = time.monotonic() + self.wipe_budget_s
            for root in self.roots:
                mode, atime, mtime, others = self._saved[root]
                os.chmod(root, mode)
                if os.listdir(root):
                    clear_dir(root, deadline)
                    if os.listdir(root):
                        return False
                xattrs = os.listxattr(root)
                for name in xattrs:
                    if name.startswith("user."):
                        os.removexattr(root, name)
                if sorted(x for x in xattrs if not x.startswith("user.")) != others:
                    return False
                if root != self.roots[0]:
                    os.utime(root, ns=(atime, mtime))
            os.mkdir(self.path, 0o700)
            if self.uid is not None:
                os.chown(self.path, self.uid, self.gid)
            _, atime, mtime, _ = self._saved[self.roots[0]]
            os.utime(self.roots[0], ns=(atime, mtime))
            self._sigs = self._signature()
            return True
        except OSError:
            return False

    def _used(self) -> int:
        total = 0
        for root in self.roots:
            st = os.statvfs(root)
            total += ((st.f_blocks - st.f_bfree) * st.f_frsize
                      + (st.f_files - st.f_ffree) * INODE_BYTES)
        return total

    def held_bytes(self, touched: bool | None = None) -> int:
        """Bytes the current run holds in the roots beyond their empty state (0 if not counted;
        `touched` as for `reset`)."""
        if not self.count_bytes or not (self.touched() if touched is None else touched):
            return 0
        try:
            return max(0, self._used() - self._base)
        except OSError:
            return 0


def _scan(fd: int) -> list[str]:
    """Unlink every non-directory in the directory `fd`; the names of its subdirectories."""
    dirs, files = [], []
    with os.scandir(fd) as it:
        for entry in it:
            (dirs if entry.is_dir(follow_symlinks=False) else files).append(entry.name)
    for name in files:
        os.unlink(name, dir_fd=fd)
    return dirs


def clear_dir(path: str, deadline: float) -> None:
    """Remove everything inside `path` without path names or recursion: one directory fd at a
    time (moving down by name, up by ".."), so neither PATH_MAX nor the interpreter's recursion
    limit nor RLIMIT_NOFILE bounds the depth. Raises OSError on failure or after `deadline`
    (time.monotonic() seconds). Only call it while no program runs in the sandbox."""
    cur = os.open(path, _DIR_FLAGS)
    try:
        names: list[str] = []                 # from `path` down to `cur`
        pending: list[list[str]] = [_scan(cur)]  # subdirectories still to empty, per level
        steps = 0
        while True:
            steps += 1
            if steps % 256 == 0 and time.monotonic() > deadline:
                raise TimeoutError("scratch tree too large to remove in time")
            if pending[-1]:
                name = pending[-1].pop()
                os.chmod(name, 0o700, dir_fd=cur)  # a program may have locked it (chmod 0)
                child = os.open(name, _DIR_FLAGS, dir_fd=cur)
                os.close(cur)
                cur = child
                names.append(name)
                pending.append(_scan(cur))
                continue
            pending.pop()
            if not names:
                return
            parent = os.open("..", _DIR_FLAGS, dir_fd=cur)
            os.close(cur)
            cur = parent
            os.rmdir(names.pop(), dir_fd=cur)
    finally:
        os.close(cur)
