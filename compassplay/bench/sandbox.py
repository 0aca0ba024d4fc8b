"""`compassplay bench sandbox`: warm sandbox pool vs. a fresh sandbox per run.

Both sides run the same programs with the same isolation (bubblewrap namespaces, read-only
root, tmpfs scratch, cleared env, unprivileged uid, rlimits, seccomp) and the same number of
parallel workers. The baseline starts a fresh ``bwrap ... python sandbox_worker.py`` for each
run, sends it the one program and tears it down; the pool reuses warm zygotes.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from concurrent.futures import ThreadPoolExecutor

from compassplay.verifiers import isolation
from compassplay.verifiers.python_sandbox import PythonSandbox
from compassplay.verifiers.worker_handle import WorkerHandle

TRIVIAL_PROGRAMS = [
    "print(sum(range(10)))",
    "def f(s):\n    return s[::-1]\nprint(f('abc'))",
    "print(sorted([3, 1, 2]))",
    "x = {i: i * i for i in range(20)}\nprint(x[7])",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the bench's command-line options."""
    parser.add_argument("--runs", type=int, default=2000, help="runs through the warm pool")
    parser.add_argument("--baseline-runs", type=int, default=100,
                        help="runs with a fresh sandbox each")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3,
                        help="measure each side this many times and keep the best")
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("--memory-mb", type=int, default=512)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _programs(n: int) -> list[str]:
    return [TRIVIAL_PROGRAMS[i % len(TRIVIAL_PROGRAMS)] for i in range(n)]


def _pool_rate(sb: PythonSandbox, n: int) -> tuple[float, dict[str, int]]:
    codes = _programs(n)
    t0 = time.perf_counter()
    results = sb.run_many(codes)
    dt = time.perf_counter() - t0
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    return n / dt, counts


def _baseline_once(sb: PythonSandbox, slot: int, code: str) -> str:
    handle = WorkerHandle(sb.isolation, sb._cfgs[slot], sb.tmpfs_mb, 1 << 22)
    try:
        reply = handle.request(
            {"code": code, "timeout_s": sb.timeout_s, "memory_mb": sb.memory_mb,
             "max_output_bytes": sb.max_output_bytes},
            time.monotonic() + sb.timeout_s + sb.host_grace_s,
        )
        return str(reply["status"])
    finally:
        handle.close()


def _baseline_rate(sb: PythonSandbox, n: int) -> tuple[float, dict[str, int]]:
    codes = _programs(n)
    # Same parallelism; each thread owns one uid, like a pool worker.
    with ThreadPoolExecutor(max_workers=sb.workers) as ex:
        t0 = time.perf_counter()
        chunks = [list(range(i, n, sb.workers)) for i in range(sb.workers)]
        futures = [ex.submit(lambda s, idx: [_baseline_once(sb, s, codes[i]) for i in idx], s, c)
                   for s, c in enumerate(chunks)]
        statuses = [st for f in futures for st in f.result()]
        dt = time.perf_counter() - t0
    counts: dict[str, int] = {}
    for st in statuses:
        counts[st] = counts.get(st, 0) + 1
    return n / dt, counts


def run(args: argparse.Namespace) -> dict:
    """Run the benchmark and return the result object (also what --json prints)."""
    isolation.preflight("bwrap")
    with PythonSandbox(workers=args.workers, timeout_s=args.timeout_s,
                       memory_mb=args.memory_mb) as sb:
        sb.run_many(_programs(4 * args.workers))  # warm-up
        pool = [_pool_rate(sb, args.runs) for _ in range(args.repeats)]
        base = [_baseline_rate(sb, args.baseline_runs) for _ in range(args.repeats)]
        snap = sb.stats.snapshot()
    best_pool = max(pool, key=lambda t: t[0])
    best_base = max(base, key=lambda t: t[0])
    return {
        "bench": "sandbox",
        "runs": args.runs,
        "baseline_runs": args.baseline_runs,
        "workers": args.workers,
        "repeats": args.repeats,
        "runs_per_s": round(best_pool[0], 1),
        "baseline_runs_per_s": round(best_base[0], 1),
        "speedup": round(best_pool[0] / best_base[0], 2),
        "runs_per_s_all": [round(p[0], 1) for p in pool],
        "baseline_runs_per_s_all": [round(b[0], 1) for b in base],
        "statuses": best_pool[1],
        "baseline_statuses": best_base[1],
        "latency_p50_s": round(snap["latency_s"]["p50"], 5),
        "latency_p95_s": round(snap["latency_s"]["p95"], 5),
        "isolation": "bwrap: net/pid/mount/ipc/uts ns, ro root, tmpfs scratch, clearenv, "
                     "per-worker uid, rlimits, seccomp",
        "program": "trivial (print/sort/dict, CRUXEval-sized)",
        "cpus": __import__("os").cpu_count(),
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
