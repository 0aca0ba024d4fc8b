"""Per-sample gradient contributions from layer inputs and output gradients (no weight grads).

One batched forward/backward of `sum_i loss_i`. Forward hooks keep each tracked layer's input
`a` (N, T, d_in) and add a shared zero leaf `z` to its output; `autograd.grad(total, z)` then
runs the backward through every tracked output (tensor hooks receive `b = dL/d out`, and
because loss_i depends only on sample i, `b[i]` is sample i's output gradient) while the
engine skips every weight gradient (weights are not requested). Per layer, per sample:

* Linear / GPT-2 Conv1D, `G_i = sum_t b_t a_t^T`: `<G_i, V>` and `||G_i||^2`, either by
  materializing `G_i` for a chunk of samples (bmm, cost ~ T d_in d_out) or by the ghost formula
  `sum_{t,t'} (a_t.a_t')(b_t.b_t')` with `<G_i,V> = sum_t b_t^T V a_t` (cost ~ T^2 (d_in+d_out)
  + T d_in d_out); the cheaper is chosen per layer and call. Bias: `sum_t b_t`.
* Embedding: rows `ids_s` receive `e_s`; inner by gathering V rows, squared norm by summing
  `e_s` per (sample, token) exactly. A weight tied to a Linear (lm_head) adds the cross term
  `2 <L_i, E_i> = 2 sum_s e_s . L_i[ids_s]` with `L_i[ids_s] = sum_t b_t[ids_s] a_t`.
* Any other module with direct parameters (RMSNorm, LayerNorm, ...) called as `module(x)`:
  per-sample gradients by `torch.func.vmap(vjp)` of the module's own forward, recomputed from
  the kept input. Anything else (other call signatures, a module called twice, a parameter
  shared in another way, a batch dimension not equal to N) is *declined* and its parameters are
  computed by the exact per-candidate loop (`oracle.per_example_grads`): correct but slow.

A sample is a candidate: with several verified solutions (`batch.make_solutions_batch`) its
rows, weighted so that their losses sum to the candidate's mean loss, are regrouped per
candidate before the formulas above run (`handlers.PassState.regroup`), so `G_c` is the sum of
its rows' gradients and the ghost norm includes the cross terms between them.

Results accumulate in float64 per sample; per-layer math is float32.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch
from torch import nn

from .batch import Batch, batch_losses
from .handlers import Handler, make_handler, tie
from .pass_state import Accum, HandlerContext, PassState
from .subspace import CountSketch


class PerSampleEngine:
    """Classifies the selected parameters by owning module and runs batched passes.

    `sketch`: projection mode (else exact mode against `set_reference`'s gradient).
    `path`: "auto" (the cost model's cheaper path per layer), "ghost" or "materialize" for
    Linear/Conv1D layers. `chunk_bytes`: bound on the per-layer per-sample temporaries.
    """

    def __init__(self, model: nn.Module, params: dict[str, nn.Parameter],
                 sketch: CountSketch | None = None, path: str = "auto",
                 chunk_bytes: int = 64 << 20) -> None:
        if path not in ("auto", "ghost", "materialize"):
            raise ValueError(f"path must be auto, ghost or materialize, got {path!r}")
        self.model, self.params = model, params
        self.ctx = HandlerContext(params, sketch, path, chunk_bytes)
        self.handlers: list[Handler] = []
        self.fallback: set[str] = set()
        self._classify()

    def set_reference(self, grads: dict[str, torch.Tensor]) -> None:
        """What each candidate's gradient is dotted with, per parameter name (exact mode): the
        reference gradient, or M times it under a metric (`set_metric`)."""
        self.ctx.ref = grads

    def set_metric(self, metric: dict[str, torch.Tensor] | None) -> None:
        """A positive diagonal metric per parameter name (exact mode; None: plain): squared
        norms become `<G, M G>` and Linear weights materialize (`handlers.HandlerContext`)."""
        if metric is not None and self.ctx.sketch is not None:
            raise ValueError("a metric needs exact mode, not a projection")
        self.ctx.metric = metric

    @property
    def paths(self) -> dict[str, set[str]]:
        """Per module name, the paths its handler took so far."""
        return self.ctx.paths

    @property
    def decisions(self) -> dict[str, dict]:
        """Per Linear/Conv1D module, the cost model's last decision (see `cost.LinearCost`)."""
        return self.ctx.decisions

    def _classify(self) -> None:
        name_of = {id(p): n for n, p in self.params.items()}
        uses: dict[int, list[tuple[str, nn.Module, str]]] = {}
        for mname, mod in self.model.named_modules():
            for attr, p in mod.named_parameters(recurse=False):
                if id(p) in name_of:
                    uses.setdefault(id(p), []).append((mname, mod, attr))
        tied: dict[int, tuple] = {}
        for pid, us in uses.items():
            kinds = sorted(us, key=lambda u: not isinstance(u[1], nn.Embedding))
            if len(us) == 2 and isinstance(kinds[0][1], nn.Embedding) and kinds[0][2] == "weight" \
                    and type(kinds[1][1]) is nn.Linear and kinds[1][2] == "weight":
                tied[pid] = (kinds[0][1], kinds[1][1])
            elif len(us) > 1:
                self.fallback.add(name_of[pid])
        per_module: dict[int, tuple[str, nn.Module, dict[str, str]]] = {}
        for pid, us in uses.items():
            if name_of[pid] in self.fallback:
                continue
            for mname, mod, attr in us:
                per_module.setdefault(id(mod), (mname, mod, {}))[2][attr] = name_of[pid]
        groups: dict[int, int] = {}
        for emb, lin in tied.values():
            groups[id(emb)] = groups[id(lin)] = len(groups) + 1000
        for i, (mname, mod, attrs) in enumerate(per_module.values()):
            self.handlers.append(make_handler(self.ctx, mname, mod, attrs,
                                              groups.get(id(mod), i)))
        by_mod = {id(h.module): h for h in self.handlers}
        for emb, lin in tied.values():
            if id(emb) in by_mod and id(lin) in by_mod and tie(by_mod[id(lin)], by_mod[id(emb)]):
                continue
            for m in (emb, lin):  # unusual tie: keep exact through the fallback
                h = by_mod.pop(id(m), None)
                if h is not None:
                    self.handlers.remove(h)
                    self.fallback.update(h.attrs.values())

    def run(self, batch: Batch) -> tuple[Accum, set[str]]:
        """One batched pass. Returns summed per-candidate partials ((C,) each; C = rows
        unless `batch.slots` groups rows into candidates) and the parameter names the hooks
        declined this time (to be computed by the exact per-candidate fallback)."""
        dev = batch.ids.device
        st = PassState(n=batch.size, dim=None if self.ctx.sketch is None else self.ctx.sketch.dim,
                       slots=batch.slots)
        z = torch.zeros((), device=dev, requires_grad=True)
        hooks = [h.module.register_forward_hook(
            lambda m, args, kwargs, out, h=h: h.on_forward(st, z, args, kwargs, out),
            with_kwargs=True) for h in self.handlers]
        emb = _input_embeddings(self.model)
        if self.fallback and emb is not None and not any(h.module is emb for h in self.handlers):
            # a shared parameter outside the handlers: reach every output from the bottom
            hooks.append(emb.register_forward_hook(
                lambda m, args, out: out + z if isinstance(out, torch.Tensor) else None))
        timings = self.ctx.timings
        try:
            with torch.enable_grad(), grads_only_for(self.model, self.params):
                t0 = time.perf_counter()
                total = batch_losses(self.model, batch).sum()
                t1 = time.perf_counter()
                if total.requires_grad:
                    torch.autograd.grad(total, [z], allow_unused=True)
                if timings is not None:
                    timings["forward"] = timings.get("forward", 0.0) + t1 - t0
                    timings["backward"] = timings.get("backward", 0.0) + (
                        time.perf_counter() - t1)
        finally:
            for hk in hooks:
                hk.remove()
        # A hook that never fired means the backward did not reach that output (its gradient
        # may still be non-zero through a path we did not request): stay exact via the loop.
        st.declined.update(h.group for h in self.handlers if id(h) in st.pending)
        declined = {n for h in self.handlers if h.group in st.declined for n in h.attrs.values()}
        out = Accum.zeros(st.c, st.dim, dev)
        for group, acc in st.acc.items():
            if group not in st.declined:
                out.add_(acc)
        return out, declined


@contextlib.contextmanager
def grads_only_for(model: nn.Module, params: dict[str, nn.Parameter]) -> Iterator[None]:
    """Inside the block only `params` require grad (every flag is restored on exit).

    With the parameters below the lowest selected one frozen, the forward records no graph
    there and no backward runs there: scoring the top 6 of 30 blocks back-propagates through
    6 blocks, not 30. (The handlers then reach the lowest selected module as a root: its input
    needs no grad, so the zero leaf is added to its output.)"""
    keep = {id(p) for p in params.values()}
    frozen = [p for p in model.parameters() if p.requires_grad and id(p) not in keep]
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)


def _input_embeddings(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_input_embeddings", None)
    try:
        return get() if callable(get) else None
    except Exception:  # noqa: BLE001  (models without input embeddings raise here)
        return None
