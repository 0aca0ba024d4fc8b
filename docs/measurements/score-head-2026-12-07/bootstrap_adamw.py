"""The format bootstrap's training, torch's per-tensor AdamW loop against its fused kernel,
in one process on the same examples (2 threads), in the order given.

    python bootstrap_adamw.py loop fused
"""
import json
import random
import sys
import time

import torch

from compassplay.config import load_config
from compassplay.models.loading import load_model
from compassplay.warmup import bootstrap as B

torch.set_num_threads(2)
cfg = load_config("default", ["run.output_dir=/tmp/x"])
out = {}
real = torch.optim.AdamW
for arm in sys.argv[1:]:
    model, tok = load_model(cfg.model, seed=cfg.run.seed)
    exs = B.examples(cfg, tok, random.Random(cfg.bootstrap.seed))
    torch.manual_seed(cfg.bootstrap.seed)
    B.torch.optim.AdamW = (lambda *a, **k: real(*a, **{**k, "fused": False})) if arm == "loop" else real
    t = time.perf_counter()
    losses = B.train(model, exs, tok.pad_token_id, cfg.bootstrap, cfg.bootstrap.seed, None)
    out[arm] = {"seconds": round(time.perf_counter() - t, 1), "epoch_loss": losses}
    print(arm, out[arm], flush=True)
B.torch.optim.AdamW = real
print(json.dumps(out))
