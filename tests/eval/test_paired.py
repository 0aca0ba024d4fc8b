"""Paired-by-seed comparison: the sign-flip p against a direct enumeration, the bootstrap
interval's coverage of a known shift, and the power bound stated beside every result."""

import itertools
import random
import statistics

from compassplay.eval.paired import bootstrap_ci, paired_diff, sign_flip_p, t_summary


def _enumerated_p(diffs):
    obs = abs(statistics.fmean(diffs))
    pats = list(itertools.product((1, -1), repeat=len(diffs)))
    return sum(abs(statistics.fmean([s * d for s, d in zip(p, diffs, strict=True)])) >= obs - 1e-12
               for p in pats) / len(pats)


def test_sign_flip_p_equals_the_enumeration():
    rng = random.Random(3)
    for n in (1, 2, 3, 5, 8):
        diffs = [rng.gauss(0.3, 1.0) for _ in range(n)]
        assert abs(sign_flip_p(diffs) - _enumerated_p(diffs)) < 1e-12
    assert sign_flip_p([1.0, 2.0, 3.0]) == 0.25  # all positive, 3 seeds: the floor 2/8
    assert sign_flip_p([0.5] * 10) == 2 / 1024


def test_large_n_monte_carlo_is_close_to_exact():
    rng = random.Random(0)
    diffs = [rng.gauss(0.4, 1.0) for _ in range(18)]
    exact = _enumerated_p(diffs)
    assert abs(sign_flip_p(diffs) - exact) < 0.02


def test_bootstrap_interval_covers_a_known_shift():
    rng = random.Random(1)
    covered = 0
    for _ in range(60):
        diffs = [rng.gauss(1.0, 1.0) for _ in range(20)]
        lo, hi = bootstrap_ci(diffs, samples=2000, seed=rng.randrange(1 << 30))
        covered += lo <= 1.0 <= hi
    assert covered >= 50  # nominal 95%; the percentile bootstrap runs a little narrow at n=20


def test_paired_diff_pairs_only_shared_seeds():
    d = paired_diff({0: 1.0, 1: 2.0, 2: 3.5}, {0: 0.5, 1: 1.0, 5: 9.0})
    assert d.seeds == [0, 1] and d.n == 2 and d.mean == 0.75 and d.min_p == 0.5
    assert d.ci_low <= d.mean <= d.ci_high
    assert paired_diff({0: 1.0}, {1: 1.0}) is None
    assert "min p 0.5" in d.text()


def test_t_summary_gives_the_t_interval_and_the_designs_power():
    """Against a hand computation: d = 1, 2, 3, 6 (mean 3, sd sqrt(14/3)), t at 3 degrees of
    freedom 3.18; the interval covers the mean, and a design with twice the spread detects
    only twice as large a difference."""
    import math

    import pytest

    out = t_summary([1.0, 2.0, 3.0, 6.0])
    sd = math.sqrt(14 / 3)
    assert out["n"] == 4 and out["difference"] == 3.0
    assert out["ci95"] == pytest.approx([3 - 3.18 * sd / 2, 3 + 3.18 * sd / 2])
    assert out["detectable"] == pytest.approx(2.8 * sd / 2)
    wide = t_summary([2.0, 4.0, 6.0, 12.0])
    assert wide["detectable"] == pytest.approx(2 * out["detectable"])
    assert t_summary([0.1] * 40 + [0.3])["ci95"][0] < 0.1 + 0.2 / 41 < \
        t_summary([0.1] * 40 + [0.3])["ci95"][1]  # past the table: t at 30
    with pytest.raises(ValueError, match="at least 2"):
        t_summary([1.0])
