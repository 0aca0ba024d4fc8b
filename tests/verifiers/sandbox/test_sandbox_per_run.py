"""What the per-run fast path relies on: state the zygote prepares once is fresh in every run,
output is read only once no process can still write it, replies batched for the host are never
held back behind a long run, and the zygote's code reaches it on stdin, compiled, rather than
on its (per-fork copied) command line."""

from __future__ import annotations

import marshal
import os
import threading
import time

from compassplay.verifiers.sandbox import isolation
from compassplay.verifiers.sandbox import proto as sandbox_proto
from compassplay.verifiers.sandbox.pool import PythonSandbox
from tests.verifiers.sandbox_helpers import leftovers

STATE_PROBE = (
    "import os, sys\n"
    "print(oct(os.umask(0o022)), os.getgroups(), len(set(os.getresuid())),"
    " len(set(os.getresgid())), sys.argv, __name__, sys.stdout.fileno(),"
    " sorted(k for k in globals() if k not in ('os', 'sys')))\n"
)
STATE_POISON = (
    "import os, sys\nos.umask(0)\nsys.argv.append('x')\nglobals()['LEFT'] = 1\n"
    "sys.modules['__main__'].__dict__['ALSO'] = 2\nsys.stdout = sys.stderr\n"
)
PROBE_OUT = ("0o77 [] 1 1 ['<program>'] __main__ 1 ['__builtins__', '__doc__', '__loader__', "
             "'__name__', '__package__', '__spec__']\n")


def test_state_prepared_once_is_fresh_in_every_run(sandbox: PythonSandbox) -> None:
    first = sandbox.run(STATE_PROBE)
    assert (first.status, first.stdout) == ("ok", PROBE_OUT), first
    for _ in range(sandbox.workers):
        assert sandbox.run(STATE_POISON).status == "ok"
    for r in sandbox.run_many([STATE_PROBE] * (2 * sandbox.workers)):
        assert (r.status, r.stdout) == ("ok", PROBE_OUT), r


def test_leftover_holding_stdout_is_killed_before_the_output_is_read(
        sandbox: PythonSandbox) -> None:
    """The program exits at once but leaves a process (its own session) that holds stdout open
    and writes to it later: the run ends promptly with the program's own output only."""
    code = ("import os, sys, time\nprint('early', flush=True)\n"
            "if os.fork() == 0:\n    os.setsid()\n    time.sleep(0.3)\n"
            "    print('late', flush=True)\n    time.sleep(30)\n    os._exit(0)\n")
    t0 = time.monotonic()
    r = sandbox.run(code)
    assert (r.status, r.stdout) == ("ok", "early\n"), r
    assert time.monotonic() - t0 < 1.0
    time.sleep(0.5)  # past the leftover's write: nothing of it reaches the next run either
    nxt = sandbox.run_many(["print('next')"] * sandbox.workers)
    assert [x.stdout for x in nxt] == ["next\n"] * sandbox.workers
    assert leftovers(sandbox) == []



def test_programs_cannot_forge_the_last_pid_the_sweep_relies_on(sandbox: PythonSandbox) -> None:
    """The zygote skips its sweep only while ns_last_pid is the run's own pid: a program that
    could write it could hide a leftover process."""
    code = ("import os, time\n"
            "if os.fork() == 0:\n    time.sleep(30)\n    os._exit(0)\n"
            "for value in (b'%d' % os.getpid(), b'2'):\n"
            "    try:\n        fd = os.open('/proc/sys/kernel/ns_last_pid', os.O_WRONLY)\n"
            "        os.write(fd, value)\n        print('wrote')\n"
            "    except OSError as exc:\n        print('refused', exc.errno)\n")
    r = sandbox.run(code)
    assert (r.status, r.stdout) == ("ok", "refused 1\nrefused 1\n"), r
    assert leftovers(sandbox) == []  # the leftover was swept all the same

def test_zygote_code_travels_on_stdin_not_on_the_command_line() -> None:
    argv = isolation.zygote_argv({"isolated": True})
    assert sum(len(a) for a in argv) < 4096  # the loader only: no module source in argv
    frames, names = isolation.bootstrap_frames(), []
    while frames:
        size = int.from_bytes(frames[:4], "big")
        name, _, data = frames[4:4 + size].partition(b"\0")
        code = marshal.loads(data)
        modules = {**isolation.PRELOADED, "sandbox_worker": "zygote"}  # bare name -> file
        assert code.co_filename == modules[name.decode()] + ".py"
        names.append(name.decode())
        frames = frames[4 + size:]
    assert names == [*isolation.PRELOADED, "sandbox_worker"]


def _frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def _readable(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return b""


def test_channel_batches_replies_and_never_holds_them_while_it_would_block() -> None:
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    ch = sandbox_proto.Channel(in_r, out_w, max_held=3)
    big = b"R" + b"x" * 200_000  # more than one read
    os.write(in_w, _frame(b"R1") + _frame(b"R2") + _frame(big)[:3])  # a header cut short
    assert ch.request() == b"R1"
    ch.reply(_frame(b"a"))
    assert ch.request() == b"R2"  # buffered: the reply to R1 is still held
    ch.reply(_frame(b"b"))
    assert _readable(out_r) == b""
    writer = threading.Thread(target=os.write, args=(in_w, _frame(big)[3:]))
    writer.start()
    assert ch.request() == big  # it had to wait for input: both replies went out first
    writer.join()
    assert _readable(out_r) == _frame(b"a") + _frame(b"b")
    for body in (b"c", b"d", b"e"):
        ch.reply(_frame(body))
    assert _readable(out_r) == _frame(b"c") + _frame(b"d") + _frame(b"e")  # max_held reached
    ch.reply(_frame(b"f"))
    ch.flush()
    assert _readable(out_r) == _frame(b"f")
    os.close(in_w)
    assert ch.request() is None
    for fd in (in_r, out_r, out_w):
        os.close(fd)


def test_a_long_run_does_not_hold_back_the_replies_before_it(sandbox: PythonSandbox) -> None:
    sandbox.run("print(0)")
    handle = sandbox._handles()[0]  # idle between calls: nothing else talks to it
    handle.send(b"print(1)", 1.5, 256, 4096)
    handle.send(b"import time\ntime.sleep(1.2)\nprint(2)", 1.5, 256, 4096)
    t0 = time.monotonic()
    first = handle.recv(t0 + 0.8)  # the slow run is still going: the fast reply came anyway
    assert (first.status, first.stdout) == ("ok", b"1\n")
    assert time.monotonic() - t0 < 0.8
    second = handle.recv(t0 + 5.0)
    assert (second.status, second.stdout) == ("ok", b"2\n")
