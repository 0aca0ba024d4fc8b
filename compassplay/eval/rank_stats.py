"""Rank statistics for "does a score pick the candidates that teach": Spearman's rho with a
bootstrap interval over candidates and a permutation p, the mean utility of each score's top k,
a least-squares line, and the smallest rho a pool of n candidates can detect.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank."""
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x), dtype=float)
    r[order] = np.arange(1, len(x) + 1, dtype=float)
    vals, inv = np.unique(x, return_inverse=True)
    if len(vals) < len(x):
        sums = np.bincount(inv, weights=r)
        counts = np.bincount(inv)
        r = (sums / counts)[inv]
    return r


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt(float((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / den) if den > 0 else 0.0


def spearman(x, y) -> float:
    """Spearman's rank correlation (0 when either side is constant)."""
    return _pearson(ranks(np.asarray(x, float)), ranks(np.asarray(y, float)))


@dataclass(frozen=True)
class RankCorrelation:
    """rho, its percentile-bootstrap 95% interval over candidates, the two-sided permutation
    p-value, and n."""

    rho: float
    ci_low: float
    ci_high: float
    p: float
    n: int

    def as_dict(self) -> dict:
        return asdict(self)


def rank_correlation(x, y, boot: int = 2000, perms: int = 5000,
                     seed: int = 0) -> RankCorrelation:
    x, y = np.asarray(x, float), np.asarray(y, float)
    n = len(x)
    rho = spearman(x, y)
    rng = np.random.default_rng(seed)
    rx, ry = ranks(x), ranks(y)
    rhos = [spearman(x[idx], y[idx]) for idx in rng.integers(0, n, size=(boot, n))]
    lo, hi = np.percentile(rhos, [2.5, 97.5])
    hits = sum(abs(_pearson(rx, ry[rng.permutation(n)])) >= abs(rho) - 1e-12
               for _ in range(perms))
    return RankCorrelation(rho, float(lo), float(hi), (hits + 1) / (perms + 1), n)


def detectable_rho(n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest |rho| a two-sided test at `alpha` detects with `power` among n candidates
    (Fisher z with Spearman's variance 1.06 / (n - 3))."""
    if n <= 3:
        return 1.0
    z = {0.05: 1.959964}.get(alpha, 1.959964) + {0.8: 0.841621}.get(power, 0.841621)
    return math.tanh(z * math.sqrt(1.06 / (n - 3)))


def top_k_mean(scores, utility, k: int) -> float:
    """Mean utility of the k candidates with the highest score (ties: the first in order)."""
    s, u = np.asarray(scores, float), np.asarray(utility, float)
    top = np.argsort(-s, kind="mergesort")[:k]
    return float(u[top].mean())


def line_fit(x, y) -> dict[str, float]:
    """Least squares y = slope * x + intercept, with r (Pearson) and r^2."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    slope, intercept = np.polyfit(x, y, 1) if np.ptp(x) > 0 else (0.0, float(y.mean()))
    r = _pearson(x, y)
    return {"slope": float(slope), "intercept": float(intercept), "r": r, "r2": r * r,
            "n": int(len(x))}
