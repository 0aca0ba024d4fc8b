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

Results accumulate in float64 per sample; per-layer math is float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vjp, vmap

from .batch import Batch, batch_losses
from .subspace import CountSketch

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


class _Handler:
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

    def backward(self, st: _Pass, ctx, b: torch.Tensor) -> None:
        raise NotImplementedError

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


class PerSampleEngine:
    """Classifies the selected parameters by owning module and runs batched passes.

    `ref`: reference gradient per parameter name (exact mode); `sketch`: projection mode.
    `path`: "auto" (cheaper per layer), "ghost" or "materialize" for Linear/Conv1D layers.
    `chunk_bytes`: bound on the per-layer per-sample temporaries of one sample chunk.
    """

    def __init__(self, model: nn.Module, params: dict[str, nn.Parameter],
                 sketch: CountSketch | None = None, path: str = "auto",
                 chunk_bytes: int = 256 << 20) -> None:
        if path not in ("auto", "ghost", "materialize"):
            raise ValueError(f"path must be auto, ghost or materialize, got {path!r}")
        self.model, self.params, self.sketch, self.path = model, params, sketch, path
        self.chunk_bytes = chunk_bytes
        self.recomputing = False
        self.ref: dict[str, torch.Tensor] = {}
        self.paths: dict[str, set[str]] = {}
        self.handlers: list[_Handler] = []
        self.fallback: set[str] = set()
        self._classify()

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
        for pid, (emb, lin) in tied.items():
            groups[id(emb)] = groups[id(lin)] = len(groups) + 1000
        for i, (mname, mod, attrs) in enumerate(per_module.values()):
            group = groups.get(id(mod), i)
            if isinstance(mod, nn.Embedding) and set(attrs) == {"weight"} \
                    and mod.max_norm is None and not mod.scale_grad_by_freq:
                h: _Handler = _EmbeddingHandler(self, mname, mod, attrs, group)
                h.tied_group = id(mod) in groups
            elif type(mod) is nn.Linear:
                h = _LinearHandler(self, mname, mod, attrs, group)
            elif Conv1D and isinstance(mod, Conv1D):
                h = _Conv1DHandler(self, mname, mod, attrs, group)
            else:
                h = _VmapHandler(self, mname, mod, attrs, group)
            self.handlers.append(h)
        by_mod = {id(h.module): h for h in self.handlers}
        for emb, lin in tied.values():
            if id(emb) in by_mod and isinstance(by_mod[id(emb)], _EmbeddingHandler):
                by_mod[id(lin)].tied_with = id(by_mod[id(emb)])
            else:  # unusual tie: keep exact through the fallback
                for m in (emb, lin):
                    h = by_mod.pop(id(m), None)
                    if h is not None:
                        self.handlers.remove(h)
                        self.fallback.update(h.attrs.values())

    def run(self, batch: Batch) -> tuple[_Acc, set[str]]:
        """One batched pass. Returns summed per-sample partials and the parameter names the
        hooks declined this time (to be computed by the exact per-candidate fallback)."""
        dev = batch.ids.device
        st = _Pass(n=batch.size, dim=None if self.sketch is None else self.sketch.dim)
        z = torch.zeros((), device=dev, requires_grad=True)
        hooks = [h.module.register_forward_hook(
            lambda m, args, kwargs, out, h=h: h.on_forward(st, z, args, kwargs, out),
            with_kwargs=True) for h in self.handlers]
        emb = _input_embeddings(self.model)
        if emb is not None and not any(h.module is emb for h in self.handlers):
            hooks.append(emb.register_forward_hook(
                lambda m, args, out: out + z if isinstance(out, torch.Tensor) else None))
        try:
            with torch.enable_grad():
                total = batch_losses(self.model, batch).sum()
                if total.requires_grad:
                    torch.autograd.grad(total, [z], allow_unused=True)
        finally:
            for hk in hooks:
                hk.remove()
        # A hook that never fired means the backward did not reach that output (its gradient
        # may still be non-zero through a path we did not request): stay exact via the loop.
        st.declined.update(h.group for h in self.handlers if id(h) in st.pending)
        declined = {n for h in self.handlers if h.group in st.declined for n in h.attrs.values()}
        out = st.acc_for(-1, dev)
        for group, acc in st.acc.items():
            if group in st.declined or group == -1:
                continue
            out.inner += acc.inner
            out.sq += acc.sq
            if out.proj is not None:
                out.proj += acc.proj
        return out, declined


def _rowsq(flat: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm of each row of (c, m), float64 (c,). One vectorized call: under CPU
    oversubscription many small BLAS calls (a dot per row) are much slower."""
    return torch.linalg.vector_norm(flat, dim=1).double().square()


def _input_embeddings(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_input_embeddings", None)
    try:
        return get() if callable(get) else None
    except Exception:  # some models raise NotImplementedError
        return None
