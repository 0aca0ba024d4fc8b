"""The static decoder's bfloat16 prefill at 16 x 64, three times, then its torch profile."""

import time

import torch
from torch.profiler import profile

from compassplay.bench.generate import MODELS
from compassplay.engines.generation.static_decoder import StaticDecoder
from compassplay.models import load_model

torch.set_num_threads(2)
model, tok = load_model(MODELS["smollm2"], seed=0)
B, T, N = 16, 64, 128
dec = StaticDecoder(model, dtype=torch.bfloat16)
ids = torch.randint(100, 40000, (B, T), generator=torch.Generator().manual_seed(0))
pad = torch.zeros(B, dtype=torch.long)
with torch.inference_mode():
    for _r in range(3):
        t0 = time.perf_counter()
        dec.start(ids, pad, T + N)
        print("prefill", time.perf_counter() - t0)
    with profile() as p:
        dec.start(ids, pad, T + N)
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
