"""Rank statistics against scipy-free direct computations and known cases."""

import numpy as np
import pytest

from compassplay.eval.rank_stats import (
    detectable_rho,
    line_fit,
    rank_correlation,
    ranks,
    spearman,
    top_k_mean,
)


def test_ranks_and_spearman_against_the_textbook_formula():
    assert ranks(np.array([3.0, 1.0, 2.0, 2.0])).tolist() == [4.0, 1.0, 2.5, 2.5]
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=40), rng.normal(size=40)
    rx, ry = ranks(x), ranks(y)  # no ties: rho = 1 - 6 sum d^2 / (n (n^2 - 1))
    want = 1 - 6 * ((rx - ry) ** 2).sum() / (40 * (40 ** 2 - 1))
    assert spearman(x, y) == pytest.approx(want, abs=1e-12)
    assert spearman(x, np.exp(x)) == pytest.approx(1.0)
    assert spearman(x, np.ones(40)) == 0.0


def test_rank_correlation_finds_a_real_effect_and_not_a_null_one():
    rng = np.random.default_rng(1)
    x = rng.normal(size=80)
    strong = rank_correlation(x, x + rng.normal(scale=1.0, size=80), boot=500, perms=1000)
    assert strong.rho > 0.5 and strong.p < 0.01 and strong.ci_low > 0.3
    assert strong.ci_low <= strong.rho <= strong.ci_high
    null = rank_correlation(x, rng.normal(size=80), boot=500, perms=1000)
    assert null.p > 0.01 and null.ci_low < 0 < null.ci_high


def test_power_top_k_and_line():
    assert detectable_rho(60) == pytest.approx(0.36, abs=0.02)  # 60 candidates
    assert detectable_rho(200) < detectable_rho(60) < detectable_rho(20)
    assert top_k_mean([0.1, 0.9, 0.5, 0.7], [1.0, 2.0, 3.0, 4.0], 2) == 3.0
    fit = line_fit([0, 1, 2, 3], [1, 3, 5, 7])
    assert fit["slope"] == pytest.approx(2.0) and fit["intercept"] == pytest.approx(1.0)
    assert fit["r2"] == pytest.approx(1.0)
