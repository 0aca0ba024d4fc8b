"""The static decoder in bfloat16 at 16 x 64 + 128 (SmolLM2-135M, 2 threads), run from the
checkout:

    .venv/bin/python docs/measurements/kernels-2026-12-06/prefill_and_faults.py prefill
        the prefill three times, then its torch profile
    .venv/bin/python docs/measurements/kernels-2026-12-06/prefill_and_faults.py faults
        minor page faults and ms per decode step in the first and the second decode of one
        process
"""

import resource
import sys
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


def prefill() -> None:
    for _r in range(3):
        t0 = time.perf_counter()
        dec.start(ids, pad, T + N)
        print("prefill s", time.perf_counter() - t0)
    with profile() as p:
        dec.start(ids, pad, T + N)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def faults() -> None:
    for _rep in range(2):
        tok_ = dec.start(ids, pad, T + N).argmax(-1)
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for _i in range(N - 1):
            tok_ = dec.step(tok_).argmax(-1)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        print("decode minflt/step", (r1.ru_minflt - r0.ru_minflt) / (N - 1),
              "ms/step", (time.perf_counter() - t0) / (N - 1) * 1e3)


with torch.inference_mode():
    {"prefill": prefill, "faults": faults}[sys.argv[1]]()
