# ruff: noqa  (a throwaway timer kept as it ran; see README.md)
"""Run: PYTHONPATH=<checkout> python <this file> [args] -- see README.md for what it measured."""
import sys
import time

import torch

torch.set_num_threads(2)
from compassplay.bench.generate import MODELS
from compassplay.engines.generation.static_decoder import StaticDecoder
from compassplay.models import load_model

model, tok = load_model(MODELS["smollm2"], seed=0)
model.eval()
dec = StaticDecoder(model, dtype=torch.bfloat16)
B, P, N = 16, 64, 128
g = torch.Generator().manual_seed(0)
ids = torch.randint(100, 40000, (B, P), generator=g)
pad = torch.zeros(B, dtype=torch.long)
def run(n=N):
    with torch.inference_mode():
        logits = dec.start(ids, pad, P + n)
        tok_ = logits.argmax(-1)
        ts = []
        for _ in range(n):
            t0 = time.perf_counter(); logits = dec.step(tok_); ts.append(time.perf_counter()-t0)
            tok_ = logits.argmax(-1)
    ts.sort(); return ts
run(16)
for _r in range(3):
    ts = run()
    print(f"step ms p10 {ts[len(ts)//10]*1e3:.2f} med {ts[len(ts)//2]*1e3:.2f}")
if "--prof" in sys.argv:
    from torch.profiler import ProfilerActivity, profile
    with torch.inference_mode():
        logits = dec.start(ids, pad, P + N); tok_ = logits.argmax(-1)
        for _ in range(40): logits = dec.step(tok_)
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(40): logits = dec.step(tok_)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
