"""Valid and eligible per step: bfloat16 decoding (seeds/metrics_auto_seedS.jsonl; seed 0 from
bench_step_auto.json) against float32 (the 2026-12-04 runs of the same code path in
../scorer-speed-2026-12-04/seeds/, seed 0 from that README), paired by (seed, step): mean difference, 95% t interval, and the smallest
difference the design detects at 80% power (2.8 sd / sqrt(n))."""

import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent
OLD = HERE.parent / "scorer-speed-2026-12-04" / "seeds"
SEED0_FP32 = {"valid": [7, 6], "eligible": [2, 3]}  # bench step, seed 0 (that README)
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
       10: 2.23, 11: 2.20, 12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13}


def steps(path: Path) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if "valid" in r]


def main(seeds: list[int]) -> dict:
    out = {}
    for key in ("valid", "eligible"):
        pairs = []
        for s in seeds:
            new = json.loads((HERE / "bench_step_auto.json").read_text())[key] if s == 0 else \
                [r[key] for r in steps(HERE / "seeds" / f"metrics_auto_seed{s}.jsonl")]
            old = SEED0_FP32[key] if s == 0 else \
                [r[key] for r in steps(OLD / f"metrics_new_seed{s}.jsonl")]
            pairs += list(zip(old, new, strict=True))
        d = [b - a for a, b in pairs]
        n, mean = len(d), statistics.mean(d)
        sd = statistics.stdev(d) if n > 1 else 0.0
        half = T95.get(n - 1, 2.0) * sd / math.sqrt(n)
        out[key] = {"n": n, "float32": statistics.mean(a for a, _ in pairs),
                    "bfloat16": statistics.mean(b for _, b in pairs), "difference": mean,
                    "ci95": [mean - half, mean + half], "detectable": 2.8 * sd / math.sqrt(n)}
    secs = [r["step_seconds"] for s in seeds if s
            for r in steps(HERE / "seeds" / f"metrics_auto_seed{s}.jsonl")]
    out["step_seconds_bfloat16"] = {"mean": statistics.mean(secs), "min": min(secs),
                                    "max": max(secs)}
    return out


if __name__ == "__main__":
    print(json.dumps(main([int(x) for x in sys.argv[1:]] or [0, 1, 2, 3]), indent=1))
