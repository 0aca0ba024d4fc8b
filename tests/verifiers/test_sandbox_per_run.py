"""What the per-run fast path relies on: state the zygote prepares once is fresh in every run,
output is read only once no process can still write it, and the zygote's code reaches it on
stdin, compiled, rather than on its (per-fork copied) command line."""

from __future__ import annotations

import marshal
import time

from compassplay.verifiers import isolation
from compassplay.verifiers.python_sandbox import PythonSandbox
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


def test_zygote_code_travels_on_stdin_not_on_the_command_line() -> None:
    argv = isolation.zygote_argv({"isolated": True})
    assert sum(len(a) for a in argv) < 4096  # the loader only: no module source in argv
    frames, names = isolation.bootstrap_frames(), []
    while frames:
        size = int.from_bytes(frames[:4], "big")
        name, _, data = frames[4:4 + size].partition(b"\0")
        code = marshal.loads(data)
        assert code.co_filename == name.decode() + ".py"
        names.append(name.decode())
        frames = frames[4 + size:]
    assert names == [*isolation.PRELOADED, "sandbox_worker"]
