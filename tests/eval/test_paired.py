"""Paired-by-seed comparison: the sign-flip p against a direct enumeration, the bootstrap
interval's coverage of a known shift, and the power bound stated beside every result."""

import itertools
import random
import statistics

from compassplay.eval.paired import bootstrap_ci, paired_diff, sign_flip_p


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
