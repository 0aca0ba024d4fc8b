"""Pair the default job's runs by (seed, step): bootstrap.autocast none vs auto."""
import json
import math
import statistics as st
import sys
from pathlib import Path

D = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "seeds")
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36}


def load(arm, s):
    f = D / f"metrics_{arm}_{s}.jsonl"
    return [json.loads(line) for line in open(f)] if f.exists() else None


rows, pairs = [], {"valid": [], "eligible": [], "step_seconds": []}
for s in range(8):
    a, b = load("none", s), load("auto", s)
    if not a or not b:
        continue
    rows.append({"seed": s, "valid": ([x["valid"] for x in a], [x["valid"] for x in b]),
                 "eligible": ([x["eligible"] for x in a], [x["eligible"] for x in b])})
    for x, y in zip(a, b, strict=True):
        for k in pairs:
            pairs[k].append((x[k], y[k]))
out = {"n": len(pairs["valid"]), "runs": rows, "compare": {}}
for k, ps in pairs.items():
    d = [y - x for x, y in ps]
    m, sd = st.mean(d), st.stdev(d) if len(d) > 1 else 0.0
    half = T95.get(len(d) - 1, 2.0) * sd / math.sqrt(len(d))
    out["compare"][k] = {"none": st.mean(x for x, _ in ps), "auto": st.mean(y for _, y in ps),
                         "diff": round(m, 3), "ci95": [round(m - half, 3), round(m + half, 3)],
                         "detectable_80pct_power": round(2.8 * sd / math.sqrt(len(d)), 3)}
print(json.dumps(out, indent=1))
