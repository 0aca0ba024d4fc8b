"""Share of py-spy samples (raw format) under a stage: python pyspy_stage_share.py RAW NAME [N]."""

import collections
import sys

stage = sys.argv[2]
tot = collections.Counter()
n = 0
for line in open(sys.argv[1]):
    stack, cnt = line.rsplit(" ", 1)
    cnt = int(cnt)
    if stage not in stack:
        continue
    frames = stack.split(";")
    n += cnt
    seen = set()
    for f in frames:
        name = f.split(" (")[0] + " " + f.split("/")[-1].rstrip(")")
        if name not in seen:
            seen.add(name)
            tot["INCL " + name] += cnt
    leaf = frames[-1]
    tot["LEAF " + leaf.split(" (")[0] + " " + leaf.split("/")[-1].rstrip(")")] += cnt
print(stage, "samples", n)
for k, v in tot.most_common(int(sys.argv[3]) if len(sys.argv) > 3 else 60):
    if v / n > 0.015:
        print(f"{v / n:6.1%} {k}")
