import math

import pytest

from compassplay.config import AZR_CODE_OUTSIDE_REWARD
from compassplay.rewards import functions as F


def test_difficulty_values_inside_and_outside_the_band():
    assert F.difficulty(0.25) == pytest.approx(0.75)
    assert F.difficulty(0.5) == pytest.approx(0.5)
    assert F.difficulty(0.0) == 0.0 and F.difficulty(1.0) == 0.0  # AZR's paper equation
    code = AZR_CODE_OUTSIDE_REWARD
    assert code == -0.5
    assert F.difficulty(0.0, outside=code) == -0.5  # AZR's released code
    assert F.difficulty(1.0, outside=code) == -0.5
    assert F.difficulty(0.75, outside=code) == pytest.approx(0.25)  # inside: unchanged
    for bad in (-0.1, 1.1, math.nan):
        with pytest.raises(ValueError):
            F.difficulty(bad)


def test_cosine_and_inner_rewards():
    assert F.cosine_reward(0.3) == pytest.approx(0.3)
    assert F.cosine_reward(1.0000001) == 1.0
    with pytest.raises(ValueError):
        F.cosine_reward(math.nan)
    assert F.inner_reward(2.0, eta=0.01) == pytest.approx(0.02)
    assert F.inner_reward(-4.0, eta=0.5) == pytest.approx(-2.0)


def test_safe_cosine_zero_norm_is_zero_not_nan():
    assert F.safe_cosine(0.0, 0.0, 3.0) == 0.0
    assert F.safe_cosine(0.0, 2.0, 0.0) == 0.0
    assert F.safe_cosine(6.0, 2.0, 3.0) == pytest.approx(1.0)
    assert F.safe_cosine(-3.0, 2.0, 3.0) == pytest.approx(-0.5)


def test_novelty_token_ids():
    # sets {1,2,3} vs {2,3,4}: |inter| = 2, |union| = 4 -> Jaccard 0.5
    assert F.token_jaccard([1, 2, 3, 3], [2, 3, 4]) == pytest.approx(0.5)
    assert F.novelty([1, 2, 3], [2, 3, 4]) == pytest.approx(0.5)
    assert F.novelty([1, 2], [1, 2, 2]) == 0.0
    assert F.novelty([1], [2]) == 1.0
    assert F.novelty([], []) == 0.0


def test_novelty_regex_tokenizer():
    assert F.regex_tokenize("f(x) = x+1") == ["f", "(", "x", ")", "=", "x", "+", "1"]
    # {def, f, (, x, ), :, return} vs {def, g, (, x, ), :, return}: inter 6, union 8
    a, b = "def f(x): return x", "def g(x): return x"
    assert F.text_novelty(a, b) == pytest.approx(1 - 6 / 8)
    assert F.text_novelty("a b", "a c", pattern=r"\S") == pytest.approx(1 - 1 / 3)
    assert F.text_novelty("A", "a", tokenizer=lambda s: s.lower().split()) == 0.0


def test_combined_rewards_and_eligibility():
    assert F.cos_novelty_reward(0.5, 0.4) == pytest.approx(0.2)
    assert F.novelty_reward(0.7) == pytest.approx(0.7)
    assert F.is_eligible(0.5)
    assert not F.is_eligible(0.0) and not F.is_eligible(1.0)
    assert not F.is_eligible(0.5, valid=False)
    assert not F.is_eligible(0.5, has_solution=False)
    assert not F.is_eligible(0.2, low=0.25)


def test_format_penalty_and_proposer_reward():
    assert F.format_penalty(True) is None
    assert F.format_penalty(False) == -1.0
    assert F.format_penalty(False, penalty=-0.5) == -0.5
    kw = dict(solve_rate=0.5, cosine=0.6, inner=3.0, novelty_value=0.5, eta=0.1)
    assert F.proposer_reward("cosine", **kw) == pytest.approx(0.6)
    assert F.proposer_reward("inner", **kw) == pytest.approx(0.3)
    assert F.proposer_reward("cos_novelty", **kw) == pytest.approx(0.3)
    assert F.proposer_reward("novelty", **kw) == pytest.approx(0.5)
    assert F.proposer_reward("difficulty", **kw) == pytest.approx(0.5)
    assert F.proposer_reward("cosine", well_formed=False, **kw) == -1.0
    kw["solve_rate"] = 1.0
    assert F.proposer_reward("cosine", **kw) == 0.0
    assert F.proposer_reward("cosine", ineligible_reward=-0.2, **kw) == -0.2
    assert F.proposer_reward("difficulty", **kw) == 0.0
    assert F.proposer_reward("difficulty", ineligible_reward=-0.5, **kw) == -0.5
    with pytest.raises(ValueError, match="cosine"):
        F.proposer_reward("cosine", solve_rate=0.5)
    with pytest.raises(ValueError, match="unknown"):
        F.proposer_reward("bogus", solve_rate=0.5)
