# ruff: noqa
"""Run `compassplay` with its arguments and write Ray's timeline of every actor call to
/tmp/tl/timeline.json just before the run shuts Ray down."""
import os, sys, ray
os.makedirs("/tmp/tl", exist_ok=True)
_orig = ray.shutdown
def _shut(*a, **k):
    try:
        ray.timeline(filename="/tmp/tl/timeline.json")
    except Exception as e:
        print("timeline failed", e)
    return _orig(*a, **k)
ray.shutdown = _shut
from compassplay.cli import main
sys.exit(main(sys.argv[1:]))
