"""Distributed scoring over a `torch.distributed` process group (gloo on CPU, or NCCL).

* mode="param": parameters are partitioned over ranks (greedy by size, whole parameters). Each
  rank stores g_ref only for its slice and computes the per-candidate partial inner products
  and squared norms (or partial projections) over that slice; the partials are all-reduced
  (SUM), so every rank returns the same scores. Every rank runs the candidates' forward and
  backward (activations are replicated here); the per-parameter work and g_ref memory are split.
* mode="data": every rank holds a full replica; the reference set and the candidates are split
  over ranks, g_ref is all-reduced once, and the scores are all-gathered in input order.

All ranks must call `set_reference` and `score` collectively with the same arguments.
"""

from __future__ import annotations

import glob as _glob

import torch
import torch.distributed as dist
from torch import nn

from .batch import Example
from .gradient import AlignmentScore, GradientScorer, Partials, finalize
from .subspace import ParamsSpec, ProjectionSpec, parse_spec, select_params


def partition(sizes: dict[str, int], world: int) -> list[list[str]]:
    """Assign names to `world` shards, largest first onto the lightest shard (deterministic)."""
    shards: list[list[str]] = [[] for _ in range(world)]
    load = [0] * world
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        k = min(range(world), key=lambda i: (load[i], i))
        shards[k].append(name)
        load[k] += sizes[name]
    return shards


class ShardedGradientScorer:
    """`GradientScorer` over a process group; see the module docstring for the two modes."""

    def __init__(self, model: nn.Module, params: ParamsSpec = "all", *, mode: str = "param",
                 group: dist.ProcessGroup | None = None, **kwargs) -> None:
        if mode not in ("param", "data"):
            raise ValueError(f"mode must be 'param' or 'data', got {mode!r}")
        self.mode, self.group = mode, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        if mode == "data":
            self.local = GradientScorer(model, params, **kwargs)
            return
        globs, proj = parse_spec(params)
        sizes = {n: p.numel() for n, p in select_params(model, globs).items()}
        self.owned = partition(sizes, self.world)[self.rank]
        if not self.owned:
            raise ValueError(f"rank {self.rank} owns no parameter: fewer parameters than ranks")
        exact = [_glob.escape(n) for n in self.owned]
        spec = exact if proj is None else ProjectionSpec(proj.dim, proj.seed, tuple(exact))
        self.local = GradientScorer(model, spec, **kwargs)

    @property
    def weight_version(self) -> int:
        return self.local.weight_version

    @weight_version.setter
    def weight_version(self, v: int) -> None:
        self.local.weight_version = int(v)

    def _sum(self, t: torch.Tensor) -> None:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)

    def set_reference(self, ref: list[Example]) -> None:
        """Collective: compute g_ref (param mode: this rank's slice; data mode: all-reduced)."""
        if not ref:
            raise ValueError("reference set is empty: set_reference needs at least one Example")
        if self.mode == "data":
            self.local._set_reference(ref[self.rank:: self.world], len(ref), self._sum)
        else:
            self.local.set_reference(ref)
        r = self.local.reference
        if self.mode == "param":
            sq = torch.tensor([r.sq], dtype=torch.float64)
            self._sum(sq)
            self.ref_sq = float(sq)
            self.ref_proj = None
            if r.proj is not None:
                self.ref_proj = r.proj.clone()
                self._sum(self.ref_proj)

    def score(self, cands: list[Example], allow_stale: bool = False) -> list[AlignmentScore]:
        """Collective: scores of `cands` in input order, identical on every rank."""
        ref = self.local.check_reference(allow_stale)
        if self.mode == "param":
            p = self.local.partials(cands)
            self._sum(p.inner)
            self._sum(p.sq)
            if p.proj is not None:
                self._sum(p.proj)
            return finalize(p, self.ref_sq, self.ref_proj)
        n = len(cands)
        lo, hi = self.rank * n // self.world, (self.rank + 1) * n // self.world
        mine = finalize(self.local.partials(cands[lo:hi]), ref.sq, ref.proj) if hi > lo else []
        buf = torch.zeros(n, 3, dtype=torch.float64)
        for i, s in enumerate(mine):
            buf[lo + i] = torch.tensor([s.cosine, s.inner, s.grad_norm], dtype=torch.float64)
        self._sum(buf)  # each row is non-zero on exactly one rank
        return [AlignmentScore(*map(float, row)) for row in buf]


__all__ = ["Partials", "ShardedGradientScorer", "partition"]
