"""Arms compared paired by seed: runs of two arms with the same seed share every random draw up
to their first update, so the per-seed difference removes that shared noise.

For differences d_1..d_n (arm minus baseline, one per seed both arms ran): the mean, a
percentile bootstrap interval over seeds, and the two-sided sign-flip permutation p-value
(exact over all 2^n sign patterns for n <= 16, else `samples` random patterns). Its power is
stated beside it: with n seeds no p-value can be below 2 / 2^n (`min_p`), so 3 seeds can never
reach p < 0.25, however large the effect.
"""

from __future__ import annotations

import itertools
import random
import statistics
from dataclasses import asdict, dataclass

EXACT_MAX_N = 16


@dataclass(frozen=True)
class PairedDiff:
    """Arm minus baseline over `n` shared seeds (units of the compared value)."""

    n: int
    mean: float
    ci_low: float
    ci_high: float
    p: float
    min_p: float
    seeds: list[int]

    def as_dict(self) -> dict:
        return asdict(self)

    def text(self, scale: float = 1.0, digits: int = 4) -> str:
        """'+0.0123 [95% CI -0.0010, +0.0250], sign-flip p=0.25 (n=3 seeds, min p 0.25)'."""
        f = f"{{:+.{digits}f}}"
        return (f"{f.format(scale * self.mean)} [95% CI {f.format(scale * self.ci_low)}, "
                f"{f.format(scale * self.ci_high)}], sign-flip p={self.p:.3g} "
                f"(n={self.n} seed{'s' if self.n != 1 else ''}, min p {self.min_p:.3g})")


def sign_flip_p(diffs: list[float], samples: int = 20_000, seed: int = 0) -> float:
    """Two-sided p of H0 'the differences are symmetric around 0': the share of sign patterns
    whose |mean| is at least the observed |mean| (the observed pattern included)."""
    n = len(diffs)
    if n == 0:
        return 1.0
    observed = abs(sum(diffs)) - 1e-12 * max(1.0, sum(abs(d) for d in diffs))
    if n <= EXACT_MAX_N:
        hits = sum(abs(sum(s * d for s, d in zip(signs, diffs, strict=True))) >= observed
                   for signs in itertools.product((1, -1), repeat=n))
        return hits / 2 ** n
    rng = random.Random(seed)
    hits = sum(abs(sum(d if rng.random() < 0.5 else -d for d in diffs)) >= observed
               for _ in range(samples))
    return (hits + 1) / (samples + 1)


def bootstrap_ci(diffs: list[float], level: float = 0.95, samples: int = 10_000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean over seeds (resampled with replacement)."""
    if not diffs:
        return (float("nan"), float("nan"))
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(statistics.fmean(rng.choices(diffs, k=n)) for _ in range(samples))
    lo = means[int((1 - level) / 2 * (samples - 1))]
    hi = means[int((1 + level) / 2 * (samples - 1))]
    return lo, hi


def paired_diff(arm: dict[int, float], base: dict[int, float]) -> PairedDiff | None:
    """`arm`, `base`: seed -> value. None when the arms share no seed."""
    seeds = sorted(set(arm) & set(base))
    if not seeds:
        return None
    diffs = [arm[s] - base[s] for s in seeds]
    lo, hi = bootstrap_ci(diffs)
    return PairedDiff(n=len(seeds), mean=statistics.fmean(diffs), ci_low=lo, ci_high=hi,
                      p=sign_flip_p(diffs), min_p=min(1.0, 2.0 / 2 ** len(seeds)),
                      seeds=seeds)


T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
       10: 2.23, 11: 2.20, 12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 20: 2.09, 30: 2.04}


def t_summary(diffs: list[float]) -> dict[str, float | list[float]]:
    """Paired differences d_1..d_n (n >= 2): the mean, its 95% t interval (Student's t at
    n - 1 degrees of freedom, or at the nearest tabulated count below it: a slightly wider
    interval) and `detectable`, the smallest true difference this design finds at 80% power
    with a two-sided 5% test (2.8 sd / sqrt(n))."""
    n = len(diffs)
    if n < 2:
        raise ValueError(f"t_summary needs at least 2 differences, got {n}")
    mean, sd = statistics.mean(diffs), statistics.stdev(diffs)
    t = T95[max(k for k in T95 if k <= n - 1)]
    half = t * sd / n ** 0.5
    return {"n": n, "difference": mean, "ci95": [mean - half, mean + half],
            "detectable": 2.8 * sd / n ** 0.5}
