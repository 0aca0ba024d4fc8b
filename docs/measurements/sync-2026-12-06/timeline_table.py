"""Print the actor calls of a Ray timeline (from ray_timeline_run.py) that took over 50 ms:
start and duration in seconds from the first event, and the call's name."""
# ruff: noqa
import json
import sys

ev = [e for e in json.load(open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tl/timeline.json"))
      if e.get("ph") == "X"]
t0 = min(e["ts"] for e in ev)
for start, dur, name in sorted(((e["ts"] - t0) / 1e6, e["dur"] / 1e6, e["name"]) for e in ev):
    if dur > 0.05 and name in ("snapshot", "run_stage", "task:store_outputs"):
        print(f"{start:8.2f} {dur:7.2f} {name}")
