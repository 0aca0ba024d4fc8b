"""Host-side isolation setup: bubblewrap command lines, preflight checks, uid allocation.

Each worker is one long-lived ``bwrap`` sandbox with fresh user-visible namespaces for
network, pid, mount, ipc, uts and cgroup; the host root is bind-mounted read-only, ``/tmp``,
``/run`` and the host home are private tmpfs mounts, the environment is cleared and all
capabilities are dropped except the few the in-sandbox zygote needs to drop to an
unprivileged uid, bring loopback down, account children's memory (SYS_PTRACE is needed only
to read /proc/<pid>/smaps_rollup of non-dumpable children), kill leftovers and wipe scratch. The program itself never holds a
capability (setuid from 0 to a non-zero uid clears them) and runs under no_new_privs.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import threading

from compassplay.verifiers import sandbox_seccomp

log = logging.getLogger(__name__)

UNSAFE_OPT_OUT = "none-UNSAFE-trusted-local-debugging-only"
ISOLATION_MODES = ("bwrap", UNSAFE_OPT_OUT)
WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_worker.py")
SECCOMP_SCRIPT = os.path.join(os.path.dirname(WORKER_SCRIPT), "sandbox_seccomp.py")


def worker_bootstrap() -> str:
    """`python -c` source that runs the zygote with its seccomp module preloaded.

    The code travels on the command line, not as a path: the package may live under a folder
    the sandbox hides (a checkout under /tmp, which is a private tmpfs inside)."""
    with open(SECCOMP_SCRIPT) as f:
        seccomp = f.read()
    with open(WORKER_SCRIPT) as f:
        worker = f.read()
    return (
        "import sys, types\n"
        "m = types.ModuleType('sandbox_seccomp')\n"
        f"exec(compile({seccomp!r}, 'sandbox_seccomp.py', 'exec'), m.__dict__)\n"
        "sys.modules['sandbox_seccomp'] = m\n"
        f"exec(compile({worker!r}, 'sandbox_worker.py', 'exec'), {{'__name__': '__main__'}})\n"
    )
ZYGOTE_CAPS = (
    "CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER",
    "CAP_NET_ADMIN", "CAP_SYS_PTRACE",
)
UID_BASE = 2_000_000

_uid_lock = threading.Lock()
_uid_counter = itertools.count()


class SandboxUnavailableError(RuntimeError):
    """OS isolation cannot be set up; the message says what is missing and how to fix it."""


def interpreter() -> str:
    """The real (non-venv) Python binary, run with -I -S inside the sandbox."""
    return os.path.realpath(sys.executable)


def allocate_uids(n: int) -> list[int]:
    """Distinct unprivileged uids, unique per process and per pool (RLIMIT_NPROC is per uid)."""
    with _uid_lock:
        block = next(_uid_counter)
    base = UID_BASE + (os.getpid() % 400_000) * 4096 + (block * 64) % 4096
    return [base + i for i in range(n)]


def preflight(mode: str) -> None:
    """Raise SandboxUnavailableError naming whatever the requested isolation lacks."""
    if mode == UNSAFE_OPT_OUT:
        return
    if mode != "bwrap":
        raise ValueError(f"isolation must be one of {ISOLATION_MODES}, got {mode!r}")
    missing = []
    if shutil.which("bwrap") is None:
        missing.append("bubblewrap (bwrap) not found: apt-get install -y bubblewrap")
    if os.geteuid() != 0:
        missing.append(
            "must run as root (the in-sandbox zygote needs CAP_SETUID to drop each program "
            "to a distinct unprivileged uid so RLIMIT_NPROC binds)"
        )
    if not sandbox_seccomp.supported():
        missing.append(f"no seccomp filter for architecture {os.uname().machine}")
    if not hasattr(os, "pidfd_open"):
        missing.append("os.pidfd_open unavailable (needs Linux >= 5.3 and Python >= 3.9)")
    if missing:
        raise SandboxUnavailableError("Python sandbox isolation unavailable: " + "; ".join(missing))
    probe = subprocess.run(
        bwrap_prefix() + ["--", "/bin/true"], capture_output=True, timeout=30, check=False
    )
    if probe.returncode != 0:
        raise SandboxUnavailableError(
            "bubblewrap cannot create namespaces (net/pid/mount/ipc/uts): "
            + probe.stderr.decode(errors="replace").strip()[:500]
        )


def _hidden_home_binds() -> list[str]:
    """Hide /root and $HOME behind tmpfs, re-exposing the interpreter's prefix if inside."""
    args: list[str] = []
    homes = {"/root", os.path.expanduser("~")}
    keep = {
        os.path.realpath(sys.base_prefix),
        os.path.dirname(os.path.dirname(interpreter())),
        os.path.dirname(WORKER_SCRIPT),
    }
    for home in sorted(h for h in homes if h and os.path.isdir(h) and h != "/"):
        args += ["--perms", "0755", "--tmpfs", home]
        for path in sorted(keep):
            if path.startswith(home + os.sep):
                parts = os.path.relpath(path, home).split(os.sep)
                for i in range(1, len(parts)):  # bwrap would create these 0700
                    args += ["--perms", "0755", "--dir", os.path.join(home, *parts[:i])]
                args += ["--ro-bind", path, path]
    return args


def bwrap_prefix(tmpfs_mb: int = 64) -> list[str]:
    """bwrap arguments up to (not including) the command."""
    args = [
        "bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
        "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv",
        "--hostname", "sandbox",
        "--ro-bind", "/", "/",
        "--dev", "/dev", "--proc", "/proc",
        "--perms", "1777", "--size", str(tmpfs_mb * 1024 * 1024), "--tmpfs", "/tmp",
        "--perms", "0755", "--tmpfs", "/run",
        "--perms", "0755", "--tmpfs", "/var/tmp",
    ]
    args += _hidden_home_binds()
    args += ["--cap-drop", "ALL"]
    for cap in ZYGOTE_CAPS:
        args += ["--cap-add", cap]
    return args


def worker_command(mode: str, cfg: dict, tmpfs_mb: int) -> list[str]:
    """Full command line that starts one zygote."""
    zygote = [interpreter(), "-I", "-S", "-B", "-c", worker_bootstrap(), json.dumps(cfg)]
    if mode == UNSAFE_OPT_OUT:
        return zygote
    return bwrap_prefix(tmpfs_mb) + ["--chdir", "/tmp", "--"] + zygote


def warn_unsafe() -> None:
    """Loud warning logged on every start of an unisolated pool."""
    log.warning(
        "PythonSandbox started with isolation=%r: programs run WITHOUT OS isolation "
        "(host filesystem, network and environment are exposed). Trusted local debugging only.",
        UNSAFE_OPT_OUT,
    )
