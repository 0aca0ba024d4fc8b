"""/dev inside the sandbox (issue 34): no run can change any entry of it for the runs after it
(nor the host's device nodes), it holds only what programs need, and the capabilities the
zygote needs to set it up are gone before any program runs. Both modes (see conftest)."""

from __future__ import annotations

import os
from collections.abc import Iterable

from compassplay.verifiers.sandbox.dev import DEV_NODES, SETUP_CAPS
from compassplay.verifiers.sandbox.isolation import ROOTLESS
from compassplay.verifiers.sandbox.pool import ExecResult, PythonSandbox
from tests.verifiers.sandbox_helpers import DEV_ATTACK, DEV_SNAPSHOT


def _by_sandbox(results: Iterable[ExecResult]) -> dict[str, list[str]]:
    """Each snapshot (its lines but the last) keyed by the SANDBOX line that ends it."""
    out: dict[str, list[str]] = {}
    for r in results:
        assert r.status == "ok", r
        *lines, key = r.stdout.splitlines()
        assert key.startswith("SANDBOX ") and "UNREADABLE" not in r.stdout, r
        assert out.setdefault(key, lines) == lines, (key, out[key], lines)
    return out


def _host_nodes() -> dict[str, tuple[int, int, int]]:
    """Mode, modify and change time of the host's device nodes the sandboxes bind."""
    return {n: (st.st_mode, st.st_mtime_ns, st.st_ctime_ns)
            for n in DEV_NODES for st in [os.stat("/dev/" + n)]}


def test_no_run_can_change_dev_for_the_runs_after_it(sandbox: PythonSandbox) -> None:
    n = sandbox.workers
    host = _host_nodes()
    before = _by_sandbox(sandbox.run(DEV_SNAPSHOT) for _ in range(2 * n))
    assert len(before) == n  # runs alternate between the workers
    attacks = [sandbox.run(DEV_ATTACK) for _ in range(n)]
    for r in attacks:
        print(f"\nDEV ATTACK {sandbox.mode}: {r.status} {r.stdout!r}")
        assert r.status == "ok" and "paths" in r.stdout, r
    assert {r.stdout.splitlines()[-1] for r in attacks} == set(before)  # every worker's /dev
    after = _by_sandbox(sandbox.run(DEV_SNAPSHOT) for _ in range(2 * n))
    assert after == before  # the next runs see /dev exactly as the earlier ones did
    assert [r for r in attacks if "CHANGED" in r.stdout] == []  # not even for the run itself
    assert _host_nodes() == host


LAYOUT = (
    "import os, stat, subprocess\n"
    "names = sorted(os.listdir('/dev'))\n"
    "print(names)\n"
    "print({n: os.readlink('/dev/' + n) for n in names if os.path.islink('/dev/' + n)})\n"
    "nodes = [n for n in names if stat.S_ISCHR(os.lstat('/dev/' + n).st_mode)]\n"
    "print({n: (os.major(os.stat('/dev/' + n).st_rdev), os.minor(os.stat('/dev/' + n).st_rdev))"
    " for n in nodes})\n"
    "flags = {p: os.statvfs(p).f_flag for p in ['/dev', '/dev/shm'] + ['/dev/' + n for n in nodes]}\n"
    "print(sorted(p for p, f in flags.items() if not f & os.ST_RDONLY),"
    " sorted(p for p, f in flags.items() if f & os.ST_NODEV and p.removeprefix('/dev/') in nodes))\n"
    "os.write(os.open('/dev/null', os.O_WRONLY), b'x')\n"
    "try:\n    os.write(os.open('/dev/full', os.O_WRONLY), b'x')\nexcept OSError as e:\n"
    "    print('full', e.errno)\n"
    "print(open('/dev/null', 'rb').read(), open('/dev/zero', 'rb').read(2),"
    " len(open('/dev/urandom', 'rb').read(8)), len(open('/dev/random', 'rb').read(8)))\n"
    "print(subprocess.run('echo hi >/dev/null; cat /dev/null', shell=True, capture_output=True,"
    " stdin=subprocess.DEVNULL))\n"
    "try:\n    os.openpty()\n    print('PTY')\nexcept OSError:\n    print('no pty')\n"
)


def test_dev_holds_only_read_only_nodes_and_stdio_links(sandbox: PythonSandbox) -> None:
    r = sandbox.run(LAYOUT)
    nodes = {n: (os.major(st.st_rdev), os.minor(st.st_rdev))
             for n in DEV_NODES for st in [os.stat("/dev/" + n)]}
    links = {"fd": "/proc/self/fd", "stderr": "/proc/self/fd/2", "stdin": "/proc/self/fd/0",
             "stdout": "/proc/self/fd/1"}
    assert (r.status, r.stdout.splitlines()) == ("ok", [
        str(sorted([*DEV_NODES, *links, "shm"])),
        str(links),
        str(nodes),
        "['/dev/shm'] []",  # only /dev/shm is writable; no node lost device access
        "full 28",
        "b'' b'\\x00\\x00' 8 8",
        "CompletedProcess(args='echo hi >/dev/null; cat /dev/null', returncode=0, stdout=b'', "
        "stderr=b'')",
        "no pty",
    ]), r


CAPS = ("import os\nfor pid in ('self', '1'):\n    st = open(f'/proc/{pid}/status').read()\n"
        "    print([int(l.split()[1], 16) for l in st.splitlines() if l.startswith('Cap')])")


def test_setup_capabilities_are_gone_before_any_run(sandbox: PythonSandbox) -> None:
    r = sandbox.run(CAPS)
    assert r.status == "ok", r
    mask = sum(1 << cap for cap in SETUP_CAPS.values())
    program, zygote = (eval(line) for line in r.stdout.splitlines())  # noqa: S307 - lists of ints
    assert len(program) == len(zygote) == 5  # CapInh, CapPrm, CapEff, CapBnd, CapAmb
    assert [v & mask for v in program + zygote] == [0] * 10, (program, zygote)
    assert program[1:3] == [0, 0]  # no permitted or effective capability in a program
    if sandbox.mode == ROOTLESS:  # the zygote holds none at all, in any set
        assert program + zygote == [0] * 10, (program, zygote)
