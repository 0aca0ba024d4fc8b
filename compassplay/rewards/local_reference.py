"""Gradient alignment against local references: each candidate has its own reference example.

A candidate written from seed k is scored against g_ref_k, the gradient of the solver's loss
on its verified solution of that seed (prompt = the seed's solver prompt, target = the seed's
proof), instead of one global reference set:

    cosine_i = <g_i, g_ref_k(i)> / (|g_i| |g_ref_k(i)|)

Many candidates share a seed, so the K distinct references are differentiated once (one
batched pass over the K reference examples), then every candidate's per-sample gradient is
computed in batched passes (`torch.func`: `vmap` of `grad` of the per-example loss through
`functional_call`) and reduced at once against the reference of its own seed: inner products
and squared norms, accumulated in float64.

Memory: a pass holds the per-sample gradients of its micro-batch, B x P float32 values
(B examples, P scored parameters) plus B copies of the activations, so `max_batch_tokens`
(padded tokens per pass) bounds B. Exact, and meant for small models or a restricted set of
scored parameters (`params`); the subspace/hook scorers cover large ones with a global
reference.
"""

from __future__ import annotations

import fnmatch
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from compassplay.rewards.batch import Example, make_batch, plan_batches, scoring_mode
from compassplay.rewards.functions import safe_cosine

LocalScore = tuple[float, float, float]  # (cosine, inner, grad_norm)


def select_params(model: nn.Module, params: str | list[str] = "all") -> dict[str, nn.Parameter]:
    """Trainable parameters to score: 'all', or those matching any of the name globs."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if params != "all":
        named = [(n, p) for n, p in named if any(fnmatch.fnmatch(n, g) for g in params)]
    if not named:
        raise ValueError(f"no trainable parameters match {params!r}")
    return dict(named)


def per_sample_grads(model: nn.Module, params: dict[str, nn.Parameter], examples: list[Example],
                     pad_id: int = 0, max_batch_tokens: int = 16384):
    """Yield (indices, flat per-sample gradients (B, P) float32) per padded micro-batch."""
    dev = next(model.parameters()).device
    names = list(params)
    fixed = {n: t.detach() for n, t in model.named_parameters() if n not in params}
    fixed.update({n: b for n, b in model.named_buffers()})

    def loss_one(pvals, ids, labels, weights):
        # no position_ids/attention mask: positions 0..T-1 are the model's default, and
        # transformers' packed-sequence check on explicit position_ids cannot run under vmap
        out = functional_call(model, {**fixed, **pvals}, args=(),
                              kwargs={"input_ids": ids[None], "use_cache": False})
        logits = (out.logits if hasattr(out, "logits") else out[0])[0].float()
        ce = F.cross_entropy(logits, labels, ignore_index=-100, reduction="none")
        return (ce * weights).sum()

    per_sample = vmap(grad(loss_one), in_dims=(None, 0, 0, 0))
    pvals = {n: p.detach() for n, p in params.items()}
    for index in plan_batches(examples, max_batch_tokens):
        b = make_batch([examples[i] for i in index], index, dev, pad_id)
        with scoring_mode(model), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*batching rule.*")  # sdpa on CPU: slow
            g = per_sample(pvals, b.ids, b.labels, b.weights)
        yield index, torch.cat([g[n].reshape(len(index), -1) for n in names], dim=1)


def local_partials(model: nn.Module, cands: list[Example], refs: list[Example],
                   ref_of: list[int], params: str | list[str] = "all", pad_id: int = 0,
                   max_batch_tokens: int = 16384
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Additive float64 partials over the scored parameters, each (N,): <g_i, g_ref_k(i)>,
    |g_i|^2 and |g_ref_k(i)|^2; candidate i is scored against `refs[ref_of[i]]` (the K
    references are differentiated once, in one batched pass). Partials over disjoint
    parameter sets add up (parameter-sharded scorers)."""
    if len(ref_of) != len(cands):
        raise ValueError(f"ref_of has {len(ref_of)} entries for {len(cands)} candidates")
    if any(not 0 <= k < len(refs) for k in ref_of):
        raise ValueError(f"ref_of indexes outside the {len(refs)} references")
    inner = torch.zeros(len(cands), dtype=torch.float64)
    sq = torch.zeros(len(cands), dtype=torch.float64)
    if not cands:
        return inner, sq, sq.clone()
    chosen = select_params(model, params)
    ref_g = torch.zeros(len(refs), sum(p.numel() for p in chosen.values()), dtype=torch.float64)
    for index, g in per_sample_grads(model, chosen, refs, pad_id, max_batch_tokens):
        ref_g[index] = g.double().cpu()
    k = torch.tensor(ref_of)
    for index, g in per_sample_grads(model, chosen, cands, pad_id, max_batch_tokens):
        g = g.double().cpu()
        ix = torch.tensor(index)
        inner[ix] = (g * ref_g[k[ix]]).sum(1)
        sq[ix] = (g * g).sum(1)
    return inner, sq, (ref_g * ref_g).sum(1)[k]


def finalize_local(inner: list[float], sq: list[float], ref_sq: list[float]
                   ) -> list[LocalScore]:
    """(cosine, inner, grad_norm) per candidate from summed partials."""
    out = []
    for a, b, r in zip(inner, sq, ref_sq, strict=True):
        norm = max(float(b), 0.0) ** 0.5
        out.append((safe_cosine(float(a), norm, max(float(r), 0.0) ** 0.5), float(a), norm))
    return out


def local_scores(model: nn.Module, cands: list[Example], refs: list[Example],
                 ref_of: list[int], params: str | list[str] = "all", pad_id: int = 0,
                 max_batch_tokens: int = 16384) -> list[LocalScore]:
    """(cosine, inner, grad_norm) per candidate against its own reference `refs[ref_of[i]]`."""
    inner, sq, ref_sq = local_partials(model, cands, refs, ref_of, params, pad_id,
                                       max_batch_tokens)
    return finalize_local(inner.tolist(), sq.tolist(), ref_sq.tolist())


def group_references(pairs: list[tuple[list[int], list[int]]]) -> tuple[list[Example], list[int]]:
    """Distinct reference examples and, per candidate, the index of its own: `pairs[i]` is
    candidate i's (ref_prompt_ids, ref_target_ids)."""
    refs: list[Example] = []
    seen: dict[tuple, int] = {}
    ref_of = []
    for prompt, target in pairs:
        key = (tuple(prompt), tuple(target))
        if key not in seen:
            seen[key] = len(refs)
            refs.append(Example(list(prompt), list(target)))
        ref_of.append(seen[key])
    return refs, ref_of
