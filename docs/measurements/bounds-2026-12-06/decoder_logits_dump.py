# ruff: noqa  (a throwaway timer kept as it ran; see README.md)
"""Run: PYTHONPATH=<checkout> python <this file> [args] -- see README.md for what it measured."""
import sys

import torch

torch.set_num_threads(2)
from compassplay.bench.generate import MODELS
from compassplay.engines.generation.static_decoder import StaticDecoder
from compassplay.models import load_model

model, tok = load_model(MODELS["smollm2"], seed=0)
out = {}
for dt in (torch.bfloat16, torch.float32):
    dec = StaticDecoder(model, dtype=dt)
    for B, P, N in ((16, 64, 40), (4, 512, 24)):
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(100, 40000, (B, P), generator=g)
        pad = torch.randint(0, 9, (B,), generator=g); pad[0] = 0
        ids[:, 1:40] = ids[0, 1:40]  # a shared prefix for the shared prefill
        with torch.inference_mode():
            lg = [dec.start(ids, pad, P + N)]
            for _ in range(N):
                lg.append(dec.step(lg[-1].argmax(-1)))
        out[f"{dt}-{B}x{P}"] = torch.stack(lg, 1)
torch.save(out, sys.argv[1])
