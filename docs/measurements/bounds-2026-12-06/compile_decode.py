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
pack = "--pack" in sys.argv
dec = StaticDecoder(model, dtype=torch.bfloat16, pack=pack)
B, P, N = 16, 64, 128
ids = torch.randint(100, 40000, (B, P), generator=torch.Generator().manual_seed(0))
pad = torch.zeros(B, dtype=torch.long)
eager_fwd = dec._forward
def run(n=N):
    with torch.inference_mode():
        logits = dec.start(ids, pad, P + n)
        tok_ = logits.argmax(-1); out=[]; ts = []
        for _ in range(n):
            t0 = time.perf_counter(); logits = dec.step(tok_); ts.append(time.perf_counter()-t0)
            tok_ = logits.argmax(-1); out.append(tok_)
    ts.sort(); return ts, torch.stack(out,1)
ts, ref = run()
print(f"eager p10 {ts[len(ts)//10]*1e3:.2f} med {ts[len(ts)//2]*1e3:.2f}")
cf = torch.compile(eager_fwd, dynamic=True)
def fwd(x, pos, mask, t0, kv=None):
    if x.shape[1] == 1: return cf(x, pos, mask, t0)
    return eager_fwd(x, pos, mask, t0, kv)
dec._forward = fwd
t0=time.perf_counter(); ts, out = run(8); print("first compiled run s", time.perf_counter()-t0)
for _r in range(2):
    ts, out = run()
    print(f"compiled p10 {ts[len(ts)//10]*1e3:.2f} med {ts[len(ts)//2]*1e3:.2f}")
print("greedy tokens equal share", (out==ref).float().mean().item())
