"""pass@k against a direct combinatorial count, and the binomial standard error."""

from __future__ import annotations

import itertools
import math

import pytest

from compassplay.eval.pass_at_k import (
    binomial_stderr,
    mean_pass_at_k,
    pass_at_k,
    report_ks,
)


def _enumerated(n: int, c: int, k: int) -> float:
    """Fraction of all k-subsets of n samples (the first c correct) with a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_equals_the_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(_enumerated(n, c, k), abs=1e-12)
            assert pass_at_k(n, c, k) == pytest.approx(
                1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_edges_and_large_n():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 = c / n
    assert pass_at_k(10, 0, 10) == 0.0 and pass_at_k(10, 1, 10) == 1.0
    assert pass_at_k(200, 2, 100) == pytest.approx(1 - math.comb(198, 100) / math.comb(200, 100))
    for bad in ((3, 4, 1), (3, 1, 0), (3, 1, 4), (3, -1, 1)):
        with pytest.raises(ValueError, match="pass@k"):
            pass_at_k(*bad)


def test_mean_over_items_and_reported_ks():
    assert mean_pass_at_k(4, [0, 4, 2], 1) == pytest.approx((0 + 1 + 0.5) / 3)
    assert mean_pass_at_k(4, [0, 4, 2], 4) == pytest.approx(2 / 3)
    assert report_ks(1) == [1] and report_ks(4) == [1, 2, 4] and report_ks(10) == [1, 2, 4, 8, 10]


def test_binomial_stderr():
    assert binomial_stderr(0.5, 100) == pytest.approx(0.05)
    assert binomial_stderr(1.0, 7) == 0.0 and binomial_stderr(0.3, 0) == 0.0
