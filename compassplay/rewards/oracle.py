"""The plain autograd oracle: one `torch.autograd.grad` per candidate, flattened.

Used by the tests as ground truth, by `bench scorer` as the naive baseline, and by the scorer as
the exact fallback for parameters the batched hooks cannot handle. Never touches `.grad`.
The oracle's own gradients (`per_example_grads`, `reference_grads`) take every position's
logits, so they do not share the scorer's dropping of prompt logits; the naive loop and the
fallback use the same loss as the scorer.

A candidate is one `Example` or the examples of its verified solutions (`batch.CandidateExamples`);
its loss is the mean of their losses, so its gradient is the mean of the per-solution gradients.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from .batch import CandidateExamples, Example, Solutions, example_loss, scoring_mode, solution_sets
from .subspace import CountSketch


def per_example_grads(model: nn.Module, params: dict[str, nn.Parameter],
                      examples: list[CandidateExamples]) -> Iterator[dict[str, torch.Tensor]]:
    """Yield, per candidate, the float32 gradient of its loss w.r.t. each named parameter: of
    one example's loss, or of the mean of a list of examples' losses (one autograd call)."""
    names, plist = list(params), list(params.values())
    for ex in examples:
        exs = [ex] if isinstance(ex, Example) else list(ex)
        with scoring_mode(model):
            loss = torch.stack([example_loss(model, e, all_logits=True) for e in exs]).mean()
            grads = torch.autograd.grad(loss, plist, allow_unused=True)
        yield {n: (torch.zeros_like(p, dtype=torch.float32) if g is None else g.float())
               for n, p, g in zip(names, plist, grads, strict=True)}


def reference_grads(model: nn.Module, params: dict[str, nn.Parameter],
                    ref: list[Example]) -> dict[str, torch.Tensor]:
    """Gradient of `mean_j loss(ref_j)` (each loss computed unpadded), one autograd call."""
    if not ref:
        raise ValueError("reference set is empty")
    with scoring_mode(model):
        loss = torch.stack([example_loss(model, ex, all_logits=True) for ex in ref]).mean()
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return {n: (torch.zeros_like(p, dtype=torch.float32) if g is None else g.float().detach())
            for (n, p), g in zip(params.items(), grads, strict=True)}


def flatten(grads: dict[str, torch.Tensor], sketch: CountSketch | None = None,
            params: dict[str, nn.Parameter] | None = None) -> torch.Tensor:
    """Concatenate per-parameter grads into one float64 vector, or project them (sketch)."""
    if sketch is None:
        return torch.cat([g.reshape(-1).double() for g in grads.values()])
    assert params is not None
    return sum(sketch.project(n, params[n], g.unsqueeze(0))[0].double()
               for n, g in grads.items())


def naive_partials(model: nn.Module, params: dict[str, nn.Parameter],
                   ref: dict[str, torch.Tensor], cands: list[CandidateExamples | Solutions],
                   sketch: CountSketch | None = None,
                   metric: dict[str, torch.Tensor] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-candidate (inner (N,), squared norm (N,), projection (N, dim) or None), float64.

    Exact mode: inner and squared norm against `ref` over `params`; with `metric` (a positive
    tensor per parameter name) the squared norm is `sum M g^2` and the inner product is still
    taken against `ref` as given (pass M g_ref for `<g, M g_ref>`). Projection mode: the
    projected gradients (inner/sq are then filled from the projection by the caller). A
    candidate with several solutions: one solution's forward and backward at a time, its
    weighted gradient summed into float32 buffers of the parameters' size (the activations
    held are one solution's)."""
    if metric is not None and sketch is not None:
        raise ValueError("naive_partials: a metric needs exact mode, not a projection")
    inner = torch.zeros(len(cands), dtype=torch.float64)
    sq = torch.zeros(len(cands), dtype=torch.float64)
    proj = None if sketch is None else torch.zeros(len(cands), sketch.dim, dtype=torch.float64)
    names, plist = list(params), list(params.values())
    for i, sol in enumerate(solution_sets(cands)):
        grads = _candidate_grads(model, plist, sol)
        if sketch is not None:
            proj[i] = flatten({n: (torch.zeros_like(p, dtype=torch.float32) if g is None
                                   else g.float()) for n, p, g in zip(names, plist, grads,
                                                                     strict=True)},
                              sketch, params)
            continue
        # One parameter at a time in float64 (no model-sized float64 vector: 57 GiB at 7B).
        for n, g in zip(names, grads, strict=True):
            if g is not None:
                g64 = g.reshape(-1).double()
                inner[i] += float(g64 @ ref[n].reshape(-1).double())
                mg = g64 if metric is None else g64 * metric[n].reshape(-1).to(g64)
                sq[i] += float(mg @ g64)
        del grads
    return inner, sq, proj


def _candidate_grads(model: nn.Module, plist: list[nn.Parameter],
                     sol: Solutions) -> list[torch.Tensor | None]:
    """Gradient of `sum_j w_j loss_j` w.r.t. `plist`, one solution's graph at a time."""
    total: list[torch.Tensor | None] = [None] * len(plist)
    for ex, w in zip(sol.examples, sol.weights, strict=True):
        with scoring_mode(model):
            loss = example_loss(model, ex)
            grads = torch.autograd.grad(loss if sol.k == 1 else loss * w, plist,
                                        allow_unused=True)
        if sol.k == 1:
            return list(grads)
        for j, g in enumerate(grads):
            if g is not None:
                total[j] = g.float() if total[j] is None else total[j].add_(g.float())
    return total
