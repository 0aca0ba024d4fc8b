"""Hostile programs: each must end with the expected status and leave the host unchanged.

Every test here runs in root mode and in rootless mode (see conftest). Statuses other than
ok/error are the supervisor's observations, so a program cannot fake them with an exit code.
`pytest -s` prints one "ATTACK <mode> <name> <status> (allowed: ...)" line per attack: the table.
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import compassplay
from compassplay.verifiers.sandbox import seccomp as sandbox_seccomp
from compassplay.verifiers.sandbox.isolation import ROOT, ROOTLESS
from compassplay.verifiers.sandbox.pool import PythonSandbox
from tests.verifiers.sandbox_helpers import (
    DEV_ATTACK,
    HOST_SECRET,
    descendants,
    dir_state,
    leftovers,
    processes_of,
)

ANY_FAIL = ("error", "timeout", "killed", "memory")
# 150 MB of touched RSS (below the 75% peak rule) plus up to 8 x 15 MB of files in /tmp and
# /dev/shm: over the 256 MB limit only together.
TMPFS_FILL = (
    "import os\nheld = b'x' * (150 * 2**20)\nchunk = b'y' * (15 * 2**20)\n"
    "for i in range(8):\n    try:\n"
    "        open(f\"{'/tmp' if i < 4 else '/dev/shm'}/f{i}\", 'wb').write(chunk)\n"
    "    except OSError:\n        pass\n"
)
HELD_TOO_MUCH = ("memory", "timeout")  # never "ok" (timeout: writing 270 MB on a loaded machine)
_NRS = sandbox_seccomp._ARCHES.get(platform.machine(), {})
# (syscall number, args): fsopen, fspick, open_tree, move_mount, fsconfig, fsmount,
# mount_setattr, syslog(SIZE_BUFFER), open_by_handle_at; each must fail with EPERM.
MOUNT_API_CALLS = [(_NRS.get(name, -1), args) for name, args in (
    ("fsopen", (b"tmpfs", 0)), ("fspick", (-100, b"/tmp", 0)), ("open_tree", (-100, b"/tmp", 1)),
    ("move_mount", (-100, b"/tmp", -100, b"/dev/shm", 0)), ("fsconfig", (3, 6, None, None, 0)),
    ("fsmount", (3, 0, 0)), ("mount_setattr", (-100, b"/tmp", 0, None, 32)),
    ("syslog", (10, None, 0)), ("open_by_handle_at", (-100, None, 0)))]


@dataclass(frozen=True)
class Attack:
    name: str
    code: str
    statuses: tuple[str, ...]
    stdout_has: str | None = None
    stdout_rootless: str | None = None  # where rootless mode legitimately differs
    stderr_has: str | None = None


ATTACKS = [
    Attack("fork_bomb", "import os\nwhile True:\n    try:\n        os.fork()\n"
           "    except OSError:\n        pass", ("timeout", "error", "killed", "memory")),
    Attack("shell_fork_bomb", "import os\nos.system('f(){ f|f& };f')\nprint('launched')",
           ("ok", "timeout", "error"), None),
    # Refused by RLIMIT_AS before any memory is used: a plain MemoryError, i.e. "error".
    Attack("memory_bomb", "x = bytearray(10**10)", ("error",), stderr_has="MemoryError"),
    Attack("memory_bomb_incremental", "xs = []\nwhile True:\n    xs.append(bytearray(10**7))",
           ("error", "memory"), stderr_has="MemoryError"),
    # Really holds its memory: the kernel-measured peak makes it "memory".
    Attack("memory_bomb_touched", "xs = []\nwhile True:\n    xs.append(b'x' * 10**7)",
           ("memory",)),
    Attack("memory_bomb_children",
           "import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n"
           "        b = b'x' * (120 * 2**20)\n        time.sleep(30)\ntime.sleep(30)",
           ("memory",)),
    Attack("infinite_loop", "while True:\n    pass", ("timeout",)),
    Attack("loop_ignoring_signals",
           "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM,"
           " signal.SIGHUP, signal.SIGXCPU):\n    signal.signal(s, signal.SIG_IGN)\n"
           "while True:\n    pass", ("timeout",)),
    Attack("loop_blocking_signals",
           "import signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, set(signal.Signals))\n"
           "while True:\n    pass", ("timeout",)),
    Attack("sleep_forever", "import time\ntime.sleep(3600)", ("timeout",)),
    Attack("spin_in_c_regex", "import re\nre.match(r'(a+)+$', 'a' * 40 + 'b')", ("timeout",)),
    Attack("os_system_writes_host",
           "import os\nprint(os.system('echo pwned > @TMP_SENTINEL@/victim.txt;"
           " echo pwned > /root/pwned_sys; touch /etc/pwned_sys') != 0)", ("ok",), "True"),
    Attack("subprocess_escape",
           "import subprocess\nr = subprocess.run(['sh', '-c', 'rm -f @HOME_SENTINEL@;"
           " echo x > /work/pwned_sub'], capture_output=True)\nprint(r.returncode != 0)",
           ("ok",), "True"),
    Attack("ctypes_setuid_root",
           "import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.setuid(0), libc.setgid(0))",
           ("ok",), "-1 -1"),
    Attack("ctypes_segfault", "import ctypes\nctypes.string_at(0)", ("killed",)),
    Attack("ctypes_unshare_userns",
           "import ctypes\nprint(ctypes.CDLL(None).unshare(0x10000000))", ("ok",), "-1"),
    Attack("write_tmp", "open('/tmp/pwned_tmp', 'w').write('x')\nimport os\n"
           "print(os.path.exists('/tmp/pwned_tmp'))", ("ok",), "True"),
    Attack("write_home_and_host_paths",
           "import os\nopen(os.path.expanduser('~/pwned_home'), 'w').write('x')\n"
           "for p in ('/root/pwned_root', '/etc/pwned_etc', '@TMP_SENTINEL@/victim.txt'):\n"
           "    try:\n        open(p, 'w').write('x')\n        print('WROTE', p)\n"
           "    except OSError as e:\n        print('denied', e.errno)", ("ok",), "denied"),
    Attack("delete_host_files",
           "import os, shutil\nfor p in ('@HOME_SENTINEL@', '@TMP_SENTINEL@/keep.txt'):\n"
           "    try:\n        os.remove(p)\n    except OSError:\n        pass\n"
           "shutil.rmtree('@PACKAGE_DIR@', ignore_errors=True)",
           ("ok",)),  # the host's package dir must survive (checked below for every attack)
    Attack("read_environment",
           "import os\nprint(sorted(os.environ), open('/proc/1/environ', 'rb').read())",
           ("error",)),
    Attack("socket_loopback",
           "import socket\ns = socket.create_connection(('127.0.0.1', @PORT@), timeout=1)\n"
           "print('CONNECTED')", ("error",)),
    Attack("socket_remote",
           "import socket\ns = socket.create_connection(('192.0.2.1', 80), timeout=1)\n"
           "print('CONNECTED')", ("error",)),
    Attack("udp_loopback",
           "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
           "s.sendto(b'x', ('127.0.0.1', @PORT@))", ("error",)),
    Attack("socket_via_shell",
           "import subprocess\nr = subprocess.run(['bash', '-c', 'echo hi > /dev/tcp/127.0.0.1/@PORT@"
           " && echo CONNECTED'], capture_output=True, text=True)\nprint(r.stdout or 'failed')",
           ("ok",), "failed"),
    # Root mode: the zygote is another uid. Rootless: it is pid 1 without signal handlers, so
    # the kernel drops the signals (the pool-intact checks below prove it survived).
    Attack("kill_parent",
           "import os, signal\nfor pid in (os.getppid(), 1):\n    try:\n"
           "        os.kill(pid, signal.SIGKILL)\n        print('sent')\n"
           "    except PermissionError:\n        print('denied')", ("ok",), "denied\ndenied",
           stdout_rootless="sent\nsent"),
    Attack("signal_zygote_with_handler_signals",
           "import os, signal\nfor s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):\n"
           "    try:\n        os.kill(1, s)\n    except PermissionError:\n        pass\nprint('done')",
           ("ok",), "done"),
    Attack("kill_everything",
           "import os\ntry:\n    os.kill(-1, 9)\nexcept ProcessLookupError:\n    pass\n"
           "print('survived')", ("ok",), "survived"),
    Attack("zygote_memory_via_proc", "open('/proc/1/mem', 'rb').read(1)", ("error",)),
    Attack("zygote_fds_via_proc", "import os\nprint(os.listdir('/proc/1/fd'))", ("error",)),
    # Statuses cannot be forged.
    Attack("fake_memory_exit_code", "import os\nos._exit(113)", ("error",)),
    Attack("fake_memory_error", "raise MemoryError", ("error",)),
    Attack("fake_timeout_signal", "import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)",
           ("killed",)),
    Attack("fake_output_limit_exit", "import sys\nsys.exit(124)", ("error",)),
    Attack("huge_output", "print('x' * 10**8)", ("output_limit",)),
    Attack("endless_output", "import sys\nwhile True:\n    sys.stdout.write('y' * 1000)",
           ("output_limit",)),
    Attack("huge_stderr", "import sys\nsys.stderr.write('e' * 10**7)", ("output_limit",)),
    Attack("deep_recursion",
           "import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1)\nf(0)",
           ANY_FAIL),
    Attack("sys_exit_zero", "print('bye')\nimport sys\nsys.exit(0)", ("ok",), "bye"),
    Attack("sys_exit_nonzero", "import sys\nsys.exit(3)", ("error",)),
    Attack("os_exit", "import os\nprint('x', flush=True)\nos._exit(0)", ("ok",), "x"),
    Attack("os_exit_nonzero", "import os\nos._exit(7)", ("error",)),
    Attack("thread_outlives",
           "import threading, time\ndef spin():\n    while True:\n"
           "        open('/tmp/from_thread', 'w').write('x')\n        time.sleep(0.01)\n"
           "threading.Thread(target=spin, daemon=True).start()\nprint('main done')",
           ("ok",), "main done"),
    Attack("daemon_child_outlives",
           "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
           "        time.sleep(0.3)\n        open('/tmp/from_daemon', 'w').write('x')\n"
           "        time.sleep(60)\n    os._exit(0)\nprint('parent done')", ("ok",), "parent done"),
    Attack("raise_rlimits",
           "import resource\nresource.setrlimit(resource.RLIMIT_NPROC, (10**6, 10**6))",
           ("error",)),
    Attack("proc_snooping",
           "import os\npids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
           "print(len(pids), str(@HOST_PID@) in pids)\nopen('/proc/1/environ').read()",
           ("error",), "2 False"),
    Attack("file_size_bomb", "open('big', 'wb').write(b'x' * (64 * 2**20))", ("error",)),
    Attack("fd_exhaustion", "fs = [open('/dev/null') for _ in range(100000)]", ("error",)),
    Attack("sysv_shm_persist",
           "import ctypes\nprint(ctypes.CDLL(None).shmget(0x1234, 4096, 0o1000 | 0o666))",
           ("ok",), "-1"),
    Attack("locked_scratch_dir",
           "import os\nos.makedirs('a/b')\nopen('a/b/f', 'w').write('x')\nos.chmod('a/b', 0)\n"
           "os.chmod('a', 0)\nos.chmod('.', 0)", ("ok",)),
    # --- issue 25: memory outside the limit (the pool's limit is 256 MB, tmpfs 64 MiB each)
    Attack("memfd_fallocate",  # 70 x 15 MB (each below RLIMIT_FSIZE): 1 GiB that no RSS shows
           "import os\nfds = [os.memfd_create('x') for _ in range(70)]\n"
           "for fd in fds:\n    os.posix_fallocate(fd, 0, 15 * 2**20)\n"
           "print('HELD')\nimport time\ntime.sleep(0.5)", ("error", "memory")),
    Attack("tmpfs_files_plus_rss_held",  # the watchdog counts files in /tmp and /dev/shm
           TMPFS_FILL + "import time\ntime.sleep(0.5)\nprint('HELD')", HELD_TOO_MUCH),
    Attack("tmpfs_files_plus_rss_at_exit",  # ends before the watchdog's first look
           TMPFS_FILL + "print('HELD')", HELD_TOO_MUCH),
    Attack("socket_buffers",  # 8 processes x 120 socket pairs with full buffers: ~250 MB of kernel
           "import os, socket, time\ntry:\n"
           "    socket.socket(socket.AF_UNIX).setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2**22)\n"
           "    print('CHANGED sndbuf')\nexcept OSError:\n    pass\n"
           "def hold():\n    pairs = []\n    for _ in range(120):\n        a, b = socket.socketpair()\n"
           "        a.setblocking(False)\n        try:\n            while True:\n"
           "                a.send(b'x' * 65536)\n        except BlockingIOError:\n            pass\n"
           "        pairs.append((a, b))\n    return pairs\nfor _ in range(7):\n"
           "    if os.fork() == 0:\n        p = hold()\n        time.sleep(5)\n        os._exit(0)\n"
           "p = hold()\ntime.sleep(1)\nprint('HELD')", HELD_TOO_MUCH),
    Attack("pipe_buffers",  # 8 x 240 full pipes (~70 MiB under the kernel's per-user soft limit)
           # and 200 MB of RSS: over the 256 MB limit only together (fork first: shared pages
           # would count in every child)
           "import os, time\ndef hold():\n    ends = []\n    for _ in range(240):\n"
           "        r, w = os.pipe()\n        os.set_blocking(w, False)\n        try:\n"
           "            while True:\n                os.write(w, b'x' * 65536)\n"
           "        except BlockingIOError:\n            pass\n        os.close(r)\n"
           "        ends.append(w)\n    return ends\nfor _ in range(7):\n    if os.fork() == 0:\n"
           "        e = hold()\n        time.sleep(5)\n        os._exit(0)\n"
           "e = hold()\nheld = b'x' * (200 * 10**6)\ntime.sleep(1)\nprint('HELD')", HELD_TOO_MUCH),
    Attack("pipe_growth_and_epoll_refused",  # asyncio and subprocess fall back to poll
           "import asyncio, fcntl, os, select, subprocess\nr, w = os.pipe()\ntry:\n"
           "    fcntl.fcntl(w, 1031, 2**20)\n    print('CHANGED pipe size')\nexcept OSError:\n"
           "    print('setpipe denied')\ntry:\n    select.epoll()\n    print('CHANGED epoll')\n"
           "except OSError:\n    print('epoll denied')\nasync def main():\n"
           "    await asyncio.sleep(0.01)\n    return 'asyncio ok'\nprint(asyncio.run(main()))\n"
           "print(subprocess.run(['echo', 'child ok'], capture_output=True, text=True).stdout)",
           ("ok",), "setpipe denied\nepoll denied\nasyncio ok\nchild ok"),
    Attack("open_pseudo_terminals",  # each pty pair holds up to ~68 KB of kernel buffers
           "import os\nptys = []\ntry:\n    for _ in range(100):\n        ptys.append(os.openpty())\n"
           "    print('HELD', len(ptys))\nexcept OSError:\n    print('denied', len(ptys))",
           ("ok",), "denied 0"),
    Attack("write_other_tmpfs",
           "import os\nfor d in ('/run', '/var/tmp', '/dev', '/', '/etc'):\n    try:\n"
           "        open(os.path.join(d, 'leftover'), 'wb').write(b'x' * 2**20)\n"
           "        print('WROTE', d)\n    except OSError as e:\n        print('denied', e.errno)",
           ("ok",), "denied"),
    # --- issue 34: every entry of /dev (test_sandbox_dev checks the next runs see it unchanged)
    Attack("change_dev_entries", DEV_ATTACK, ("ok",), "paths"),
    # --- issue 25: host unix sockets (one under /var/lib, one in the visible /etc)
    Attack("host_dirs_visible",  # only system directories and the interpreter are mounted
           "import os\nprint([p for p in ('/var/lib', '/run', '/home', '/work', '/srv', '/mnt',"
           " '/sys', '@TMP_SENTINEL@') if os.path.exists(p)])", ("ok",), "[]"),
    Attack("unix_connect_host_socket",
           "import socket\nfor p in ('@UNIX_VAR@', '@UNIX_ETC@'):\n    try:\n"
           "        s = socket.socket(socket.AF_UNIX)\n        s.connect(p)\n        s.send(b'x')\n"
           "        print('CONNECTED', p)\n    except OSError as e:\n        print('denied', e.errno)",
           ("ok",), "denied"),
    Attack("unix_dgram_to_host_socket",
           "import socket\ntry:\n    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
           "    s.sendto(b'x', '@UNIX_DGRAM@')\n    print('CONNECTED')\nexcept OSError as e:\n"
           "    print('denied', e.errno)\ntry:\n"
           "    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
           "    a.sendto(b'x', '@UNIX_DGRAM@')\n    print('CONNECTED')\nexcept OSError as e:\n"
           "    print('denied', e.errno)", ("ok",), "denied"),
    Attack("unix_socketpair_stream_works",  # what multiprocessing's pipes use stays usable
           "import multiprocessing as mp\na, b = mp.Pipe()\na.send([1, 2])\nprint(b.recv())",
           ("ok",), "[1, 2]"),
    # --- issue 25: state that breaks later runs (checked by the probes after every attack)
    Attack("tree_deeper_than_path_max",
           "import os\nfor _ in range(40):\n    os.mkdir('a' * 200)\n    os.chdir('a' * 200)\n"
           "open('f', 'w').write('x')\nprint(len(os.getcwd()))", ("ok",)),
    Attack("tree_deeper_than_recursion_limit",
           "import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\n"
           "os.chmod('.', 0)\nprint('deep')", ("ok",), "deep"),
    Attack("break_mount_roots",
           "import os\nfor what, f in (('xattr', lambda p: os.setxattr(p, 'user.leak', b'1')),\n"
           "        ('utime', lambda p: os.utime(p, (1, 1))), ('chmod', lambda p: os.chmod(p, 0)),\n"
           "        ('rmdir', os.rmdir)):\n    for p in ('/tmp', '/dev/shm'):\n        try:\n"
           "            f(p)\n        except OSError:\n            pass\n"
           "for p in ('/dev/stdout', '/dev/null', '/dev/shm'):\n    try:\n        os.unlink(p)\n"
           "        os.symlink('/proc/self/fd/0', p)\n    except OSError:\n        pass\nprint('done')",
           ("ok",), "done"),
    Attack("change_zygote_limits_and_scheduling",
           "import os, resource, ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
           "def attempt(name, f):\n    try:\n        r = f()\n    except OSError:\n        r = -1\n"
           "    print(name, 'denied' if r == -1 else 'CHANGED')\n"
           "for pid in (1, os.getppid()):\n"
           "    attempt('prlimit', lambda: resource.prlimit(pid, resource.RLIMIT_AS, (2**24, 2**24)))\n"
           "    attempt('affinity', lambda: os.sched_setaffinity(pid, {0}))\n"
           "    attempt('nice', lambda: os.setpriority(os.PRIO_PROCESS, pid, 19))\n"
           "    attempt('sched', lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0)))\n"
           "    attempt('ioprio', lambda: libc.syscall(@IOPRIO_SET@, 1, pid, (3 << 13) | 7))\n"
           "resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))\nos.setpriority(os.PRIO_PROCESS, 0, 5)\n"
           "print('own ok')", ("ok",), "own ok"),
    # --- issue 25: the new mount API and other entries the filter lacked
    Attack("new_mount_api_syslog_handles",
           "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nout = []\n"
           "for nr, args in @MOUNT_API_CALLS@:\n    r = libc.syscall(nr, *args)\n"
           "    out.append((r, ctypes.get_errno()))\nprint(out)\n"
           "print(all(r == -1 and e == 1 for r, e in out))", ("ok",), "True"),
]


@pytest.fixture(scope="module")
def host_sentinels(sandbox: PythonSandbox):
    """Host files the attacks try to change. In rootless mode they belong to the user the
    sandboxes run as, so only the sandbox (not file permissions) keeps them safe."""
    tmp_dir = Path(tempfile.mkdtemp(prefix="compassplay-sentinel-"))
    (tmp_dir / "keep.txt").write_text("host data")
    home = Path(os.path.expanduser("~")) / f".compassplay_sandbox_sentinel_{os.getpid()}"
    home.write_text("home data")
    if sandbox.mode == ROOTLESS and os.geteuid() == 0:
        for p in (tmp_dir, tmp_dir / "keep.txt", home):
            os.chown(p, sandbox.rootless_uid, sandbox.rootless_uid)
    yield tmp_dir, home
    home.unlink(missing_ok=True)
    shutil.rmtree(tmp_dir, ignore_errors=True)


PROBE = (
    "import os, builtins\n"
    "print(sorted(os.listdir('/tmp')), os.listdir('.'), os.listdir('/dev/shm'),"
    " len([p for p in os.listdir('/proc') if p.isdigit()]), print is builtins.print)\n"
    "used = [os.statvfs(p) for p in ('/tmp', '/dev/shm')]\n"
    "print(oct(os.stat('/tmp').st_mode & 0o7777), oct(os.stat('/dev/shm').st_mode & 0o7777),"
    " os.listxattr('.') + os.listxattr('/tmp') + os.listxattr('/dev/shm'),"
    " min(os.stat(p).st_mtime for p in ('.', '/tmp', '/dev/shm')) > 1e9,"
    " sum(s.f_blocks - s.f_bfree for s in used), os.getpriority(os.PRIO_PROCESS, 0),"
    " os.sched_getscheduler(0), len(os.sched_getaffinity(0)) == @NCPU@,"
    " os.readlink('/dev/stdout'))"
)
PROBE_OUT = ("['work'] [] [] 2 True\n"
             "0o1777 0o1777 [] True 0 0 0 True /proc/self/fd/1\n")
# A small host tree to try to delete: walking all of /work on a CI machine can exceed the timeout.
PACKAGE_DIR = str(Path(compassplay.__file__).parent)
PWNED = ["/tmp/pwned_tmp", "/tmp/from_thread", "/tmp/from_daemon", "/root/pwned_sys",
         "/root/pwned_root", "/etc/pwned_sys", "/etc/pwned_etc", "/work/pwned_sub"]


@pytest.fixture()
def unix_listeners() -> Iterator[dict[str, socket.socket]]:
    """Host unix sockets anyone may connect to: a stream listener under /var/lib (a host
    service's place) and one in /etc (a directory sandboxes do see), and a datagram socket."""
    socks: dict[str, socket.socket] = {}
    tag = f"compassplay-test-{os.getpid()}"
    try:
        for key, path, kind in (("@UNIX_VAR@", f"/var/lib/{tag}.sock", socket.SOCK_STREAM),
                                ("@UNIX_ETC@", f"/etc/{tag}.sock", socket.SOCK_STREAM),
                                ("@UNIX_DGRAM@", f"/var/lib/{tag}.dgram", socket.SOCK_DGRAM)):
            s = socket.socket(socket.AF_UNIX, kind)
            socks[key] = s
            s.bind(path)
            os.chmod(path, 0o777)
            if kind == socket.SOCK_STREAM:
                s.listen(8)
            s.setblocking(False)
        yield socks
    finally:
        for s in socks.values():
            path = s.getsockname()
            s.close()
            if path:
                Path(path).unlink(missing_ok=True)


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_attack_is_contained(attack: Attack, sandbox: PythonSandbox, host_sentinels,
                             listener: socket.socket, unix_listeners) -> None:
    tmp_dir, home = host_sentinels
    before = dir_state(tmp_dir)
    code = (attack.code.replace("@TMP_SENTINEL@", str(tmp_dir))
            .replace("@HOME_SENTINEL@", str(home))
            .replace("@PORT@", str(listener.getsockname()[1]))
            .replace("@HOST_PID@", str(os.getpid()))
            .replace("@PACKAGE_DIR@", PACKAGE_DIR)
            .replace("@MOUNT_API_CALLS@", repr(MOUNT_API_CALLS))
            .replace("@IOPRIO_SET@", str(_NRS.get("ioprio_set", -1))))
    for key, s in unix_listeners.items():
        code = code.replace(key, s.getsockname())
    result = sandbox.run(code)
    print(f"\nATTACK {sandbox.mode:13s} {attack.name:35s} {result.status:12s} "
          f"(allowed: {'/'.join(attack.statuses)})")
    assert result.status in attack.statuses, result
    expected = attack.stdout_has
    if sandbox.mode == ROOTLESS and attack.stdout_rootless is not None:
        expected = attack.stdout_rootless
    if expected is not None:
        assert expected in result.stdout, result
    if attack.stderr_has is not None and result.status == "error":
        assert attack.stderr_has in result.stderr, result
    assert (Path(PACKAGE_DIR) / "__init__.py").is_file()  # visible or not, it is untouched
    assert "WROTE" not in result.stdout and "CONNECTED" not in result.stdout
    assert "CHANGED" not in result.stdout
    assert "hunter2" not in result.stdout + result.stderr
    assert len(result.stdout) + len(result.stderr) <= sandbox.max_output_bytes
    # host unchanged
    assert dir_state(tmp_dir) == before
    assert home.read_text() == "home data"
    assert [p for p in PWNED if os.path.exists(p)] == []
    assert processes_of(sandbox.uids) == [] and leftovers(sandbox) == []
    with pytest.raises(BlockingIOError):
        listener.accept()
    for key, s in unix_listeners.items():
        with pytest.raises(BlockingIOError):
            s.accept() if key != "@UNIX_DGRAM@" else s.recv(16)
    # pool intact and no state carried into the next run on either worker
    assert sandbox.live_workers() == sandbox.workers
    probe_code = PROBE.replace("@NCPU@", str(len(os.sched_getaffinity(0))))
    for _ in range(sandbox.workers):
        probe = sandbox.run(probe_code)
        assert (probe.status, probe.stdout) == ("ok", PROBE_OUT), probe
    assert len(ATTACKS) >= 25


def test_no_host_env_and_no_capabilities(sandbox: PythonSandbox) -> None:
    r = sandbox.run(
        "import os\nst = open('/proc/self/status').read()\n"
        "caps = [l.split()[1] for l in st.splitlines() if l.startswith(('CapEff', 'CapPrm'))]\n"
        "nnp = [l.split()[1] for l in st.splitlines() if l.startswith(('NoNewPrivs', 'Seccomp:'))]\n"
        "print(sorted(os.environ), caps, nnp, os.getuid() != 0)"
    )
    assert r.status == "ok", r
    assert HOST_SECRET not in r.stdout
    assert "['HOME', 'LANG', 'PATH', 'PYTHONHASHSEED', 'TMPDIR']" in r.stdout
    assert "['0000000000000000', '0000000000000000'] ['1', '2'] True" in r.stdout


def test_workers_use_distinct_unprivileged_uids(sandbox: PythonSandbox) -> None:
    if sandbox.mode != ROOT:
        r = sandbox.run("import os\nprint(os.getuid(), os.getgid())")
        assert r.stdout == "1000 1000\n", r  # the only id mapped in the user namespace
        return
    assert len(set(sandbox.uids)) == sandbox.workers and min(sandbox.uids) > 65535
    uids = {sandbox.run("import os\nimport time\ntime.sleep(0.2)\nprint(os.getuid())").stdout
            for _ in range(2)}
    outs = sandbox.run_many(["import os, time\ntime.sleep(0.3)\nprint(os.getuid())"] * 2)
    assert {int(o.stdout) for o in outs} == set(sandbox.uids)
    assert uids


def test_state_does_not_leak_between_runs(sandbox: PythonSandbox) -> None:
    poison = ("import json, builtins, sys\nLEAK = 1\njson.dumps = None\n"
              "builtins.LEAKED = 42\nsys.modules['leaky'] = sys\nopen('f.txt', 'w').write('x')")
    check = ("import json, builtins, sys, os\n"
             "print('LEAK' in globals(), json.dumps([1]), hasattr(builtins, 'LEAKED'),"
             " 'leaky' in sys.modules, os.listdir('.'))")
    for _ in range(sandbox.workers):
        assert sandbox.run(poison).status == "ok"
    for r in sandbox.run_many([check] * 4):
        assert r.stdout == "False [1] False False []\n", r


def test_host_deadline_kills_a_frozen_worker(sandbox: PythonSandbox) -> None:
    """If a zygote stops answering, the host kills and replaces its whole sandbox."""
    pids = sandbox.worker_pids()
    for pid in pids:
        for d in descendants(pid):
            os.kill(d, signal.SIGSTOP)
    grace = sandbox.host_grace_s
    sandbox.host_grace_s = 0.5
    try:
        results = [sandbox.run("print(1)", timeout_s=0.5) for _ in range(2)]  # one per worker
    finally:
        sandbox.host_grace_s = grace
    assert [r.status for r in results] == ["timeout", "timeout"]
    assert sandbox.live_workers() == sandbox.workers
    assert set(sandbox.worker_pids()).isdisjoint(pids)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert sandbox.run("print(2)").stdout == "2\n"
    assert processes_of(sandbox.uids) == [] and leftovers(sandbox) == []
