"""Host-side isolation setup: modes, bubblewrap command lines, preflight checks, uid allocation.

Each worker is one long-lived ``bwrap`` sandbox with fresh namespaces for network, pid, mount,
ipc, uts and cgroup; its root is a read-only tmpfs holding read-only binds of the host's system
directories (``SYSTEM_DIRS``) and the interpreter's prefix, nothing else of the host (no /var,
/run or homes, so no host socket file); ``/tmp`` and ``/dev/shm`` are private size-limited tmpfs
mounts, ``/dev`` is a fresh read-only tmpfs holding only read-only binds of the device nodes
programs need and the stdio symlinks (`dev_layout`: no devpts, so no pseudo-terminal and nothing
in /dev a run can change for the next), the environment is cleared (only PYTHONHASHSEED is
set, plus LD_BIND_NOW: the zygote binds every symbol at start, so no forked child resolves, and
copies, PLT entries; the zygote drops it from the programs' environment) and the zygote runs as
pid 1 of the pid namespace. Two ways to get there:

* root mode (``bwrap-root``, chosen by ``bwrap`` when the process is root): all capabilities are
  dropped except the few the zygote needs to drop each program to a per-worker unprivileged
  uid (so RLIMIT_NPROC binds), bring loopback down, kill leftovers and wipe scratch.
* rootless mode (``bwrap-userns``, chosen by ``bwrap`` otherwise): bubblewrap creates an
  unprivileged user namespace (no setuid helper) and the zygote holds no capability at all;
  RLIMIT_NPROC counts per user namespace, so it binds per worker as well. Started by root (tests, containers), bwrap is launched as ``rootless_uid``
  (default 65534).

In both modes bubblewrap first runs a short-lived interpreter with `sandbox_dev.SETUP_CAPS` on
top, only to remount the device binds read-only (bubblewrap cannot make a read-only bind that
still allows device access); it drops them from every capability set and execs the zygote
(`seal_prefix`, `sandbox_dev.seal_dev`). Programs never hold a capability and run under
no_new_privs and the seccomp filter.
"""

from __future__ import annotations

import itertools
import json
import logging
import marshal
import os
import shutil
import subprocess
import sys
import threading

from compassplay.verifiers.sandbox import dev as sandbox_dev
from compassplay.verifiers.sandbox import seccomp as sandbox_seccomp

log = logging.getLogger(__name__)

AUTO = "bwrap"
ROOT = "bwrap-root"
ROOTLESS = "bwrap-userns"
UNSAFE_OPT_OUT = "none-UNSAFE-trusted-local-debugging-only"
ISOLATION_MODES = (AUTO, ROOT, ROOTLESS, UNSAFE_OPT_OUT)


def check_mode(mode: str) -> None:
    """ValueError unless `mode` is one of ISOLATION_MODES."""
    if mode not in ISOLATION_MODES:
        raise ValueError(
            f"isolation must be one of {ISOLATION_MODES[:-1]} or the explicit opt-out "
            f"{UNSAFE_OPT_OUT!r}, got {mode!r}"
        )
WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py")
# Loaded before the worker under their bare names inside the sandbox (the worker imports them
# from sys.modules): bare name -> this folder's module.
PRELOADED = {"sandbox_proto": "proto", "sandbox_seccomp": "seccomp", "sandbox_child": "child",
             "sandbox_scratch": "scratch", "sandbox_kernel": "kernel",
             "sandbox_startup": "zygote_startup"}
ROOT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN", "CAP_DAC_OVERRIDE",
             "CAP_FOWNER", "CAP_NET_ADMIN")
PRIVATE_DIRS = ("/tmp", "/dev")  # fresh tmpfs in every sandbox (/dev/shm is one too)
# Host directories bound read-only into every sandbox (when present); nothing else is visible
# but the interpreter's prefix.
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
ROOTLESS_INNER_ID = 1000  # uid/gid inside the user namespace (the only one mapped)
UID_BASE = 2_000_000

_uid_lock = threading.Lock()
_uid_counter = itertools.count()


class SandboxUnavailableError(RuntimeError):
    """OS isolation cannot be set up; the message says what is missing and how to fix it."""


def resolve(mode: str) -> str:
    """The concrete mode: `bwrap` means root mode when root, rootless mode otherwise."""
    if mode not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {ISOLATION_MODES}, got {mode!r}")
    if mode == AUTO:
        return ROOT if os.geteuid() == 0 else ROOTLESS
    return mode


def bootstrap_frames() -> bytes:
    """What the host writes to a new zygote's stdin before anything else: the helper modules
    (`PRELOADED`, each then importable under its bare name) and last the worker, one
    length-prefixed frame each (``name NUL marshalled code``); `LOADER` runs them in order.

    The code travels through the pipe, not as a path: the package may live under a folder the
    sandbox hides (a checkout under /tmp, which is a private tmpfs inside). Not on the command
    line either: the interpreter keeps several copies of its command line (some as 4-byte wide
    characters), about 0.9 MiB that every fork would copy and every exit unmap. And compiled
    here (the sandbox runs this very interpreter, `interpreter()`): compiling inside would leave
    the zygote's heap fragmented by the compiler's temporaries, about 0.35 MiB more to copy."""
    frames = []
    for name, module in (*PRELOADED.items(), ("sandbox_worker", "zygote")):
        body = name.encode() + b"\0" + _compiled(os.path.join(os.path.dirname(WORKER_SCRIPT),
                                                               module + ".py"))
        frames.append(len(body).to_bytes(4, "big") + body)
    return b"".join(frames)


_compiled_cache: dict[tuple[str, int, int], bytes] = {}


def _compiled(path: str) -> bytes:
    """The marshalled code object of the module source at `path` (cached per file version)."""
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _compiled_cache:
        with open(path, "rb") as f:
            code = compile(f.read(), os.path.basename(path), "exec", dont_inherit=True,
                           optimize=0)  # the zygote runs without -O
        _compiled_cache[key] = marshal.dumps(code)
    return _compiled_cache[key]


# The zygote's `python -c` source: run the frames of `bootstrap_frames` from stdin (no
# buffering: the request frames follow on the same pipe).
LOADER = r"""
import marshal, os, sys, types
def take(n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(0, n - len(buf))
        if not chunk:
            raise SystemExit("sandbox bootstrap: stdin ended early")
        buf += chunk
    return buf
while True:
    name, _, data = take(int.from_bytes(take(4), "big")).partition(b"\0")
    name = name.decode()
    code = marshal.loads(data)
    del data
    if name == "sandbox_worker":
        break
    sys.modules[name] = types.ModuleType(name)
    exec(code, sys.modules[name].__dict__)
del take, name, _
exec(code, {"__name__": "__main__"})
"""


def interpreter() -> str:
    """The real (non-venv) Python binary, run with -s -S -B inside the sandbox."""
    return os.path.realpath(sys.executable)


def allocate_uids(n: int) -> list[int]:
    """Distinct unprivileged uids, unique per process and per pool (RLIMIT_NPROC is per uid)."""
    with _uid_lock:
        block = next(_uid_counter)
    base = UID_BASE + (os.getpid() % 400_000) * 4096 + (block * 64) % 4096
    return [base + i for i in range(n)]


# ---------------------------------------------------------------------------- preflight
def preflight(mode: str, rootless_uid: int = 65534) -> str:
    """Resolve `mode` and raise SandboxUnavailableError naming whatever it lacks."""
    mode = resolve(mode)
    if mode == UNSAFE_OPT_OUT:
        return mode
    missing = []
    if shutil.which("bwrap") is None:
        missing.append("bubblewrap (bwrap) not found: apt-get install -y bubblewrap "
                       "(or `make sysdeps`)")
    if mode == ROOT and os.geteuid() != 0:
        missing.append(f"isolation={ROOT!r} must run as root (it switches each worker to its "
                       f"own uid); use {AUTO!r} or {ROOTLESS!r} as an ordinary user")
    if not sandbox_seccomp.supported():
        missing.append(f"no seccomp filter for architecture {os.uname().machine}")
    if not hasattr(os, "pidfd_open"):
        missing.append("os.pidfd_open unavailable (needs Linux >= 5.3 and Python >= 3.9)")
    if missing:
        raise SandboxUnavailableError("Python sandbox isolation unavailable: " + "; ".join(missing))
    cmd, env = spawn_command(mode, ["/bin/true"], rootless_uid=rootless_uid)
    probe = subprocess.run(cmd, env=env, capture_output=True, timeout=30, check=False, cwd="/")
    if probe.returncode != 0:
        err = probe.stderr.decode(errors="replace").strip()[:500]
        if mode == ROOTLESS:
            raise SandboxUnavailableError(userns_diagnosis(err))
        raise SandboxUnavailableError(
            f"bubblewrap cannot create namespaces (net/pid/mount/ipc/uts): {err}")
    return mode


def _sysctl(name: str) -> str | None:
    try:
        with open("/proc/sys/" + name.replace(".", "/")) as f:
            return f.read().strip()
    except OSError:
        return None


def userns_diagnosis(bwrap_error: str) -> str:
    """Why rootless bubblewrap failed, with the fix and the explicit opt-outs."""
    causes = []
    if _sysctl("kernel.unprivileged_userns_clone") == "0":
        causes.append("unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone"
                      "=0); fix: sudo sysctl -w kernel.unprivileged_userns_clone=1")
    if _sysctl("user.max_user_namespaces") == "0":
        causes.append("user.max_user_namespaces=0; fix: sudo sysctl -w "
                      "user.max_user_namespaces=15000")
    if _sysctl("kernel.apparmor_restrict_unprivileged_userns") == "1":
        causes.append(
            "AppArmor restricts unprivileged user namespaces (Ubuntu >= 23.10: "
            "kernel.apparmor_restrict_unprivileged_userns=1); fix: give bwrap a profile that "
            "allows them, e.g. printf 'abi <abi/4.0>,\\ninclude <tunables/global>\\nprofile bwrap "
            "/usr/bin/bwrap flags=(unconfined) {\\n  userns,\\n}\\n' | sudo tee "
            "/etc/apparmor.d/bwrap && sudo apparmor_parser -r /etc/apparmor.d/bwrap "
            "(or, machine-wide, sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0)")
    if not causes:
        causes.append("no known sysctl explains it (containers: allow user namespaces, e.g. "
                      "Docker --security-opt seccomp=unconfined --security-opt apparmor=unconfined)")
    return (
        "rootless Python sandbox unavailable: bubblewrap cannot create an unprivileged user "
        f"namespace ({bwrap_error or 'no error text'}). Cause: " + "; ".join(causes)
        + f". Alternatives: run as root (isolation {AUTO!r} then uses root mode), or opt out "
        f"explicitly with verifiers.isolation={UNSAFE_OPT_OUT!r} (no OS isolation; trusted "
        "local debugging only)."
    )


# ---------------------------------------------------------------------------- command lines
def _keep_paths() -> list[str]:
    """The interpreter's prefix: the only host path outside `SYSTEM_DIRS` a sandbox needs."""
    return sorted({os.path.realpath(sys.base_prefix),
                   os.path.dirname(os.path.dirname(interpreter()))})


def hidden_homes() -> list[tuple[str, list[str]]]:
    """(home, interpreter paths under it) for /root and $HOME: the launcher re-exposes these to
    the rootless sandbox's unprivileged host uid when a home is private (0700)."""
    homes = {"/root", os.path.realpath(os.path.expanduser("~"))}
    private = tuple(d + os.sep for d in PRIVATE_DIRS)  # never a source (a home under /tmp)
    out = []
    for home in sorted(h for h in homes if h and os.path.isdir(h) and h != "/"
                       and not (h + os.sep).startswith(private)):
        out.append((home, [p for p in _keep_paths() if p.startswith(home + os.sep)]))
    return out


def system_binds() -> list[str]:
    """Read-only binds of the host's system directories (symlinks such as /bin -> usr/bin are
    recreated as symlinks), then of the interpreter's prefix wherever it lives (parents created
    0755 so the programs' uid can traverse them). Nothing else of the host is visible: no
    /var, /run, /home, /srv, /mnt, no other socket file."""
    args: list[str] = []
    for name in SYSTEM_DIRS:
        path = "/" + name
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    bound = tuple(f"/{name}/" for name in SYSTEM_DIRS)
    for path in _keep_paths():
        if (path + "/").startswith(bound):
            continue
        parts = path.strip("/").split("/")
        for i in range(1, len(parts)):
            args += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
        args += ["--ro-bind", path, path]
    return args


def dev_layout() -> list[str]:
    """bwrap arguments for /dev: a fresh tmpfs (read-only once `bwrap_prefix` has mounted
    /dev/shm on it) with the device nodes of `sandbox_dev.DEV_NODES` bound from the host
    (made read-only before the zygote starts: `seal_prefix`) and the symlinks fd,
    stdin, stdout and stderr into /proc/self/fd. No devpts (/dev/pts, /dev/ptmx): no
    pseudo-terminals, each of which holds kernel buffers no limit here counts; no /dev/tty:
    programs have no controlling terminal."""
    args = ["--perms", "0755", "--tmpfs", "/dev"]
    for name in sandbox_dev.DEV_NODES:
        args += ["--dev-bind", "/dev/" + name, "/dev/" + name]
    args += ["--symlink", "/proc/self/fd", "/dev/fd"]
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        args += ["--symlink", f"/proc/self/fd/{fd}", "/dev/" + name]
    return args


def bwrap_prefix(mode: str, tmpfs_mb: int = 64, hash_seed: int = 0) -> list[str]:
    """bwrap arguments up to (not including) the command. The root and /dev are read-only
    tmpfs mounts; the only writable places are /tmp and /dev/shm, each a tmpfs of `tmpfs_mb` MiB
    (whose use the zygote also counts toward each run's memory limit)."""
    args = ["bwrap"]
    if mode == ROOTLESS:
        args += ["--unshare-user", "--uid", str(ROOTLESS_INNER_ID),
                 "--gid", str(ROOTLESS_INNER_ID)]
    size = str(tmpfs_mb * 1024 * 1024)
    args += [
        "--unshare-ipc", "--unshare-pid", "--as-pid-1", "--unshare-net", "--unshare-uts",
        "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv",
        "--setenv", "PYTHONHASHSEED", str(hash_seed), "--setenv", "LD_BIND_NOW", "1",
        "--hostname", "sandbox",
        *system_binds(),
        *dev_layout(), "--proc", "/proc",
        "--perms", "1777", "--size", size, "--tmpfs", "/tmp",
        "--perms", "1777", "--size", size, "--tmpfs", "/dev/shm",
        "--remount-ro", "/dev",  # rootless: its entries belong to the programs' uid
        "--remount-ro", "/",
    ]
    args += ["--cap-drop", "ALL"]
    for cap in (*(ROOT_CAPS if mode == ROOT else ()), *sandbox_dev.SETUP_CAPS):
        args += ["--cap-add", cap]
    return args + ["--chdir", "/tmp", "--"]


_seal_source_cache: dict[tuple[int, int], str] = {}


def seal_prefix() -> list[str]:
    """The command every sandbox runs first, ahead of its real command line: an interpreter
    that seals /dev and execs the rest (`sandbox_dev.main`). Its source travels in argv: it
    is a few KiB, and the process is gone (exec'd) before the zygote starts."""
    st = os.stat(sandbox_dev.__file__)
    key = (st.st_mtime_ns, st.st_size)
    if key not in _seal_source_cache:
        with open(sandbox_dev.__file__, encoding="utf-8") as f:
            _seal_source_cache[key] = f.read() + "\nmain()\n"
    return [interpreter(), "-I", "-S", "-B", "-c", _seal_source_cache[key]]


def zygote_argv(cfg: dict) -> list[str]:
    """The zygote's interpreter command line (no -I/-E: PYTHONHASHSEED must be honoured; the
    environment is cleared around it). Its code follows on stdin: `bootstrap_frames`."""
    return [interpreter(), "-s", "-S", "-B", "-c", LOADER, json.dumps(cfg)]


def spawn_command(mode: str, argv: list[str], *, tmpfs_mb: int = 64, hash_seed: int = 0,
                  rootless_uid: int = 65534, cgroup: str | None = None
                  ) -> tuple[list[str], dict[str, str]]:
    """(command, environment) that runs `argv` in a sandbox of `mode` (already resolved)."""
    if mode == UNSAFE_OPT_OUT:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONHASHSEED": str(hash_seed),
               "LD_BIND_NOW": "1"}
        return argv, env
    cmd = bwrap_prefix(mode, tmpfs_mb, hash_seed) + seal_prefix() + argv
    drop = mode == ROOTLESS and os.geteuid() == 0
    if not drop and cgroup is None:
        return cmd, {}
    spec = {"cgroup": cgroup, "uid": rootless_uid if drop else None,
            "homes": hidden_homes() if drop else []}
    return [interpreter(), "-I", "-S", "-c", LAUNCHER, json.dumps(spec)] + cmd, {}


# Runs as the host user (root when `uid` is set): join the worker's cgroup, and when root starts
# a rootless sandbox, drop to `uid` in a private mount namespace where the interpreter stays
# reachable (a 0700 home of root is replaced by a 0755 tmpfs with the interpreter bound back).
LAUNCHER = r"""
import ctypes, json, os, sys
spec = json.loads(sys.argv[1])
argv = sys.argv[2:]
if spec["cgroup"]:
    with open(os.path.join(spec["cgroup"], "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
if spec["uid"] is not None:
    libc = ctypes.CDLL(None, use_errno=True)
    def check(rc, what):
        if rc != 0:
            raise OSError(ctypes.get_errno(), what)
    check(libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")
    check(libc.mount(None, b"/", None, 0x4000 | 0x40000, None), "make / private")
    fds = {p: os.open(p, os.O_PATH) for _, keep in spec["homes"] for p in keep}
    for home, keep in spec["homes"]:
        check(libc.mount(b"tmpfs", home.encode(), b"tmpfs", 0x2 | 0x4, b"mode=0755"), "tmpfs")
        for p in keep:
            os.makedirs(p, 0o755, exist_ok=True)
            src = f"/proc/self/fd/{fds[p]}".encode()
            check(libc.mount(src, p.encode(), None, 0x1000 | 0x4000, None), "bind " + p)
    os.setgroups([])
    os.setgid(spec["uid"])
    os.setuid(spec["uid"])
os.execvp(argv[0], argv)
"""


def warn_unsafe() -> None:
    """Loud warning logged on every start of an unisolated pool."""
    log.warning(
        "PythonSandbox started with isolation=%r: programs run WITHOUT OS isolation "
        "(host filesystem, network and environment are exposed). Trusted local debugging only.",
        UNSAFE_OPT_OUT,
    )
