"""Where a bfloat16 decode step of the static decoder goes (torch profiler, 20 steps after 60);
run from the checkout: `python docs/measurements/kernels-2026-12-06/decode_step_profile.py 1`."""

import sys
import time

import torch

from compassplay.bench.generate import MODELS
from compassplay.engines.generation.static_decoder import StaticDecoder
from compassplay.models import load_model

torch.set_num_threads(2)
model, tok = load_model(MODELS["smollm2"], seed=0)
model.eval()
B, T, N = 16, 64, 128
dec = StaticDecoder(model, dtype=torch.bfloat16)
g = torch.Generator().manual_seed(0)
ids = torch.randint(100, 40000, (B, T), generator=g)
pad = torch.zeros(B, dtype=torch.long)
with torch.inference_mode():
    t0 = time.perf_counter()
    logits = dec.start(ids, pad, T + N)
    tp = time.perf_counter() - t0
    tok_ = logits.argmax(-1)
    times = []
    for _i in range(N - 1):
        t0 = time.perf_counter()
        logits = dec.step(tok_)
        times.append(time.perf_counter() - t0)
        tok_ = logits.argmax(-1)
times.sort()
print(
    f"prefill {tp:.3f}s  step p10 {times[len(times) // 10] * 1e3:.2f} med {times[len(times) // 2] * 1e3:.2f} ms total {sum(times):.2f}"
)
if len(sys.argv) > 1:
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        dec.start(ids, pad, T + N)
        tok_ = ids[:, 0]
        for _i in range(60):
            dec.step(tok_)
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for _i in range(20):
                dec.step(tok_)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
