"""Per-layer handlers of the batched per-sample engine (see `per_sample` for the method).

Each handler owns one module whose direct parameters are (partly) selected. `on_forward` keeps
the module input; a tensor hook on its output receives `b = dL/d out` during the backward and
`backward` adds, per sample, `<G_i, V>` and `||G_i||^2` (or the projection of `G_i`).

Handlers see the engine only through a `HandlerContext` (`pass_state`: what to score against, the path
policy, where to record decisions and timings) and one pass only through its `PassState`.

A "sample" is a candidate: one row of the micro-batch, or, with several verified solutions,
several rows whose losses (weighted 1/k each, `batch.make_solutions_batch`) add up to the
candidate's loss. The candidate's gradient is then the sum of its rows' gradients, so handlers
regroup the per-row tensors they keep (`PassState.regroup`: (N rows, T, d) -> (C candidates,
K*T, d), missing rows zero) and run the per-sample formulas on the candidates: a row of a
linear layer's `G_c = sum_{rows r, t} b_rt a_rt^T`, and the ghost Gram terms include the cross
terms between the candidate's rows. Norm and vmap handlers compute per-row gradients and sum
them per candidate (`PassState.sum_rows`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vjp, vmap

from .cost import LinearCost
from .pass_state import HandlerContext, PassState
from .reductions import LOW_PRECISION, bmm32, mm32, rowdot, rowsq, rowsum

try:  # GPT-2's transposed linear layer
    from transformers.pytorch_utils import Conv1D
except Exception:  # pragma: no cover - transformers is a dependency
    Conv1D = ()


def _reachable(out, z: torch.Tensor):
    """A declined module's output plus the zero leaf (when it carries grad): the modules above
    it stay on the backward's path to `z` and keep their batched formulas."""
    if isinstance(out, torch.Tensor) and out.requires_grad and out.is_floating_point():
        return out + z
    return None


class Handler(ABC):
    """Base: one module whose direct parameters (all or some) are selected. `attrs` maps the
    module's attribute names to parameter names; handlers of one `group` are kept or declined
    together (a tied embedding and head form one group)."""

    def __init__(self, ctx: HandlerContext, name: str, module: nn.Module,
                 attrs: dict[str, str], group: int) -> None:
        self.ctx, self.name, self.module, self.attrs, self.group = ctx, name, module, attrs, group
        self.kind = name.rsplit(".", 1)[-1] or type(module).__name__

    def on_forward(self, st: PassState, z: torch.Tensor, args: tuple, kwargs: dict, out):
        if self.ctx.recomputing:  # our own recomputation of a module's forward
            return None
        x = args[0] if args else next(iter(kwargs.values()), None)
        if (not isinstance(out, torch.Tensor) or not isinstance(x, torch.Tensor)
                or out.dim() == 0 or out.shape[0] != st.n or x.shape[0] != st.n):
            st.declined.add(self.group)
            return _reachable(out, z)
        st.calls[id(self)] = st.calls.get(id(self), 0) + 1
        if st.calls[id(self)] > 1 or not self.accepts(args, kwargs):
            st.declined.add(self.group)
            return _reachable(out, z)
        box = [self.save(st, x)]  # released once used: the backward frees activations as it goes
        # Roots (input without grad: token ids, or the hidden state below the lowest selected
        # parameter, `per_sample.grads_only_for`) get the zero leaf added so the backward
        # reaches them; every other output is reached through a root below it.
        out2 = out if x.requires_grad else out + z
        if not out2.requires_grad:
            return None
        st.pending.add(id(self))

        def hook(b: torch.Tensor) -> None:
            st.pending.discard(id(self))
            saved, box[0] = box[0], None
            if saved is None:  # a second backward through this output: not ours to handle
                st.declined.add(self.group)
            elif self.group not in st.declined:
                with torch.no_grad(), self.ctx.timed(self.kind):
                    self.backward(st, saved, b.detach())

        out2.register_hook(hook)
        return out2 if out2 is not out else None

    def accepts(self, args: tuple, kwargs: dict) -> bool:
        return True

    def save(self, st: PassState, x: torch.Tensor):
        return x.detach()

    @abstractmethod
    def backward(self, st: PassState, saved, b: torch.Tensor) -> None:
        """Accumulate this layer's per-sample partials from its saved input and output grad."""

    def add(self, st: PassState, sl: slice, name: str, grads: torch.Tensor,
            owned: bool = False) -> None:
        """Add materialized per-sample grads (c, *param.shape) of parameter `name`. `owned`:
        the caller's temporary, which may be overwritten (under a metric it is squared in
        place rather than copied)."""
        acc = st.acc_for(self.group, grads.device)
        flat = grads.reshape(grads.shape[0], -1).float()
        if st.dim is not None:
            acc.proj[sl] += self.ctx.sketch.project(name, self.ctx.params[name], flat)
            return
        # Blockwise reductions (`reductions.rowdot/rowsq`: float32 within 4096-element blocks,
        # float64 across), not one `mv` / `vector_norm` per row, which measured 1e-4 / 3e-3
        # relative error over 28M terms.
        acc.inner[sl] += rowdot(flat, self.ctx.ref[name])
        m = None if self.ctx.metric is None else self.ctx.metric[name]
        if m is None:
            acc.sq[sl] += rowsq(flat)
            return
        # <G, M G> = <G*G, M>: one more pass over G (in place when the caller owns it)
        sq = flat.square_() if owned and flat.data_ptr() == grads.data_ptr() else flat.square()
        acc.sq[sl] += rowdot(sq, m)


class LinearHandler(Handler):
    """nn.Linear (weight (d_out, d_in)) or Conv1D (weight (d_in, d_out), `transposed`)."""

    transposed = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tied_with: int | None = None  # id of the embedding handler sharing the weight

    def backward(self, st: PassState, a: torch.Tensor, b: torch.Tensor) -> None:
        # Products in the model's dtype (bf16/fp16: the tensor-core rate the floor runs at)
        # with float32 accumulation and float32 results (`bmm32`); float32 models stay float32.
        cd = a.dtype if a.dtype in LOW_PRECISION else torch.float32
        a = st.regroup(a.reshape(st.n, -1, a.shape[-1]).to(cd))  # (C, K*T, d_in)
        b = st.regroup(b.reshape(st.n, -1, b.shape[-1]).to(cd))  # (C, K*T, d_out)
        n = st.c
        wname, bname = self.attrs.get("weight"), self.attrs.get("bias")
        if bname is not None:
            self.add(st, slice(None), bname, b.sum(1, dtype=torch.float32))
        if wname is None:
            return
        if self.tied_with is not None and st.dim is None:
            ids = st.ids.get(self.tied_with)
            if ids is None:
                st.declined.add(self.group)
                return
            g = b.gather(2, ids.unsqueeze(1).expand(n, b.shape[1], ids.shape[1]))
            st.tied_rows[self.group] = bmm32(g.transpose(1, 2), a)  # (N, S_e, d_in)
        cost = LinearCost(n, a.shape[1], a.shape[2], b.shape[2])
        # projection and metric: the ghost Gram formula gives neither, so G is materialized
        forced = "projection" if st.dim is not None else (
            "metric" if self.ctx.metric is not None else "")
        path = "materialize" if forced else cost.choose(self.ctx.path)
        report = cost.report(path)
        if forced:
            report["forced_by"] = forced
        self.ctx.record(self.name, path, report)
        self.ctx.flops[self.kind] = self.ctx.flops.get(self.kind, 0) + cost.flops(path)
        if path == "ghost":
            self._ghost(st, a, b, self.ctx.ref[wname])
        else:
            self._materialize(st, a, b, wname)

    def _ghost(self, st: PassState, a: torch.Tensor, b: torch.Tensor, v: torch.Tensor) -> None:
        """`<G, V> = sum_t b_t . (V a_t) = sum_t a_t . (V^T b_t)`: whichever product has the
        narrower output (a 49k-vocabulary head: T x d_in, not T x 49k)."""
        t, d_in, d_out = a.shape[1], a.shape[2], b.shape[2]
        step = max(1, self.ctx.chunk_bytes // (8 * t * max(t, min(d_in, d_out))))
        acc = st.acc_for(self.group, a.device)
        vt = (v if self.transposed else v.t()).to(a.dtype)  # (d_in, d_out)
        for s in range(0, st.c, step):
            sl = slice(s, min(st.c, s + step))
            ac, bc = a[sl], b[sl]
            gram = bmm32(ac, ac.transpose(1, 2)).mul_(bmm32(bc, bc.transpose(1, 2)))
            acc.sq[sl] += rowsum(gram)
            if d_out > d_in:
                bv = mm32(bc.reshape(-1, d_out), vt.t()).reshape(ac.shape)
                acc.inner[sl] += rowsum(bv.mul_(ac))
            else:
                av = mm32(ac.reshape(-1, d_in), vt).reshape(bc.shape)
                acc.inner[sl] += rowsum(av.mul_(bc))

    def _materialize(self, st: PassState, a: torch.Tensor, b: torch.Tensor, wname: str) -> None:
        """G_i by one batched GEMM per chunk of samples (at least one sample, else at most
        `chunk_bytes` of G), each chunk reduced against V (or projected) at once. Few large ops
        on purpose: on a shared CPU every op's thread barrier waits for descheduled threads, so
        cache-sized blocks (many small GEMMs) measured slower than whole-sample ones."""
        rows, cols = (a.shape[2], b.shape[2]) if self.transposed else (b.shape[2], a.shape[2])
        step = max(1, self.ctx.chunk_bytes // (4 * rows * cols))
        for s in range(0, st.c, step):
            sl = slice(s, min(st.c, s + step))
            ac, bc = a[sl], b[sl]
            g = bmm32(ac.transpose(1, 2), bc) if self.transposed else bmm32(
                bc.transpose(1, 2), ac)
            self.add(st, sl, wname, g, owned=True)


class Conv1DHandler(LinearHandler):
    transposed = True


class EmbeddingHandler(Handler):
    """nn.Embedding without max_norm / scale_grad_by_freq; optionally tied to a Linear (the
    head), whose handler must run first in the backward and leave its rows at our ids."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tied = False

    def save(self, st: PassState, x: torch.Tensor):
        ids = st.regroup(x.reshape(st.n, -1))  # (C, K*T); missing rows: id 0 (zero gradient)
        st.ids[id(self)] = ids
        return ids

    def backward(self, st: PassState, ids: torch.Tensor, e: torch.Tensor) -> None:
        n, name = st.c, self.attrs["weight"]
        w: nn.Embedding = self.module
        e = st.regroup(e.reshape(st.n, -1, e.shape[-1])).float()  # (C, K*T, d)
        if w.padding_idx is not None:
            e = e * (ids != w.padding_idx).unsqueeze(-1)
        acc = st.acc_for(self.group, e.device)
        if st.dim is not None:
            acc.proj += self.ctx.sketch.project_rows(name, self.ctx.params[name], ids, e)
            return
        v = self.ctx.ref[name]  # g_ref, or M g_ref under a metric
        metric = None if self.ctx.metric is None else self.ctx.metric[name]
        acc.inner += rowsum(e * v[ids])
        key = ids + torch.arange(n, device=ids.device).unsqueeze(1) * w.num_embeddings
        uniq, inv = torch.unique(key.reshape(-1), return_inverse=True)
        rows = torch.zeros(uniq.numel(), e.shape[-1], device=e.device)
        rows.index_add_(0, inv, e.reshape(-1, e.shape[-1]))
        sq = torch.zeros(n, dtype=torch.float64, device=e.device)
        # per (sample, row): ||row||^2, or sum_d M[row, d] row_d^2 under a metric
        row_sq = rowsq(rows) if metric is None else rowsum(
            rows.square_().mul_(metric[uniq % w.num_embeddings]))
        acc.sq += sq.index_add_(0, uniq // w.num_embeddings, row_sq)
        if self.tied:
            m = st.tied_rows.pop(self.group, None)
            if m is None:  # the head's backward did not run first: be exact via the fallback
                st.declined.add(self.group)
                return
            # the cross term 2 <L, M E> = 2 sum_s e_s . (M[ids_s] * L[ids_s])
            acc.sq += 2.0 * rowsum(m * e if metric is None else m * e * metric[ids])
        self.ctx.record(self.name, "sparse-rows")


class ModuleHandler(Handler):
    """Any module called as `module(x)`: a closed form for LayerNorm / RMSNorm (verified against
    the module's own forward), else the per-sample VJP of its forward w.r.t. its params."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fast: str | None = None  # "layernorm" / "rms" / "" once verified

    def accepts(self, args: tuple, kwargs: dict) -> bool:
        return len(args) == 1 and not kwargs

    def backward(self, st: PassState, x: torch.Tensor, b: torch.Tensor) -> None:
        if self.fast is None:
            self.fast = self._verify_fast(x)
        if not self.fast:
            self._vmap_backward(st, x, b)
            return
        xhat = self._xhat(x)
        lead = tuple(range(1, b.dim() - 1))
        for attr, name in self.attrs.items():
            g = b.float() * xhat if attr == "weight" else b.float()
            self.add(st, slice(None), name, st.sum_rows(g.sum(lead) if lead else g))
        self.ctx.record(self.name, "norm-closed-form")

    def _kind(self) -> str:
        mod, attrs = self.module, set(dict(self.module.named_parameters(recurse=False)))
        if isinstance(mod, nn.LayerNorm) and len(mod.normalized_shape) == 1 \
                and attrs <= {"weight", "bias"}:
            return "layernorm"
        eps = getattr(mod, "variance_epsilon", getattr(mod, "eps", None))
        if "RMSNorm" in type(mod).__name__ and attrs == {"weight"} and isinstance(eps, float):
            return "rms"
        return ""

    def _xhat(self, x: torch.Tensor) -> torch.Tensor:
        mod, xf = self.module, x.float()
        if self.fast == "layernorm":
            return F.layer_norm(xf, mod.normalized_shape, None, None, mod.eps)
        eps = getattr(mod, "variance_epsilon", getattr(mod, "eps", None))
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype).float()

    def _verify_fast(self, x: torch.Tensor) -> str:
        """Use the closed form (weight grad = sum_t b_t * xhat_t) only if it reproduces the
        module's own output on this input; otherwise the generic vmap path."""
        self.fast = self._kind()
        if not self.fast:
            return ""
        mod = self.module
        with self.ctx.recompute():
            y = mod(x[:1]).float()
        pred = mod.weight.detach().float() * self._xhat(x[:1])
        if getattr(mod, "bias", None) is not None:
            pred = pred + mod.bias.detach().float()
        return self.fast if torch.allclose(y, pred, rtol=1e-5, atol=1e-6) else ""

    def _vmap_backward(self, st: PassState, x: torch.Tensor, b: torch.Tensor) -> None:
        mod = self.module
        params = {k: p.detach() for k, p in mod.named_parameters(recurse=False)}
        sel = {k: params[k] for k in self.attrs}
        fixed = {k: p for k, p in params.items() if k not in sel}

        def one(x1: torch.Tensor, b1: torch.Tensor) -> dict[str, torch.Tensor]:
            def f(p: dict[str, torch.Tensor]) -> torch.Tensor:
                return functional_call(mod, {**fixed, **p}, (x1.unsqueeze(0),)).squeeze(0)

            out, pull = vjp(f, sel)
            return pull(b1.to(out.dtype))[0]

        size = sum(p.numel() for p in sel.values()) * 4 + x[0].numel() * 16
        step = max(1, self.ctx.chunk_bytes // max(size, 1))
        for cands, rows in st.chunks(step):  # whole candidates: their rows' grads are summed
            with self.ctx.recompute():
                grads = vmap(one)(x[rows], b[rows])
            for attr, g in grads.items():
                self.add(st, cands, self.attrs[attr], st.sum_rows(g, rows))
        self.ctx.record(self.name, "vmap")


def make_handler(ctx: HandlerContext, name: str, module: nn.Module, attrs: dict[str, str],
                 group: int) -> Handler:
    """The handler for a module whose direct parameters `attrs` (attr -> name) are selected."""
    if isinstance(module, nn.Embedding) and set(attrs) == {"weight"} \
            and module.max_norm is None and not module.scale_grad_by_freq:
        return EmbeddingHandler(ctx, name, module, attrs, group)
    if type(module) is nn.Linear:
        return LinearHandler(ctx, name, module, attrs, group)
    if Conv1D and isinstance(module, Conv1D):
        return Conv1DHandler(ctx, name, module, attrs, group)
    return ModuleHandler(ctx, name, module, attrs, group)


def tie(head: Handler, embedding: Handler) -> bool:
    """Link a Linear head and an Embedding sharing one weight; False if the pair is unusual."""
    if not (isinstance(head, LinearHandler) and isinstance(embedding, EmbeddingHandler)):
        return False
    head.tied_with, embedding.tied = id(embedding), True
    return True
