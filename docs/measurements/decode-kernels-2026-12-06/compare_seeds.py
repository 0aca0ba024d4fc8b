"""Valid and eligible per step and the stage seconds: decode_kernels=c against torch
(seeds/metrics_EXECUTOR_{c,torch}_seedS.jsonl), paired by (seed, step): mean difference, 95% t
interval, and the smallest difference the design detects at 80% power (2.8 sd / sqrt(n)).

    python compare_seeds.py EXECUTOR SEED...   (EXECUTOR: local or ray)
"""

import json
import statistics
import sys
from pathlib import Path

from compassplay.eval.paired import t_summary

HERE = Path(__file__).parent


def steps(executor: str, kern: str, seed: int) -> list[dict]:
    path = HERE / "seeds" / f"metrics_{executor}_{kern}_seed{seed}.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if "valid" in r]


def paired(executor: str, seeds: list[int], key) -> dict:
    pairs = [(key(a), key(b)) for s in seeds
             for a, b in zip(steps(executor, "torch", s), steps(executor, "c", s), strict=True)]
    return {"torch": statistics.mean(a for a, _ in pairs),
            "c": statistics.mean(b for _, b in pairs), **t_summary([b - a for a, b in pairs])}


def main(executor: str, seeds: list[int]) -> dict:
    out = {k: paired(executor, seeds, lambda r, k=k: r[k]) for k in ("valid", "eligible")}
    out["step_seconds"] = paired(executor, seeds, lambda r: r["step_seconds"])
    for stage in ("propose", "solve", "score", "learn"):
        out[f"{stage}_seconds"] = paired(executor, seeds,
                                         lambda r, st=stage: r["stage_seconds"][st])
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], [int(x) for x in sys.argv[2:]] or [0, 1, 2, 3]),
                     indent=1))
