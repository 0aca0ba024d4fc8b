"""The forked child of the sandbox zygote: lock down, then run one program (stdlib only;
loaded inside the sandbox by the bootstrap, see `isolation.bootstrap_frames`).

The child inherits the zygote's namespaces, seccomp filter, environment, umask, (empty)
supplementary groups and static rlimits, and the program's interpreter state that `prepare` set
up once in the zygote: stdio objects, ``sys.argv`` and an unused ``__main__`` module (each
child's copy of it is as fresh as a new one, and building none saves work on every run). Here it
starts a session, moves its pipes onto fds 1/2 and closes everything else, chdirs into the fresh
scratch directory, applies the per-run rlimits, (root mode) drops to the worker's unprivileged
uid and execs the program in that ``__main__``. It never returns.
"""

from __future__ import annotations

# The noqa imports are warm imports: each forked child finds them loaded (the coding harness
# uses ast and json).
import ast  # noqa: F401
import bisect  # noqa: F401
import collections  # noqa: F401
import copy  # noqa: F401
import functools  # noqa: F401
import heapq  # noqa: F401
import itertools  # noqa: F401
import json  # noqa: F401
import math  # noqa: F401
import operator  # noqa: F401
import os
import re  # noqa: F401
import resource
import string  # noqa: F401
import sys
import traceback
import types

# Run in the zygote before it freezes its heap: the interpreter's lazily filled state (type
# attribute cache, adaptive bytecode, the stdio encoders, compiler caches) is then already in
# place, so each child writes (copy-on-write faults) fewer of the zygote's pages.
WARM_PROGRAMS = (
    "import ast, io, json, sys\nx = {i: i * i for i in range(20)}\n"
    "print(json.dumps([repr(x[7]), sorted(x)[:3], 'abc'[::-1]]), ast.literal_eval('[1, (2,)]'))",
    "def f(s):\n    return s[::-1]\nraise ValueError(f('abc'))",
)


def warm_up(stdio: tuple, programs: list[str] | tuple[str, ...] = WARM_PROGRAMS,
            rounds: int = 10) -> None:
    """Run `programs` through `run_program` here (output to `stdio`, /dev/null in the zygote),
    each in a throwaway ``__main__``, and put back everything run_program changes."""
    saved = sys.stdin, sys.stdout, sys.stderr, sys.argv, sys.modules.get("__main__")
    try:
        sys.stdin, sys.stdout, sys.stderr = stdio
        sys.argv = ["<program>"]
        for _ in range(rounds):
            for code in programs:
                run_program(code.encode("utf-8", "surrogatepass"), new_main())
    finally:
        sys.stdin, sys.stdout, sys.stderr, sys.argv, main = saved
        if main is not None:
            sys.modules["__main__"] = main


def new_main() -> types.ModuleType:
    """A fresh, empty ``__main__`` module, registered in sys.modules."""
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    return main


def prepare(stdio: tuple) -> types.ModuleType:
    """Put the programs' interpreter state in place once, in the zygote (which never prints and
    never runs a program after this): stdio on fds 0-2, ``sys.argv`` and an unused ``__main__``
    (returned) that every forked child execs its program in."""
    sys.stdin, sys.stdout, sys.stderr = stdio
    sys.argv = ["<program>"]
    return new_main()


def child_main(code: bytes, timeout: float, mem_mb: int, out_w: int, err_w: int,
               scratch: str, uid: int | None, gid: int, main: types.ModuleType) -> None:
    """Set up and run one program in this freshly forked process; exits with its status.
    `main` is the unused ``__main__`` from `prepare`; umask, supplementary groups and the
    static rlimits were set once in the zygote."""
    status = 1
    try:
        os.setsid()
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 1 << 16)
        os.chdir(scratch)
        mem = mem_mb * 1024 * 1024  # (NPROC, FSIZE, CORE, NOFILE: set once in the zygote)
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        cpu = int(timeout) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        if uid is not None:
            os.setgid(gid)
            os.setuid(uid)
            if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
                raise OSError("setuid/setgid did not take effect")
        status = run_program(code, main)
    except BaseException:  # setup failure: report and die
        try:
            os.write(2, traceback.format_exc().encode()[-4000:])
        except BaseException:
            pass
        status = 1
    os._exit(status)


def run_program(code: bytes, main: types.ModuleType) -> int:
    """Exec `code` in the fresh module `main` (``__main__``); the exit status it asks for
    (1 on an exception)."""
    status = 0
    try:
        exec(compile(code, "<program>", "exec"), main.__dict__)
        threading = sys.modules.get("threading")
        if threading is not None:
            for t in threading.enumerate():
                if t is not threading.main_thread() and not t.daemon:
                    t.join()
    except SystemExit as exc:
        if exc.code is None:
            status = 0
        elif isinstance(exc.code, int):
            status = exc.code & 0xFF
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException as exc:
        status = 1
        try:
            tb = exc.__traceback__
            traceback.print_exception(type(exc), exc, tb.tb_next if tb else None)
        except BaseException:
            _try_write_err(f"{type(exc).__name__}\n")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return status


def _try_write_err(text: str) -> None:
    try:
        os.write(2, text.encode())
    except OSError:
        pass
