"""The statistics a reviewer asks of "does a score pick the candidates that teach": Spearman's
rho pooled and within strata (task type x pool), partial rho controlling for covariates, the
difference of two scores' rhos on the same candidates, and Holm's correction.

* `within_rho`: Spearman's rho in each stratum (strata with fewer than `min_n` candidates are
  left out), combined by Fisher's z weighted by n_k - 3; 95% interval from a bootstrap that
  resamples candidates inside each stratum; two-sided p from permuting y inside each stratum.
* `partial_rho`: the Pearson correlation of the ranks of x and y after regressing each on the
  ranks of the covariates and one indicator per stratum (so it is also within strata); same
  bootstrap and permutation.
* `rho_difference`: within_rho(a, y) - within_rho(b, y) with the paired stratified bootstrap
  (the same resampled candidates for both), and the fraction of resamples at or below 0.
* `holm`: Holm's step-down adjusted p-values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from compassplay.eval.rank_stats import _pearson, ranks, spearman


@dataclass(frozen=True)
class Estimate:
    """An estimate, its 95% bootstrap interval, its two-sided permutation p (or the bootstrap's
    one-sided tail for a difference), the candidates it used and the effective n for power."""

    value: float
    ci_low: float
    ci_high: float
    p: float
    n: int
    n_eff: int

    def as_dict(self) -> dict:
        return asdict(self)


def strata_index(strata: Sequence, min_n: int) -> list[np.ndarray]:
    """Row indices of each stratum with at least `min_n` rows (first-seen order)."""
    groups: dict = {}
    for i, s in enumerate(strata):
        groups.setdefault(s, []).append(i)
    return [np.asarray(v) for v in groups.values() if len(v) >= min_n]


def _fisher_combine(rhos: list[float], ns: list[int]) -> float:
    w = np.asarray(ns, float) - 3.0
    z = np.arctanh(np.clip(np.asarray(rhos, float), -0.999999, 0.999999))
    return float(np.tanh((w * z).sum() / w.sum())) if w.sum() > 0 else 0.0


def _within(x: np.ndarray, y: np.ndarray, groups: list[np.ndarray]) -> float:
    return _fisher_combine([spearman(x[g], y[g]) for g in groups], [len(g) for g in groups])


def _blocks(groups: list[np.ndarray]) -> list[np.ndarray]:
    """The strata of a sample drawn stratum by stratum (`_boot_rows`): consecutive blocks."""
    out, start = [], 0
    for g in groups:
        out.append(np.arange(start, start + len(g)))
        start += len(g)
    return out


def _boot_rows(groups: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    return np.concatenate([rng.choice(g, size=len(g), replace=True) for g in groups])


def _permute_within(y: np.ndarray, groups: list[np.ndarray],
                    rng: np.random.Generator) -> np.ndarray:
    yp = y.copy()
    for g in groups:
        yp[g] = y[rng.permutation(g)]
    return yp


def within_rho(x, y, strata: Sequence, min_n: int = 5, boot: int = 1000, perms: int = 2000,
               seed: int = 0) -> Estimate:
    """Spearman's rho within strata (see the module docstring)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    groups = strata_index(strata, min_n)
    n = int(sum(len(g) for g in groups))
    if not groups:
        return Estimate(0.0, 0.0, 0.0, 1.0, 0, 0)
    value = _within(x, y, groups)
    rng = np.random.default_rng(seed)
    blocks = _blocks(groups)
    boots = []
    for _ in range(boot):
        rows = _boot_rows(groups, rng)
        boots.append(_within(x[rows], y[rows], blocks))
    hits = sum(abs(_within(x, _permute_within(y, groups, rng), groups)) >= abs(value) - 1e-12
               for _ in range(perms))
    lo, hi = np.percentile(boots, [2.5, 97.5])
    n_eff = int(sum(len(g) - 3 for g in groups) + 3)
    return Estimate(value, float(lo), float(hi), (hits + 1) / (perms + 1), n, n_eff)


def _residual_ranks(v: np.ndarray, design: np.ndarray) -> np.ndarray:
    r = ranks(v)
    beta, *_ = np.linalg.lstsq(design, r, rcond=None)
    return r - design @ beta


def _design(covariates: list[np.ndarray], groups: list[np.ndarray], n: int) -> np.ndarray:
    cols = [ranks(c) for c in covariates]
    for g in groups:
        ind = np.zeros(n)
        ind[g] = 1.0
        cols.append(ind)
    return np.column_stack(cols) if cols else np.ones((n, 1))


def _partial(x, y, covariates, groups, n) -> float:
    d = _design(covariates, groups, n)
    return _pearson(_residual_ranks(x, d), _residual_ranks(y, d))


def partial_rho(x, y, covariates: list, strata: Sequence, min_n: int = 5, boot: int = 1000,
                perms: int = 2000, seed: int = 0) -> Estimate:
    """Partial Spearman rho of x and y given `covariates` (each a sequence like x) and strata."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    covs = [np.asarray(c, float) for c in covariates]
    groups = strata_index(strata, min_n)
    keep = np.concatenate(groups) if groups else np.arange(0)
    if len(keep) < len(covs) + len(groups) + 3:
        return Estimate(0.0, 0.0, 0.0, 1.0, len(keep), 0)
    x, y, covs = x[keep], y[keep], [c[keep] for c in covs]
    rng = np.random.default_rng(seed)
    blocks = _blocks(groups)
    n = len(keep)
    value = _partial(x, y, covs, blocks, n)
    boots = []
    for _ in range(boot):
        rows = _boot_rows(blocks, rng)
        boots.append(_partial(x[rows], y[rows], [c[rows] for c in covs], blocks, n))
    hits = sum(abs(_partial(x, _permute_within(y, blocks, rng), covs, blocks, n))
               >= abs(value) - 1e-12 for _ in range(perms))
    lo, hi = np.percentile(boots, [2.5, 97.5])
    n_eff = n - len(covs) - len(groups) + 1
    return Estimate(value, float(lo), float(hi), (hits + 1) / (perms + 1), n, n_eff)


def rho_difference(a, b, y, strata: Sequence, min_n: int = 5, boot: int = 1000,
                   seed: int = 0) -> Estimate:
    """within_rho(a, y) - within_rho(b, y), paired bootstrap interval; `p` here is the share of
    resamples with a difference <= 0 (one-sided: how often a does not beat b)."""
    a, b, y = (np.asarray(v, float) for v in (a, b, y))
    groups = strata_index(strata, min_n)
    if not groups:
        return Estimate(0.0, 0.0, 0.0, 1.0, 0, 0)
    value = _within(a, y, groups) - _within(b, y, groups)
    rng = np.random.default_rng(seed)
    blocks = _blocks(groups)
    diffs = []
    for _ in range(boot):
        rows = _boot_rows(groups, rng)
        diffs.append(_within(a[rows], y[rows], blocks) - _within(b[rows], y[rows], blocks))
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    n = int(sum(len(g) for g in groups))
    return Estimate(value, float(lo), float(hi), float(np.mean(np.asarray(diffs) <= 0)), n,
                    int(sum(len(g) - 3 for g in groups) + 3))


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (same keys)."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    m, running, out = len(order), 0.0, {}
    for i, k in enumerate(order):
        running = max(running, min(1.0, (m - i) * pvalues[k]))
        out[k] = running
    return out


def detectable_rho_eff(n_eff: int) -> float:
    """The smallest |rho| a two-sided 0.05 test detects with power 0.8 at effective size n_eff
    (Fisher z, Spearman's variance 1.06 / (n - 3))."""
    if n_eff <= 3:
        return 1.0
    return math.tanh((1.959964 + 0.841621) * math.sqrt(1.06 / (n_eff - 3)))
