"""Gradient-alignment scorer: r_cos = cos(g(x), g_ref) for many candidates in batched passes.

    scorer = GradientScorer(model, params="all")   # or name globs, or a projection spec
    scorer.set_reference(ref)                      # list[Example]; g_ref at the current weights
    scores = scorer.score(cands)                   # list[AlignmentScore], input order

g(x) is the gradient of a candidate's loss (mean token cross-entropy of `target_ids` given
`prompt_ids`, nats; for a candidate given as several examples -- its verified solutions --
the mean over them of each one's mean token cross-entropy, i.e. g(x) is the mean of the
per-solution gradients) and g_ref the gradient of the mean of the reference examples' losses,
both w.r.t. the selected parameters at the current weights, in eval mode (no dropout).
All solutions of a candidate share one micro-batch (`batch.plan_solution_batches`), so the
hooks see the cross terms of their summed gradient; a candidate whose rows exceed
`max_batch_tokens` (several solutions x longest) is scored by the exact loop instead (one
solution's activations at a time plus gradient buffers of the scored parameters' size). Per-layer math
is float32 and sums are float64. The model's weights, `.grad` fields, requires_grad flags and
train/eval modes are left exactly as they were.

Preconditioned cosine (`set_metric`): with a positive diagonal metric M (the learner's AdamW
preconditioner, `preconditioner.adamw_metric`) every inner product and norm is taken in M:
cosine = cos_M(g, g_ref) = <g, M g_ref> / sqrt(<g, M g> <g_ref, M g_ref>). The per-layer
handlers get M g_ref as the reference (their inner products unchanged) and weight their
squared norms by M; Linear weights then take the materialized path (the ghost Gram formula
cannot weight by M). Exact mode only (no projection).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .alignment import AlignmentScore, Partials, finalize
from .batch import (
    Batch,
    CandidateExamples,
    Example,
    batch_losses,
    make_batch,
    make_solutions_batch,
    plan_batches,
    plan_solution_batches,
    scoring_mode,
    solution_sets,
)
from .frozen_prefix import PrefixCache, kept_states_agree, layers_from, shortest_row
from .oracle import naive_partials
from .per_sample import PerSampleEngine, grads_only_for
from .reductions import rowsum
from .subspace import CountSketch, ParamsSpec, ProjectionSpec, parse_spec, select_params

log = logging.getLogger(__name__)

__all__ = ["Example", "GradientScorer", "ProjectionSpec", "StaleMetricError",
           "StaleReferenceError"]


class StaleReferenceError(RuntimeError):
    """The reference gradient was computed at other weights than the scorer's current ones."""


class StaleMetricError(RuntimeError):
    """The metric was set at other weights than the scorer's current ones."""


@dataclass
class Reference:
    """g_ref per parameter (float32, detached), its squared norm (`<g_ref, M g_ref>` under a
    metric), its weight version, and whether a metric was in force (`metric`)."""

    grads: dict[str, torch.Tensor]
    sq: float
    proj: torch.Tensor | None
    weight_version: int
    n_examples: int
    metric: bool = False


class GradientScorer:
    """Scores candidates by the alignment of their loss gradient with a reference gradient.

    params: "all" (every trainable parameter), a list of fnmatch globs over
    `model.named_parameters()` names, or a projection spec (`ProjectionSpec` or
    `{"kind": "projection", "dim": k, "seed": s, "include": [globs]}`).
    max_batch_tokens: padded tokens per batched pass (memory knob; a candidate's solutions
    count as its rows x its longest row, and one with several solutions over it is scored by
    the exact loop). cpu_pass_tokens: on a CPU,
    passes of at most this many padded tokens (0: max_batch_tokens only): a pass's activations
    then stay in cache, and at SmolLM2-135M's shape 1,280-token passes scored 16 x 320 tokens
    in 20.4 s against 25.1 s in one pass (2 threads). path: "auto", "ghost" or "materialize"
    for linear layers. chunk_bytes: bound on per-layer per-sample temporaries.
    reference_autocast: the reference gradient's passes (and its kept prefix states) run under
    `torch.autocast(dtype)` (None: the model's dtype); g_ref is still accumulated in float32
    and the candidates' passes are untouched.
    """

    def __init__(self, model: nn.Module, params: ParamsSpec = "all", *,
                 max_batch_tokens: int = 16384, cpu_pass_tokens: int = 1280,
                 path: str = "auto",
                 chunk_bytes: int = 64 << 20, weight_version: int = 0, pad_id: int = 0,
                 reference_autocast: torch.dtype | None = None) -> None:
        self.model = model
        self.reference_autocast = reference_autocast
        globs, self.projection = parse_spec(params)
        self.params = select_params(model, globs)
        self.sketch = None if self.projection is None else CountSketch(
            self.projection.dim, self.projection.seed)
        self.engine = PerSampleEngine(model, self.params, self.sketch, path, chunk_bytes)
        self.max_batch_tokens = max_batch_tokens
        self.cpu_pass_tokens = cpu_pass_tokens
        self.weight_version = int(weight_version)
        self.pad_id = pad_id
        self.reference: Reference | None = None
        self.metric: dict[str, torch.Tensor] | None = None
        self.metric_version: int | None = None
        self._dot_ref: dict[str, torch.Tensor] = {}  # g_ref, or M g_ref under a metric
        self.oversize = 0  # candidates scored by the exact loop: k solutions > max_batch_tokens
        # the reference's hidden states below the lowest scored layer, kept across versions
        # whose prefix is unchanged (`frozen_prefix`); checked against the plain forward once
        self.prefix = PrefixCache(model, self.params.values())
        self._prefix_checked = False

    @property
    def device(self) -> torch.device:
        return next(iter(self.params.values())).device

    @property
    def pass_tokens(self) -> int:
        """Padded tokens per batched pass on this scorer's device."""
        if self.device.type == "cpu" and self.cpu_pass_tokens > 0:
            return min(self.max_batch_tokens, self.cpu_pass_tokens)
        return self.max_batch_tokens

    @property
    def layer_paths(self) -> dict[str, list[str]]:
        """Per module name, the paths used so far: ghost, materialize, sparse-rows, vmap, loop."""
        out = {k: sorted(v) for k, v in self.engine.paths.items()}
        for n in self.engine.fallback:
            out.setdefault(n, []).append("loop")
        return out

    def cost_report(self) -> dict[str, dict]:
        """Per module, the cost model's last decision (path and its inputs), for the bench."""
        return dict(self.engine.decisions)

    @contextlib.contextmanager
    def profiling(self) -> Iterator[dict]:
        """Times the scoring calls made inside the block; on exit the yielded dict holds
        `summary` (seconds of the forward, the input-gradient half of the backward, and the
        hooks' own work) and `hooks_by_kind` (per layer kind, the last module-name part such as
        `lm_head`, `q_proj`, `input_layernorm`: seconds, flops and flop rate)."""
        ctx, out = self.engine.ctx, {}
        ctx.timings, ctx.flops = {}, {}
        t0 = time.perf_counter()
        try:
            yield out
        finally:
            total, t, flops = time.perf_counter() - t0, ctx.timings, ctx.flops
            ctx.timings = None
        hooks = {k: v for k, v in t.items() if k not in ("forward", "backward")}
        out["summary"] = {
            "total_s": round(total, 3), "forward_s": round(t.get("forward", 0.0), 3),
            "input_grad_backward_s": round(t.get("backward", 0.0) - sum(hooks.values()), 3),
            "hooks_s": round(sum(hooks.values()), 3)}
        out["hooks_by_kind"] = {
            k: {"s": round(v, 3), "gflop": round(flops.get(k, 0) / 1e9, 2),
                "gflop_per_s": round(flops.get(k, 0) / 1e9 / v, 1) if v > 0 else None}
            for k, v in sorted(hooks.items(), key=lambda kv: -kv[1])}

    def profile(self, cands: list[CandidateExamples]) -> dict:
        """One profiled `partials(cands)` (see `profiling`)."""
        with self.profiling() as prof:
            self.partials(cands)
        return prof

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Load new weights into the model and mark them as `version`. The reference's kept
        prefix states survive when the load leaves the layers below the scored ones as they
        were (compared exactly, `PrefixCache.unchanged_by`)."""
        keep = self.prefix.unchanged_by(state_dict)
        self.model.load_state_dict(state_dict)
        if keep:
            self.prefix.restamp()
        self.weight_version = int(version)

    # metric ------------------------------------------------------------------------------------
    def set_metric(self, metric: dict[str, torch.Tensor] | None) -> None:
        """Score in the diagonal metric M (None: the plain metric) from now on.

        `metric`: per selected parameter name (`self.params`; other names are ignored, so a
        caller may pass a larger map, e.g. every trainable parameter's), a finite positive
        tensor of that parameter's shape, e.g. `preconditioner.adamw_metric` of the learner's
        AdamW state at the current weights. Exact mode only: a projecting scorer raises
        ValueError. The reference is dropped: call `set_reference` after this (g_ref itself
        does not depend on M, its norm and the handlers' reference M g_ref do).

        The metric belongs to a weight version: it is marked with the current
        `weight_version`, and `set_reference` refuses a metric set at another version
        (StaleMetricError). Whoever loads new weights (`load_weights`) must therefore call
        `set_metric` again with the metric of those weights (the scorer worker does, from the
        learner's snapshot of the same version), or `set_metric(None)` for the plain cosine."""
        self.reference = None
        if metric is None:
            self.metric, self.metric_version = None, None
            self.engine.set_metric(None)
            return
        if self.sketch is not None:
            raise ValueError("a preconditioned (metric) cosine needs exact mode: this scorer "
                             "projects its gradients (params is a projection spec)")
        missing = [n for n in self.params if n not in metric]
        if missing:
            raise ValueError(f"metric has no tensor for {len(missing)} scored parameter(s), "
                             f"e.g. {missing[:3]}")
        out = {}
        for n, p in self.params.items():
            m = metric[n].detach()
            if tuple(m.shape) != tuple(p.shape):
                raise ValueError(f"metric[{n!r}] has shape {tuple(m.shape)}, the parameter "
                                 f"{tuple(p.shape)}")
            m = m.to(device=p.device, dtype=torch.float32)
            if not bool(torch.isfinite(m).all()) or not bool((m > 0).all()):
                raise ValueError(f"metric[{n!r}] must be finite and positive everywhere")
            out[n] = m
        self.metric, self.metric_version = out, self.weight_version
        self.engine.set_metric(out)

    # reference ---------------------------------------------------------------------------------
    def _reference_numerics(self) -> contextlib.AbstractContextManager:
        """The autocast region of the reference's passes (`reference_autocast`), or none."""
        if self.reference_autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.reference_autocast)

    def set_reference(self, ref: list[Example]) -> None:
        """Compute and store g_ref (and its norm, in the metric if one is set) at the current
        weights and weight_version."""
        self._set_reference(ref, len(ref), None)

    def _set_reference(self, ref: list[Example], n_total: int,
                       reduce: Callable[[torch.Tensor], None] | None) -> None:
        if n_total == 0:
            raise ValueError("reference set is empty: set_reference needs at least one Example")
        if self.metric is not None and self.metric_version != self.weight_version:
            raise StaleMetricError(
                f"the metric was set at weight version {self.metric_version} but the scorer "
                f"is at version {self.weight_version}: call set_metric with the metric of the "
                "current weights (or set_metric(None)) before set_reference")
        grads = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in self.params.items()}
        names, plist = list(self.params), list(self.params.values())
        with self._reference_numerics():
            passes, top_only = self._reference_passes(ref)
        with scoring_mode(self.model), grads_only_for(self.model, self.params), top_only, \
                self._reference_numerics():
            for batch, hidden in passes:
                loss = batch_losses(self.model, batch, inputs_embeds=hidden).sum() / n_total
                gs = torch.autograd.grad(loss, plist, allow_unused=True)
                for n, g in zip(names, gs, strict=True):
                    if g is not None:
                        grads[n] += g.detach().float()
        if reduce is not None:
            for g in grads.values():
                reduce(g)
        metric = self.metric
        dot = grads if metric is None else {n: g * metric[n] for n, g in grads.items()}
        sq = float(sum(rowsum((g.double().pow(2) if metric is None else g.double().pow(2)
                               * metric[n].double()).reshape(1, -1))[0]
                       for n, g in grads.items()))
        proj = None
        if self.sketch is not None:
            proj = sum(self.sketch.project(n, self.params[n], g.unsqueeze(0))[0].double()
                       for n, g in grads.items())
        self.reference = Reference(grads, sq, proj, self.weight_version, n_total,
                                   metric is not None)
        self._dot_ref = dot
        self.engine.set_reference(dot)

    def _reference_passes(self, ref: list[Example]
                          ) -> tuple[list[tuple[Batch, torch.Tensor | None]],
                                     contextlib.AbstractContextManager]:
        """The reference's passes and the context their losses run in: with the prefix kept,
        (Batch, hidden entering layer k) and only layers k.. running; else (Batch, None) and
        the whole model. The first kept pass is checked against the plain forward once; a
        disagreement (an architecture whose layers need more than their input) logs a warning
        and turns the cache off."""
        if self.prefix.enabled:
            passes = self.prefix.passes(ref, self.pass_tokens, self.device, self.pad_id)
            if self._prefix_checked or kept_states_agree(
                    self.model, self.prefix.k, *min(passes, key=shortest_row),
                    rounds=self.reference_autocast is not None):
                self._prefix_checked = True
                return list(passes), layers_from(self.model, self.prefix.k)
            self.prefix.disable()
        plain = [(make_batch([ref[i] for i in idx], idx, self.device, self.pad_id), None)
                 for idx in plan_batches(ref, self.pass_tokens)]
        return plain, contextlib.nullcontext()

    def check_reference(self, allow_stale: bool = False) -> Reference:
        """The current reference; raises if unset, or stale unless `allow_stale`."""
        if self.reference is None:
            raise RuntimeError("no reference gradient: call set_reference(ref) first")
        if self.reference.weight_version != self.weight_version and not allow_stale:
            raise StaleReferenceError(
                f"reference gradient was computed at weight version "
                f"{self.reference.weight_version} but the scorer is at version "
                f"{self.weight_version}; call set_reference again or pass allow_stale=True")
        return self.reference

    # scoring -----------------------------------------------------------------------------------
    def score(self, cands: list[CandidateExamples],
              allow_stale: bool = False) -> list[AlignmentScore]:
        """Alignment scores of `cands` (each an Example, or the Examples of one candidate's
        verified solutions) against the reference, in input order."""
        ref = self.check_reference(allow_stale)
        return finalize(self.partials(cands), ref.sq, ref.proj)

    def partials(self, cands: list[CandidateExamples]) -> Partials:
        """Additive per-candidate partials over this scorer's parameters (float64, on CPU);
        `cands` as in `score`."""
        n = len(cands)
        dim = None if self.sketch is None else self.sketch.dim
        out = Partials(torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64),
                       None if dim is None else torch.zeros(n, dim, dtype=torch.float64))
        if n == 0:
            return out
        sets = solution_sets(cands)
        # several solutions over the hard bound: the exact loop, one solution at a time
        big = [i for i, c in enumerate(sets) if c.k > 1 and c.k * c.width > self.max_batch_tokens]
        self.oversize += len(big)
        small = sorted(set(range(n)) - set(big))
        with scoring_mode(self.model):
            for part in plan_solution_batches([sets[i] for i in small], self.pass_tokens):
                idx = [small[i] for i in part]
                mine = [sets[i] for i in idx]
                batch = make_solutions_batch(mine, idx, self.device, self.pad_id)
                acc, declined = self.engine.run(batch)
                self._put(out, idx, acc.inner, acc.sq, acc.proj)
                loop = sorted(self.engine.fallback | declined)
                if loop:
                    params = {k: self.params[k] for k in loop}
                    ref = {k: self._dot_ref[k] for k in loop}
                    self._put(out, idx, *naive_partials(self.model, params, ref, mine,
                                                        self.sketch, self.metric))
                    for k in loop:
                        self.engine.paths.setdefault(k, set()).add("loop")
            if big:
                self._put(out, big, *naive_partials(self.model, self.params, self._dot_ref,
                                                    [sets[i] for i in big], self.sketch,
                                                    self.metric))
        return out

    @staticmethod
    def _put(out: Partials, idx: list[int], inner: torch.Tensor, sq: torch.Tensor,
             proj: torch.Tensor | None) -> None:
        ix = torch.tensor(idx)
        out.inner.index_add_(0, ix, inner.double().cpu())
        out.sq.index_add_(0, ix, sq.double().cpu())
        if out.proj is not None and proj is not None:
            out.proj.index_add_(0, ix, proj.double().cpu())

