"""`compassplay bench sandbox`: warm isolated pool vs. an unisolated executor, in the same run.

The pool side runs short CRUXEval-sized programs through `PythonSandbox.run_many` with full
isolation (bubblewrap namespaces, read-only root, tmpfs scratch, cleared env, seccomp, rlimits;
root mode: per-worker uid, rootless mode: unprivileged user namespace). The baseline is an
unisolated in-process executor shaped like AZR's: a pool of reused worker processes that
`exec` each program in a fresh namespace with redirected stdout (no fork per run, no isolation).
A third side, the same pool with isolation switched off (fork per run from the warm zygote, no
namespaces/uid/seccomp), shows what the isolation itself costs. All sides use the same number
of workers and programs and are measured alternately, `repeats` times, keeping the best of each;
the machine's load average is reported alongside (2 shared cores: numbers are noisy).

CPU seconds per run are measured for every side (the bench process plus every process of the
side: bwrap, zygotes and their reaped children, or the executor's workers), so a contended
machine still yields `implied_runs_per_s_idle`: the run rate the measured CPU cost allows on
`cpus` otherwise idle cores.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import resource
import time
from concurrent.futures import ProcessPoolExecutor

from compassplay.verifiers.sandbox import isolation
from compassplay.verifiers.sandbox.pool import PythonSandbox

TRIVIAL_PROGRAMS = [
    "print(sum(range(10)))",
    "def f(s):\n    return s[::-1]\nprint(f('abc'))",
    "print(sorted([3, 1, 2]))",
    "x = {i: i * i for i in range(20)}\nprint(x[7])",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the bench's command-line options."""
    parser.add_argument("--runs", type=int, default=3000, help="runs per measurement")
    parser.add_argument("--workers", type=int, default=4,
                        help="pool workers (more than cores keeps both busy)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="measure each side this many times and keep the best")
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("--memory-mb", type=int, default=512)
    parser.add_argument("--isolation", default=isolation.AUTO,
                        help=f"{isolation.AUTO} (root mode as root, else rootless), "
                             f"{isolation.ROOT} or {isolation.ROOTLESS}")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _programs(n: int) -> list[str]:
    return [TRIVIAL_PROGRAMS[i % len(TRIVIAL_PROGRAMS)] for i in range(n)]


def _exec_unisolated(code: str) -> tuple[str, str]:
    """AZR-style in-process execution: fresh globals, captured stdout, no isolation."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "<program>", "exec"), {"__name__": "__main__"})
        return "ok", out.getvalue()
    except BaseException as exc:  # noqa: BLE001 - a benchmark stand-in for a program runner
        return "error", repr(exc)


def _counts(statuses: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for st in statuses:
        counts[st] = counts.get(st, 0) + 1
    return counts


_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> float:
    """utime + stime + cutime + cstime of one live process (reaped children included)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / _TICK


def _tree_cpu(roots: list[int]) -> float:
    """CPU seconds of `roots` and all their live descendants."""
    total, todo = 0.0, list(roots)
    while todo:
        pid = todo.pop()
        total += _proc_cpu(pid)
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as fh:
                todo += [int(k) for k in fh.read().split()]
        except OSError:
            pass
    return total


def _zygotes(roots: list[int]) -> list[int]:
    """Host pids of the zygotes under `roots` (pid 1 of their sandbox, or the unsafe roots)."""
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/status") as fh:
                status = fh.read()
            with open(f"/proc/{pid}/task/{pid}/children") as fh:
                kids = [int(k) for k in fh.read().split()]
        except OSError:
            continue
        nspid = status.split("NSpid:", 1)[1].split("\n", 1)[0].split()
        name = status.split("Name:", 1)[1].split("\n", 1)[0].strip()
        if name.startswith("python") and (nspid[-1] == "1" or pid in roots):
            found.append(pid)
        else:
            todo += kids
    return found


def _role_counters(zygotes: list[int]) -> list[float]:
    """Zygote (supervisor) utime, stime, minor faults, voluntary switches; its reaped children's
    utime, stime, minor faults."""
    total = [0.0] * 7
    for pid in zygotes:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                f = fh.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{pid}/status") as fh:
                vcsw = int(fh.read().split("voluntary_ctxt_switches:")[1].split()[0])
        except (OSError, IndexError):
            continue
        vals = [int(f[11]) / _TICK, int(f[12]) / _TICK, int(f[7]), vcsw,
                int(f[13]) / _TICK, int(f[14]) / _TICK, int(f[8])]
        total = [a + b for a, b in zip(total, vals, strict=True)]
    return total


def profile(sb: PythonSandbox, n: int) -> dict:
    """Where one run's CPU goes (ms per run, by process role) and the page faults behind it,
    plus the zygote's size (what every fork copies page tables for and every exit unmaps)."""
    zygotes = _zygotes(sb.worker_pids())
    ru0, z0 = resource.getrusage(resource.RUSAGE_SELF), _role_counters(zygotes)
    sb.run_many(_programs(n))
    ru1, z1 = resource.getrusage(resource.RUSAGE_SELF), _role_counters(zygotes)
    d = [(b - a) / n for a, b in zip(z0, z1, strict=True)]
    out = {"host_user_ms": (ru1.ru_utime - ru0.ru_utime) * 1e3 / n,
           "host_sys_ms": (ru1.ru_stime - ru0.ru_stime) * 1e3 / n,
           "zygote_user_ms": d[0] * 1e3, "zygote_sys_ms": d[1] * 1e3,
           "child_user_ms": d[4] * 1e3, "child_sys_ms": d[5] * 1e3,
           "zygote_page_faults": d[2], "child_page_faults": d[6], "zygote_wakeups": d[3]}
    out = {k: round(v, 3) for k, v in out.items()}
    if zygotes:
        with open(f"/proc/{zygotes[0]}/status") as fh:
            status = fh.read()
        with open(f"/proc/{zygotes[0]}/maps") as fh:
            out["zygote_mappings"] = len(fh.readlines())
        for key in ("VmRSS", "RssAnon", "RssFile"):
            out[f"zygote_{key}_kb"] = int(status.split(key + ":")[1].split()[0])
    return out


def _self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _measure(fn, roots: list[int], n: int) -> tuple[float, float, dict[str, int]]:
    """(runs/s, CPU seconds per run of this process plus the `roots` trees, statuses)."""
    cpu0 = _self_cpu() + _tree_cpu(roots)
    t0 = time.perf_counter()
    statuses = fn(_programs(n))
    wall = time.perf_counter() - t0
    cpu = _self_cpu() + _tree_cpu(roots) - cpu0
    return n / wall, cpu / n, _counts(statuses)


def _pool_rate(sb: PythonSandbox, n: int) -> tuple[float, float, dict[str, int]]:
    return _measure(lambda codes: [r.status for r in sb.run_many(codes)], sb.worker_pids(), n)


def _unisolated_rate(ex: ProcessPoolExecutor, n: int) -> tuple[float, float, dict[str, int]]:
    roots = list(ex._processes)  # noqa: SLF001 - the workers' pids, for CPU accounting
    return _measure(lambda codes: [st for st, _ in ex.map(_exec_unisolated, codes, chunksize=1)],
                    roots, n)


def run(args: argparse.Namespace) -> dict:
    """Run the benchmark and return the result object (also what --json prints)."""
    mode = isolation.preflight(args.isolation)
    load_before = os.getloadavg()
    pool, base, fork = [], [], []
    kw = {"workers": args.workers, "timeout_s": args.timeout_s, "memory_mb": args.memory_mb}
    with PythonSandbox(isolation=mode, **kw) as sb, \
            PythonSandbox(isolation=isolation.UNSAFE_OPT_OUT, **kw) as unsafe, \
            ProcessPoolExecutor(max_workers=args.workers) as ex:
        for pool_ in (sb, unsafe):
            pool_.run_many(_programs(8 * args.workers))  # warm-up
        list(ex.map(_exec_unisolated, _programs(8 * args.workers)))
        for _ in range(args.repeats):
            pool.append(_pool_rate(sb, args.runs))
            base.append(_unisolated_rate(ex, args.runs))
            fork.append(_pool_rate(unsafe, args.runs))
        snap = sb.stats.snapshot()
        split = profile(sb, args.runs)
    best_pool = max(pool, key=lambda t: t[0])
    best_base = max(base, key=lambda t: t[0])
    best_fork = max(fork, key=lambda t: t[0])
    cpus = os.cpu_count() or 1
    cpu_pool = min(p[1] for p in pool)
    cpu_base = min(b[1] for b in base)
    cpu_fork = min(f[1] for f in fork)
    return {
        "bench": "sandbox",
        "isolation": mode,
        "runs": args.runs,
        "workers": args.workers,
        "repeats": args.repeats,
        "runs_per_s": round(best_pool[0], 1),
        "unisolated_runs_per_s": round(best_base[0], 1),
        "ratio_to_unisolated": round(best_pool[0] / best_base[0], 3),
        "fork_per_run_unisolated_runs_per_s": round(best_fork[0], 1),
        "ratio_to_fork_per_run_unisolated": round(best_pool[0] / best_fork[0], 3),
        "runs_per_s_all": [round(p[0], 1) for p in pool],
        "unisolated_runs_per_s_all": [round(b[0], 1) for b in base],
        "fork_per_run_unisolated_runs_per_s_all": [round(f[0], 1) for f in fork],
        "cpu_s_per_run": round(cpu_pool, 6),
        "unisolated_cpu_s_per_run": round(cpu_base, 6),
        "fork_per_run_unisolated_cpu_s_per_run": round(cpu_fork, 6),
        "cpu_s_per_run_all": [round(p[1], 6) for p in pool],
        "implied_runs_per_s_idle": round(cpus / cpu_pool, 1) if cpu_pool else None,
        "unisolated_implied_runs_per_s_idle": round(cpus / cpu_base, 1) if cpu_base else None,
        "cpu_ratio_to_unisolated": round(cpu_base / cpu_pool, 3) if cpu_pool else None,
        "cpu_split_per_run": split,
        "statuses": best_pool[2],
        "unisolated_statuses": best_base[2],
        "latency_p50_s": round(snap["latency_s"]["p50"], 5),
        "latency_p95_s": round(snap["latency_s"]["p95"], 5),
        "cgroup_memory": snap.get("cgroup_memory", ""),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "unisolated": "process pool (reused workers), exec + redirect_stdout, no isolation",
        "program": "trivial (print/sort/dict, CRUXEval-sized)",
        "cpus": cpus,
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="compassplay bench sandbox", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
