"""What the per-layer handlers of one batched per-sample pass share (`handlers`): the engine's
`HandlerContext` (what to score against, the path policy, where decisions and timings go), the
per-candidate partials `Accum`, and one pass's `PassState` (rows grouped into candidates).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from .subspace import CountSketch


@dataclass
class HandlerContext:
    """What every handler shares: the selected parameters, what the partials are taken against
    (`ref` per parameter name in exact mode, `sketch` in projection mode), the path policy, and
    where paths, cost decisions and (optionally) seconds per layer kind are recorded.

    `metric` (exact mode only; None: plain): a positive diagonal metric M per parameter name
    (float32, the parameter's shape). Squared norms are then `<G, M G>`; `ref` is then M g_ref
    (the scorer passes it so), so every inner product `<G, ref>` is `<G, M g_ref>` unchanged.
    The ghost formula cannot weight its Gram products, so Linear weights materialize."""

    params: dict[str, nn.Parameter]
    sketch: CountSketch | None = None
    path: str = "auto"
    chunk_bytes: int = 64 << 20
    ref: dict[str, torch.Tensor] = field(default_factory=dict)
    metric: dict[str, torch.Tensor] | None = None
    paths: dict[str, set[str]] = field(default_factory=dict)
    decisions: dict[str, dict] = field(default_factory=dict)
    timings: dict[str, float] | None = None
    flops: dict[str, float] = field(default_factory=dict)
    recomputing: bool = False

    def record(self, module: str, path: str, decision: dict | None = None) -> None:
        self.paths.setdefault(module, set()).add(path)
        if decision is not None:
            self.decisions[module] = decision

    @contextlib.contextmanager
    def recompute(self) -> Iterator[None]:
        """Marks a handler's own re-run of a module's forward (hooks must ignore it)."""
        self.recomputing = True
        try:
            yield
        finally:
            self.recomputing = False

    @contextlib.contextmanager
    def timed(self, kind: str) -> Iterator[None]:
        if self.timings is None:
            yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timings[kind] = self.timings.get(kind, 0.0) + time.perf_counter() - t0


@dataclass
class Accum:
    """Per-sample partials: inner (N,) and sq (N,) float64, proj (N, dim) float32 or None."""

    inner: torch.Tensor
    sq: torch.Tensor
    proj: torch.Tensor | None

    @classmethod
    def zeros(cls, n: int, dim: int | None, device: torch.device) -> Accum:
        z = torch.zeros(n, dtype=torch.float64, device=device)
        return cls(z, z.clone(), None if dim is None else torch.zeros(n, dim, device=device))

    def add_(self, other: Accum) -> None:
        self.inner += other.inner
        self.sq += other.sq
        if self.proj is not None:
            self.proj += other.proj


@dataclass
class PassState:
    """State of one micro-batch pass: per-group partials, declined groups, and what handlers
    hand each other (embedding ids, the tied head's rows at those ids).

    `n`: rows of the batch; `slots` (C, K) int64: candidate c's rows (consecutive, -1 past its
    last; `Batch.slots`), None when every row is its own candidate. Partials are per candidate.
    """

    n: int
    dim: int | None
    slots: torch.Tensor | None = None
    acc: dict[int, Accum] = field(default_factory=dict)
    declined: set[int] = field(default_factory=set)
    calls: dict[int, int] = field(default_factory=dict)
    ids: dict[int, torch.Tensor] = field(default_factory=dict)
    tied_rows: dict[int, torch.Tensor] = field(default_factory=dict)
    pending: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.c = self.n if self.slots is None else int(self.slots.shape[0])
        if self.slots is None:
            self.starts = list(range(self.n + 1))
            return
        k = (self.slots >= 0).sum(1).cpu()
        self.starts = [0, *torch.cumsum(k, 0).tolist()]
        if self.starts[-1] != self.n:
            raise ValueError(f"slots cover {self.starts[-1]} rows of a batch of {self.n}")
        self._valid = (self.slots >= 0).reshape(-1)  # (C*K,) positions holding a row
        self._full = self.n == self.slots.numel()
        self.owner = torch.repeat_interleave(torch.arange(self.c, device=self.slots.device),
                                             k.to(self.slots.device))  # (N,) candidate of row

    def acc_for(self, group: int, device: torch.device) -> Accum:
        if group not in self.acc:
            self.acc[group] = Accum.zeros(self.c, self.dim, device)
        return self.acc[group]

    def regroup(self, x: torch.Tensor) -> torch.Tensor:
        """Per-row (N, T, ...) -> per-candidate (C, K*T, ...): each candidate's rows in order
        along the token axis, zero rows where it has fewer than K (a no-op with one row per
        candidate, a view when every candidate has K)."""
        if self.slots is None:
            return x
        c, k = self.slots.shape
        if self._full:
            return x.reshape(c, k * x.shape[1], *x.shape[2:])
        out = x.new_zeros((c * k, *x.shape[1:]))
        out[self._valid] = x
        return out.reshape(c, k * x.shape[1], *x.shape[2:])

    def sum_rows(self, g: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
        """Per-row values (r, ...) of the rows `rows` (default all) summed per candidate:
        (candidates owning those rows, ...); whole candidates only (`chunks`)."""
        if self.slots is None:
            return g
        rows = rows or slice(0, self.n)
        owner = self.owner[rows]
        first = int(owner[0]) if owner.numel() else 0
        span = (int(owner[-1]) + 1 - first) if owner.numel() else 0
        out = g.new_zeros((span, *g.shape[1:]))
        return out.index_add_(0, owner - first, g)

    def chunks(self, max_rows: int) -> Iterator[tuple[slice, slice]]:
        """(candidate slice, row slice) of consecutive whole candidates, at most `max_rows` rows
        each (at least one candidate)."""
        c0 = 0
        while c0 < self.c:
            c1 = c0 + 1
            while c1 < self.c and self.starts[c1 + 1] - self.starts[c0] <= max_rows:
                c1 += 1
            yield slice(c0, c1), slice(self.starts[c0], self.starts[c1])
            c0 = c1
