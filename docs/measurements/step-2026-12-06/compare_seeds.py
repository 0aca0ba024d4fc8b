"""Valid and eligible per step and the stage seconds of this session's code ("after") against
its start ("before", 140c4d9), from seeds/metrics_{before,after}_seedS.jsonl, paired by
(seed, step): `compassplay.eval.paired.paired_diff` (mean difference, bootstrap 95% interval,
sign-flip p) and the smallest difference the design detects at 80% power (2.8 sd / sqrt(n)).

    python compare_seeds.py [SEED ...] > compare_seeds.json

SEEDS_DIR (environment): where the metrics files are (default: seeds/ beside this script).
"""

import json
import math
import os
import statistics
import sys
from pathlib import Path

from compassplay.eval.paired import paired_diff

HERE = Path(__file__).parent
SEEDS = Path(os.environ.get("SEEDS_DIR", HERE / "seeds"))
STAGES = ("propose", "solve", "score", "learn")


def rows(arm: str, seed: int) -> list[dict]:
    path = SEEDS / f"metrics_{arm}_seed{seed}.jsonl"
    return [r for r in map(json.loads, path.read_text().splitlines()) if "valid" in r]


def compare(seeds: list[int], key) -> dict:
    arms = {arm: {(s, r["step"]): float(key(r)) for s in seeds for r in rows(arm, s)}
            for arm in ("before", "after")}
    d = paired_diff(arms["after"], arms["before"])
    diffs = [arms["after"][k] - arms["before"][k] for k in sorted(arms["before"])]
    sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    return {"n": d.n, "before": statistics.fmean(arms["before"].values()),
            "after": statistics.fmean(arms["after"].values()), "difference": d.mean,
            "ci95": [d.ci_low, d.ci_high], "sign_flip_p": d.p,
            "detectable_80": 2.8 * sd / math.sqrt(len(diffs))}


def main(seeds: list[int]) -> dict:
    out = {k: compare(seeds, lambda r, k=k: r[k]) for k in ("valid", "eligible")}
    out["step_seconds"] = compare(seeds, lambda r: r["step_seconds"])
    for stage in STAGES:
        out[f"{stage}_seconds"] = compare(seeds, lambda r, st=stage: r["stage_seconds"][st])
    return out


if __name__ == "__main__":
    print(json.dumps(main([int(x) for x in sys.argv[1:]] or [0, 1, 2, 3]), indent=1))
