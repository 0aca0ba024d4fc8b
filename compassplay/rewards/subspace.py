"""Which gradient the scorer compares: all parameters, a glob-selected subset, or a seeded
random projection of either.

The projection is a seeded sparse sign projection (CountSketch): coordinate j of parameter p is
added with a random sign to one of `dim` random buckets. It is linear, so the projected gradient
of a sum of uses is the sum of the projected uses, and inner products are preserved in
expectation (unbiased; relative error ~ 1/sqrt(dim)). Memory: one int64 bucket index and one
sign per selected parameter coordinate, generated once per parameter from `(seed, name)`.
"""

from __future__ import annotations

import fnmatch
import zlib
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class ProjectionSpec:
    """Random projection of the (glob-selected) gradient to `dim` coordinates."""

    dim: int
    seed: int = 0
    include: tuple[str, ...] = ("*",)
    kind: str = "projection"

    def __post_init__(self) -> None:
        if self.dim <= 0:
            raise ValueError(f"projection dim must be positive, got {self.dim}")


ParamsSpec = str | list[str] | tuple[str, ...] | dict | ProjectionSpec


def parse_spec(params: ParamsSpec) -> tuple[list[str], ProjectionSpec | None]:
    """Normalize a params spec into (name globs, projection or None)."""
    if isinstance(params, ProjectionSpec):
        return list(params.include), params
    if isinstance(params, dict):
        kind = params.get("kind", "projection")
        if kind != "projection":
            raise ValueError(f"unknown params spec kind {kind!r}")
        inc = params.get("include", ("*",))
        spec = ProjectionSpec(dim=int(params["dim"]), seed=int(params.get("seed", 0)),
                              include=tuple([inc] if isinstance(inc, str) else inc))
        return list(spec.include), spec
    if isinstance(params, str):
        return (["*"] if params == "all" else [params]), None
    if isinstance(params, (list, tuple)) and all(isinstance(p, str) for p in params):
        return list(params), None
    raise TypeError(f"params must be 'all', a list of name globs or a projection spec: {params!r}")


def select_params(model: torch.nn.Module, globs: list[str]) -> dict[str, torch.nn.Parameter]:
    """Trainable parameters whose `named_parameters()` name matches any glob (tied parameters
    appear once, under their first name). Raises ValueError if nothing matches."""
    out = {n: p for n, p in model.named_parameters()
           if p.requires_grad and any(fnmatch.fnmatchcase(n, g) for g in globs)}
    if not out:
        raise ValueError(f"no trainable parameter matches {globs!r}")
    return out


def last_blocks_globs(model: torch.nn.Module, k: int) -> list[str]:
    """Globs selecting the last `k` transformer blocks (names like '...layers.7.*' / '...h.7.*')."""
    blocks: dict[str, set[int]] = {}
    for name, _ in model.named_parameters():
        parts = name.split(".")
        for i, part in enumerate(parts[:-1]):
            if part.isdigit():
                blocks.setdefault(".".join(parts[:i]), set()).add(int(part))
                break
    if not blocks:
        raise ValueError("model has no numbered blocks")
    prefix, idx = max(blocks.items(), key=lambda kv: len(kv[1]))
    return [f"{prefix}.{i}.*" for i in sorted(idx)[-k:]]


@dataclass
class CountSketch:
    """Seeded sparse sign projection R^D -> R^dim over named parameter blocks."""

    dim: int
    seed: int = 0
    _cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def block(self, name: str, param: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(bucket int64, sign float32), both shaped like `param`, deterministic in (seed, name)."""
        hit = self._cache.get(name)
        if hit is None:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(name.encode()))
            bucket = torch.randint(0, self.dim, param.shape, generator=g)
            sign = torch.randint(0, 2, param.shape, generator=g).float().mul_(2).sub_(1)
            hit = (bucket.to(param.device), sign.to(param.device))
            self._cache[name] = hit
        return hit

    def project(self, name: str, param: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
        """Project per-sample gradients `grads` (c, *param.shape) -> (c, dim) float32."""
        bucket, sign = self.block(name, param)
        flat = grads.reshape(grads.shape[0], -1).float() * sign.reshape(1, -1)
        out = torch.zeros(grads.shape[0], self.dim, device=grads.device)
        return out.index_add_(1, bucket.reshape(-1), flat)

    def project_rows(self, name: str, param: torch.Tensor, rows: torch.Tensor,
                     vals: torch.Tensor) -> torch.Tensor:
        """Project per-sample sparse row gradients of a (V, d) table: sample n adds `vals[n, s]`
        (d,) to row `rows[n, s]`. rows (N, S) int64, vals (N, S, d) -> (N, dim)."""
        bucket, sign = self.block(name, param)
        n = rows.shape[0]
        b = bucket[rows].reshape(n, -1)
        v = (vals.float() * sign[rows]).reshape(n, -1)
        return torch.zeros(n, self.dim, device=vals.device).scatter_add_(1, b, v)
