"""Minor page faults and ms per decode step in the first and the second generate-sized decode of
one process (bfloat16, 16 x 64 + 128)."""

import resource
import time

import torch

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
    for _rep in range(2):
        logits = dec.start(ids, pad, T + N)
        tok_ = logits.argmax(-1)
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        for _i in range(N - 1):
            logits = dec.step(tok_)
            tok_ = logits.argmax(-1)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        print(
            "decode minflt/step",
            (r1.ru_minflt - r0.ru_minflt) / (N - 1),
            "ms/step",
            (time.perf_counter() - t0) / (N - 1) * 1e3,
        )
