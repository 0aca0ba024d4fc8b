"""Minor page faults, CPU seconds and wall seconds per phase of format-bootstrap batches.

    boot_batches.py none|zero N

runs the default config's first N bootstrap batches (the first left out of the means) with
zero_grad(set_to_none=True) (`none`) or False (`zero`); THP_MEM_ALLOC_ENABLE is taken from
the environment (this script does not call `host_memory.prefer_huge_pages`)."""

import random
import resource
import sys
import time

import torch

from compassplay.config import load_config
from compassplay.models.loading import load_model
from compassplay.warmup.bootstrap import examples
from compassplay.warmup.sft import completion_loss

PHASES = ("fwd", "bwd", "clip", "opt", "zero")


def usage() -> tuple[int, float, float]:
    """(minor faults, CPU seconds, wall seconds) so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt, r.ru_utime + r.ru_stime, time.perf_counter()


cfg = load_config("compassplay/configs/default.yaml")
model, tok = load_model(cfg.model, seed=0)
exs = examples(cfg, tok, random.Random(0))
random.Random(0).shuffle(exs)
exs.sort(key=lambda e: e.kind)
batches = [exs[i:i + 4] for i in range(0, len(exs), 4)][:int(sys.argv[2])]
torch.set_num_threads(2)
opt = torch.optim.AdamW(model.parameters(), lr=3e-5, betas=(0.9, 0.98), weight_decay=0.0)
model.train()
acc = {k: [0, 0.0, 0.0] for k in PHASES}
for i, batch in enumerate(batches):
    marks = [usage()]
    loss = completion_loss(model, batch, tok.pad_token_id)
    marks.append(usage())
    loss.backward()
    marks.append(usage())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    marks.append(usage())
    opt.step()
    marks.append(usage())
    opt.zero_grad(set_to_none=sys.argv[1] == "none")
    marks.append(usage())
    if i == 0:
        continue
    for k, a, c in zip(PHASES, marks[:-1], marks[1:], strict=True):
        for j in range(3):
            acc[k][j] += c[j] - a[j]
n = len(batches) - 1
print(sys.argv[1], {k: (v[0] // n, round(v[1] / n, 3), round(v[2] / n, 3)) for k, v in acc.items()})
