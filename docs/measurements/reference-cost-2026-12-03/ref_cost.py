"""Time g_ref (set_reference) on the default scorer for the project's 8 items vs the paper's 32."""
import json
import sys
import time

from compassplay.config import load_config
from compassplay.models import load_model
from compassplay.rewards.gradient import GradientScorer
from compassplay.workers.builders import configure_torch, make_reference, scorer_params

out = {}
for name, ov in [("project8", ["reference.path=reference_math.jsonl", "reference.max_items=8"]), ("paper8", ["reference.path=reference_math_paper32.jsonl", "reference.max_items=8"]),
                 ("paper32", ["reference.path=reference_math_paper32.jsonl", "reference.max_items=32"])]:
    cfg = load_config("default", ov)
    configure_torch(cfg)
    if "model" not in out:
        model, tok = load_model(cfg.model, seed=0)
        out["model"] = cfg.model.source
    ref = make_reference(cfg, tok)
    sc = GradientScorer(model, params=scorer_params(cfg.scorer.params, model), pad_id=tok.pad_token_id,
                        max_batch_tokens=cfg.scorer.max_batch_tokens, cpu_pass_tokens=cfg.scorer.cpu_pass_tokens)
    times = []
    for rep in range(3):
        sc.weight_version = rep + 1 if hasattr(sc, "weight_version") else None
        t = time.perf_counter()
        sc.set_reference(ref)
        times.append(time.perf_counter() - t)
    out[name] = {"items": len(ref), "target_tokens": sum(len(e.target_ids) for e in ref),
                 "tokens": sum(len(e) for e in ref), "seconds": times}
    print(name, out[name], file=sys.stderr)
print(json.dumps(out, indent=1))
