"""The floor under the sandbox: a bare fork-per-run server with no isolation and no harness.

    LD_BIND_NOW=1 python3.11 -s -S -B fork_floor.py RUNS [MODULES] [PROCESSES]

The parent (after importing MODULES, comma-separated: the zygote's warm imports, then
gc.freeze() like the zygote) forks a child per run; the child runs one of the bench's programs
(compile + exec, stdout on /dev/null) and _exits; the parent waits. PROCESSES such loops run at
once (the bench's pool runs 4 workers on the 2 cores). Prints the CPU milliseconds per run
(parent + child) and page faults per run of each loop.
"""

from __future__ import annotations

import gc
import os
import resource
import sys

PROGRAMS = (  # compassplay.bench.sandbox.TRIVIAL_PROGRAMS
    "print(sum(range(10)))",
    "def f(s):\n    return s[::-1]\nprint(f('abc'))",
    "print(sorted([3, 1, 2]))",
    "x = {i: i * i for i in range(20)}\nprint(x[7])",
)


def loop(runs: int) -> str:
    devnull = os.open("/dev/null", os.O_WRONLY)
    me0, kids0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    for i in range(runs):
        pid = os.fork()
        if pid == 0:
            os.dup2(devnull, 1)
            exec(compile(PROGRAMS[i % len(PROGRAMS)], "<program>", "exec"), {"__name__": "__main__"})
            sys.stdout.flush()
            os._exit(0)
        os.waitpid(pid, 0)
    me1, kids1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (me1.ru_utime - me0.ru_utime + me1.ru_stime - me0.ru_stime
           + kids1.ru_utime - kids0.ru_utime + kids1.ru_stime - kids0.ru_stime)
    return (f"cpu_ms_per_run={1e3 * cpu / runs:.3f} parent_faults={(me1.ru_minflt - me0.ru_minflt) / runs:.1f} "
            f"child_faults={(kids1.ru_minflt - kids0.ru_minflt) / runs:.1f}")


def main() -> None:
    runs = int(sys.argv[1])
    for name in filter(None, (sys.argv[2] if len(sys.argv) > 2 else "").split(",")):
        __import__(name)
    gc.collect()
    gc.freeze()
    procs = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    pipes = []
    for _ in range(procs):
        r, w = os.pipe()
        if os.fork() == 0:
            os.close(r)
            os.write(w, loop(runs).encode())
            os._exit(0)
        os.close(w)
        pipes.append(r)
    for r in pipes:
        print(os.read(r, 4096).decode())
    for _ in pipes:
        os.wait()
    print(f"loadavg={os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
