"""Paired CPU cost per run of two checkouts of the sandbox, on a shared machine.

    python paired_cpu.py BASE_DIR NEW_DIR MODE [PAIRS] [RUNS]

Each sample runs in a fresh process with its checkout first on sys.path: a 4-worker pool (as
the bench), a warm-up, then two batches of RUNS runs of the bench's programs; the cheaper
batch's CPU seconds per run, counted as the bench counts them (this process plus every process
of the pool), is the sample. The sides alternate (ABBA) so that drifting load from other jobs
hits both alike; the median paired ratio new/base is what that load barely moves.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys


def one(mode: str, runs: int) -> None:
    from compassplay.bench.sandbox import _pool_rate, _programs
    from compassplay.verifiers.sandbox.pool import PythonSandbox

    with PythonSandbox(isolation=mode, workers=4) as sb:
        sb.run_many(_programs(32))
        print(json.dumps(min(_pool_rate(sb, runs)[1] for _ in range(2))))


def main() -> None:
    if sys.argv[1] == "--one":
        one(sys.argv[2], int(sys.argv[3]))
        return
    base, new, mode = sys.argv[1:4]
    pairs = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    runs = int(sys.argv[5]) if len(sys.argv) > 5 else 500
    got: dict[str, list[float]] = {base: [], new: []}
    for p in range(pairs):
        for side in (base, new) if p % 2 == 0 else (new, base):
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--one", mode, str(runs)],
                cwd=side, env=dict(os.environ, PYTHONPATH=side), capture_output=True,
                text=True, timeout=600, check=True)
            got[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    ratios = sorted(b / a for a, b in zip(got[base], got[new], strict=True))
    print(json.dumps({
        "mode": mode, "pairs": pairs, "runs": runs,
        "base_ms": [round(x * 1e3, 3) for x in got[base]],
        "new_ms": [round(x * 1e3, 3) for x in got[new]],
        "base_median_ms": round(statistics.median(got[base]) * 1e3, 3),
        "new_median_ms": round(statistics.median(got[new]) * 1e3, 3),
        "ratio_median": round(statistics.median(ratios), 3),
        "ratio_q1_q3": [round(ratios[len(ratios) // 4], 3), round(ratios[3 * len(ratios) // 4], 3)],
        "loadavg_end": round(os.getloadavg()[0], 2),
    }))


if __name__ == "__main__":
    main()
