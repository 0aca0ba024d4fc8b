"""Within-stratum and partial rank correlations see what the pooled one hides, Holm matches
its definition, and the paired difference of two scores' rhos has the right sign."""

import numpy as np
import pytest

from compassplay.eval.rank_stats import spearman
from compassplay.eval.utility_stats import holm, partial_rho, rho_difference, within_rho


def _between_only(seed=0, n=40):
    """Two strata whose means differ in both x and y; inside each, x and y are independent."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(0, 1, n), rng.normal(5, 1, n)])
    y = np.concatenate([rng.normal(0, 1, n), rng.normal(5, 1, n)])
    return x, y, ["a"] * n + ["b"] * n


def test_pooled_rho_sees_the_strata_and_within_rho_does_not():
    x, y, st = _between_only()
    assert spearman(x, y) > 0.6
    w = within_rho(x, y, st, boot=300, perms=300)
    assert abs(w.value) < 0.25 and w.ci_low < 0 < w.ci_high and w.p > 0.05
    assert w.n == 80 and w.n_eff == 80 - 6 + 3


def test_within_rho_finds_a_relation_inside_strata():
    rng = np.random.default_rng(1)
    x = rng.normal(size=60)
    y = x + rng.normal(scale=0.5, size=60)
    st = ["a", "b", "c"] * 20
    w = within_rho(x, y, st, boot=300, perms=300)
    assert w.value > 0.7 and w.ci_low > 0.5 and w.p < 0.01
    small = within_rho(x[:8], y[:8], st[:8], min_n=5)  # every stratum under 5: none left
    assert small.n == 0


def test_partial_rho_removes_a_confounder():
    rng = np.random.default_rng(2)
    length = rng.normal(size=80)
    x = length + rng.normal(scale=0.3, size=80)
    y = length + rng.normal(scale=0.3, size=80)
    st = ["a"] * 80
    assert spearman(x, y) > 0.7
    p = partial_rho(x, y, [length], st, boot=300, perms=300)
    assert abs(p.value) < 0.3 and p.ci_low < 0 < p.ci_high


def test_rho_difference_is_positive_when_the_first_score_is_better():
    rng = np.random.default_rng(3)
    y = rng.normal(size=60)
    good, bad = y + rng.normal(scale=0.3, size=60), y + rng.normal(scale=3.0, size=60)
    st = ["a", "b"] * 30
    d = rho_difference(good, bad, y, st, boot=300)
    assert d.value > 0.2 and d.ci_low > 0 and d.p < 0.05
    assert rho_difference(bad, good, y, st, boot=300).value == pytest.approx(-d.value)


def test_holm_step_down():
    adj = holm({"a": 0.01, "b": 0.04, "c": 0.03})
    assert adj == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert holm({"a": 0.6, "b": 0.5}) == {"a": 1.0, "b": 1.0}
