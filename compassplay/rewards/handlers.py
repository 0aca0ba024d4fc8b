"""Per-layer handlers of the batched per-sample engine (see `per_sample` for the method).

Each handler owns one module whose direct parameters are (partly) selected. `on_forward` keeps
the module input; a tensor hook on its output receives `b = dL/d out` during the backward and
`backward` adds, per sample, `<G_i, V>` and `||G_i||^2` (or the projection of `G_i`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vjp, vmap

if TYPE_CHECKING:
    from .per_sample import PerSampleEngine

try:  # GPT-2's transposed linear layer
    from transformers.pytorch_utils import Conv1D
except Exception:  # pragma: no cover - transformers is a dependency
    Conv1D = ()


@dataclass
class _Acc:
    inner: torch.Tensor
    sq: torch.Tensor
    proj: torch.Tensor | None


@dataclass
class _Pass:
    """State of one micro-batch pass."""

    n: int
    dim: int | None
    acc: dict[int, _Acc] = field(default_factory=dict)
    declined: set[int] = field(default_factory=set)
    calls: dict[int, int] = field(default_factory=dict)
    ids: dict[int, torch.Tensor] = field(default_factory=dict)
    tied_rows: dict[int, torch.Tensor] = field(default_factory=dict)
    pending: set[int] = field(default_factory=set)

    def acc_for(self, group: int, device: torch.device) -> _Acc:
        if group not in self.acc:
            z = torch.zeros(self.n, dtype=torch.float64, device=device)
            proj = None if self.dim is None else torch.zeros(self.n, self.dim, device=device)
            self.acc[group] = _Acc(z, z.clone(), proj)
        return self.acc[group]


class _Handler(ABC):
    """Base: one module whose direct parameters (all or some) are selected."""

    def __init__(self, engine: PerSampleEngine, name: str, module: nn.Module,
                 attrs: dict[str, str], group: int) -> None:
        self.engine, self.name, self.module, self.attrs, self.group = (
            engine, name, module, attrs, group)
        self.path = ""

    def on_forward(self, st: _Pass, z: torch.Tensor, args: tuple, kwargs: dict, out):
        if self.engine.recomputing:  # our own vmap recomputation of a module's forward
            return None
        x = args[0] if args else next(iter(kwargs.values()), None)
        if (not isinstance(out, torch.Tensor) or not isinstance(x, torch.Tensor)
                or out.dim() == 0 or out.shape[0] != st.n or x.shape[0] != st.n):
            st.declined.add(self.group)
            return None
        st.calls[id(self)] = st.calls.get(id(self), 0) + 1
        if st.calls[id(self)] > 1 or not self.accepts(args, kwargs):
            st.declined.add(self.group)
            return None
        ctx = self.save(st, x)
        # Roots (input without grad, e.g. token ids) get the zero leaf added so the backward
        # reaches them; other outputs are reached through the model's input embeddings (+ z).
        out2 = out if x.requires_grad else out + z
        if not out2.requires_grad:
            return None
        st.pending.add(id(self))

        def hook(b: torch.Tensor) -> None:
            st.pending.discard(id(self))
            if self.group not in st.declined:
                with torch.no_grad():
                    self.backward(st, ctx, b.detach())

        out2.register_hook(hook)
        return out2 if out2 is not out else None

    def accepts(self, args: tuple, kwargs: dict) -> bool:
        return True

    def save(self, st: _Pass, x: torch.Tensor):
        return x.detach()

    @abstractmethod
    def backward(self, st: _Pass, ctx, b: torch.Tensor) -> None:
        """Accumulate this layer's per-sample partials from its saved input and output grad."""

    # shared helpers -------------------------------------------------------------------------
    def add(self, st: _Pass, sl: slice, name: str, grads: torch.Tensor) -> None:
        """Add materialized per-sample grads (c, *param.shape) of parameter `name`."""
        acc = st.acc_for(self.group, grads.device)
        flat = grads.reshape(grads.shape[0], -1).float()
        if st.dim is not None:
            acc.proj[sl] += self.engine.sketch.project(name, self.engine.params[name], flat)
            return
        acc.inner[sl] += (flat @ self.engine.ref[name].reshape(-1)).double()
        acc.sq[sl] += _rowsq(flat)


class _LinearHandler(_Handler):
    """nn.Linear (weight (d_out, d_in)) or Conv1D (weight (d_in, d_out), `transposed`)."""

    transposed = False
    tied_with: int | None = None  # id of the embedding handler sharing the weight

    def backward(self, st: _Pass, a: torch.Tensor, b: torch.Tensor) -> None:
        n = st.n
        a = a.reshape(n, -1, a.shape[-1]).float()
        b = b.reshape(n, -1, b.shape[-1]).float()
        wname, bname = self.attrs.get("weight"), self.attrs.get("bias")
        if bname is not None:
            self.add(st, slice(None), bname, b.sum(1))
        if wname is None:
            return
        if self.tied_with is not None and st.dim is None:
            ids = st.ids.get(self.tied_with)
            if ids is None:
                st.declined.add(self.group)
                return
            g = b.gather(2, ids.unsqueeze(1).expand(n, b.shape[1], ids.shape[1]))
            st.tied_rows[self.group] = torch.bmm(g.transpose(1, 2), a)  # (N, S_e, d_in)
        t, din, dout = a.shape[1], a.shape[2], b.shape[2]
        ghost = st.dim is None and self.engine.path != "materialize" and (
            self.engine.path == "ghost" or t * t * (din + dout) < 2 * din * dout)
        self.path = "ghost" if ghost else "materialize"
        self.engine.paths.setdefault(self.name, set()).add(self.path)
        per = 4 * (t * t * 2 if ghost else din * dout)
        step = max(1, self.engine.chunk_bytes // max(per, 1))
        acc = st.acc_for(self.group, a.device)
        v = None if st.dim is not None else self.engine.ref[wname]
        for s in range(0, n, step):
            sl = slice(s, min(n, s + step))
            ac, bc = a[sl], b[sl]
            if not ghost:
                g = torch.bmm(ac.transpose(1, 2), bc) if self.transposed else torch.bmm(
                    bc.transpose(1, 2), ac)
                self.add(st, sl, wname, g)
                continue
            gram = torch.bmm(ac, ac.transpose(1, 2)).mul_(torch.bmm(bc, bc.transpose(1, 2)))
            acc.sq[sl] += gram.sum((1, 2)).double()
            av = ac @ v if self.transposed else ac @ v.t()
            acc.inner[sl] += (av * bc).sum((1, 2)).double()


class _Conv1DHandler(_LinearHandler):
    transposed = True


class _EmbeddingHandler(_Handler):
    """nn.Embedding without max_norm / scale_grad_by_freq; optionally tied to a Linear."""

    tied_group: bool = False

    def save(self, st: _Pass, x: torch.Tensor):
        ids = x.reshape(st.n, -1)
        st.ids[id(self)] = ids
        return ids

    def backward(self, st: _Pass, ids: torch.Tensor, e: torch.Tensor) -> None:
        n, name = st.n, self.attrs["weight"]
        w: nn.Embedding = self.module
        e = e.reshape(n, ids.shape[1], -1).float()
        if w.padding_idx is not None:
            e = e * (ids != w.padding_idx).unsqueeze(-1)
        acc = st.acc_for(self.group, e.device)
        if st.dim is not None:
            acc.proj += self.engine.sketch.project_rows(name, self.engine.params[name], ids, e)
            return
        v = self.engine.ref[name]
        acc.inner += (e * v[ids]).sum((1, 2)).double()
        key = ids + torch.arange(n, device=ids.device).unsqueeze(1) * w.num_embeddings
        uniq, inv = torch.unique(key.reshape(-1), return_inverse=True)
        rows = torch.zeros(uniq.numel(), e.shape[-1], device=e.device)
        rows.index_add_(0, inv, e.reshape(-1, e.shape[-1]))
        sq = torch.zeros(n, dtype=torch.float64, device=e.device)
        acc.sq += sq.index_add_(0, uniq // w.num_embeddings, rows.pow(2).sum(1).double())
        if self.tied_group:
            m = st.tied_rows.pop(self.group, None)
            if m is None:  # lm_head backward did not run first: be exact via the fallback
                st.declined.add(self.group)
                return
            acc.sq += 2.0 * (m * e).sum((1, 2)).double()
        self.engine.paths.setdefault(self.name, set()).add("sparse-rows")


class _VmapHandler(_Handler):
    """Any module called as `module(x)`: per-sample VJP of its own forward w.r.t. its params."""

    def accepts(self, args: tuple, kwargs: dict) -> bool:
        return len(args) == 1 and not kwargs

    fast: str | None = None  # "layernorm" / "rms" once verified against the module's forward

    def backward(self, st: _Pass, x: torch.Tensor, b: torch.Tensor) -> None:
        if self.fast is None:
            self.fast = self._verify_fast(x)
        if self.fast:
            xhat = self._xhat(x)
            lead = tuple(range(1, b.dim() - 1))
            for attr, name in self.attrs.items():
                g = b.float() * xhat if attr == "weight" else b.float()
                self.add(st, slice(None), name, g.sum(lead) if lead else g)
            self.engine.paths.setdefault(self.name, set()).add("norm-closed-form")
            return
        self._vmap_backward(st, x, b)

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
        self.engine.recomputing = True
        try:
            y = mod(x[:1]).float()
        finally:
            self.engine.recomputing = False
        pred = mod.weight.detach().float() * self._xhat(x[:1])
        if getattr(mod, "bias", None) is not None:
            pred = pred + mod.bias.detach().float()
        return self.fast if torch.allclose(y, pred, rtol=1e-5, atol=1e-6) else ""

    def _vmap_backward(self, st: _Pass, x: torch.Tensor, b: torch.Tensor) -> None:
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
        step = max(1, self.engine.chunk_bytes // max(size, 1))
        for s in range(0, st.n, step):
            sl = slice(s, min(st.n, s + step))
            self.engine.recomputing = True
            try:
                grads = vmap(one)(x[sl], b[sl])
            finally:
                self.engine.recomputing = False
            for attr, g in grads.items():
                self.add(st, sl, self.attrs[attr], g)
        self.engine.paths.setdefault(self.name, set()).add("vmap")


def _rowsq(flat: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm of each row of (c, m), float64 (c,). One vectorized call: under CPU
    oversubscription many small BLAS calls (a dot per row) are much slower."""
    return torch.linalg.vector_norm(flat, dim=1).double().square()
