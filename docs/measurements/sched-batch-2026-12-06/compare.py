"""Pair the series' runs by repetition: step seconds and stages, normal vs batch."""

import json
import math
import statistics as st
import sys
from pathlib import Path

D = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "series")
T95 = {
    1: 12.71,
    2: 4.30,
    3: 3.18,
    4: 2.78,
    5: 2.57,
    6: 2.45,
    7: 2.36,
    8: 2.31,
    9: 2.26,
    10: 2.23,
    11: 2.20,
    12: 2.18,
    13: 2.16,
    14: 2.14,
    15: 2.13,
    16: 2.12,
    17: 2.11,
    18: 2.10,
    19: 2.09,
}


def load(mode, i):
    f = D / f"metrics_{mode}_{i}.jsonl"
    if not f.exists():
        return None
    return [json.loads(line) for line in open(f)]


def niv(mode, i):
    f = D / f"niv_{mode}_{i}.json"
    try:
        return json.load(open(f))
    except Exception:
        return {}


reps = sorted({int(p.stem.split("_")[-1]) for p in D.glob("metrics_*_*.jsonl")})
keys = ["step_seconds", "wall_seconds", "propose", "solve", "score", "learn", "valid", "eligible"]
pairs = {k: [] for k in keys}
rows = []
for i in reps:
    a, b = load("normal", i), load("batch", i)
    if not a or not b:
        continue
    for s in range(min(len(a), len(b))):
        for k in keys:
            va = a[s].get(k, a[s]["stage_seconds"].get(k) if k in a[s]["stage_seconds"] else None)
            vb = b[s].get(k, b[s]["stage_seconds"].get(k) if k in b[s]["stage_seconds"] else None)
            pairs[k].append((va, vb))
    rows.append(
        {
            "rep": i,
            "normal_steps": [round(x["step_seconds"], 1) for x in a],
            "batch_steps": [round(x["step_seconds"], 1) for x in b],
            "normal_walls": [round(x["wall_seconds"], 1) for x in a],
            "batch_walls": [round(x["wall_seconds"], 1) for x in b],
            "nivcsw_normal": niv("normal", i),
            "nivcsw_batch": niv("batch", i),
        }
    )
out = {
    "runs": rows,
    "paired_by": "(repetition, step)",
    "n": len(pairs["step_seconds"]),
    "compare": {},
}
for k, ps in pairs.items():
    d = [vb - va for va, vb in ps]
    n = len(d)
    if n < 2:
        continue
    m, sd = st.mean(d), st.stdev(d)
    half = T95.get(n - 1, 2.0) * sd / math.sqrt(n)
    out["compare"][k] = {
        "normal": round(st.mean(v[0] for v in ps), 2),
        "batch": round(st.mean(v[1] for v in ps), 2),
        "diff": round(m, 2),
        "ci95": [round(m - half, 2), round(m + half, 2)],
        "detectable_80pct_power": round(2.8 * sd / math.sqrt(n), 2),
        "normal_max": round(max(v[0] for v in ps), 1),
        "batch_max": round(max(v[1] for v in ps), 1),
    }
print(json.dumps(out, indent=1))
