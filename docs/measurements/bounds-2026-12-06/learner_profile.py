# ruff: noqa  (a throwaway timer kept as it ran; see README.md)
"""Run: PYTHONPATH=<checkout> python <this file> [args] -- see README.md for what it measured."""
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

from compassplay.commands.launch import launch_run
from compassplay.config import load_config
from compassplay.engines.training import learner as L

orig = L.PolicyLearner.step
n = [0]
def step(self, trajs):
    n[0] += 1
    t0 = time.perf_counter()
    if n[0] == 2:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as p:
            out = orig(self, trajs)
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=35), file=sys.stderr)
    else:
        out = orig(self, trajs)
    print("LEARN step", n[0], "s", time.perf_counter() - t0, "trajs", len(trajs), "threads", torch.get_num_threads(), file=sys.stderr)
    return out
L.PolicyLearner.step = step
with tempfile.TemporaryDirectory() as tmp:
    cfg = load_config("default", [f"run.output_dir={tmp}", "pipeline.steps=2", "logging.progress=false"])
    launch_run(cfg, executor="local")
