"""Proposer rewards as pure functions: plain floats and token lists in, floats out.

Nothing here touches a model. `solve_rate` is the solver's empirical success rate on a task in
[0, 1]; `cosine` / `inner` come from `GradientScorer.score` (an `AlignmentScore`). Kind
`precond_cosine` is the cosine too, but the scorer computed it in the metric of the learner's
AdamW optimizer (`GradientScorer.set_metric`, `preconditioner.py`): here it is the same value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Literal

RewardKind = Literal["difficulty", "cosine", "inner", "cos_novelty", "novelty",
                     "precond_cosine"]
REWARD_KINDS: tuple[str, ...] = ("difficulty", "cosine", "inner", "cos_novelty", "novelty",
                                 "precond_cosine")

#: Default regex tokenizer: runs of word characters, or single non-space punctuation characters.
DEFAULT_TOKEN_PATTERN = r"\w+|[^\w\s]"

#: Text -> the tokens a Jaccard compares (model token ids, or `regex_tokenize`'s strings).
Tokenize = Callable[[str], Sequence[Hashable]]

def _check_rate(solve_rate: float) -> float:
    s = float(solve_rate)
    if math.isnan(s) or not 0.0 <= s <= 1.0:
        raise ValueError(f"solve_rate must be in [0, 1], got {solve_rate!r}")
    return s


def difficulty(solve_rate: float, *, outside: float = 0.0) -> float:
    """AZR learnability reward: `1 - s` if `0 < s < 1`, else `outside` (0 in AZR's paper
    equation, -0.5 in its released code:
    `config.AZR_CODE_OUTSIDE_REWARD`)."""
    s = _check_rate(solve_rate)
    if 0.0 < s < 1.0:
        return 1.0 - s
    return float(outside)


def cosine_reward(cosine: float) -> float:
    """The paper's `r_cos = cos(g(x), g_ref)`; a NaN cosine is an error, never a reward."""
    c = float(cosine)
    if math.isnan(c):
        raise ValueError("cosine is NaN")
    return max(-1.0, min(1.0, c))


def inner_reward(inner: float, eta: float = 1.0) -> float:
    """First-order loss decrease `eta * <g(x), g_ref>` (eta: step size, units of the loss)."""
    v = float(inner) * float(eta)
    if math.isnan(v):
        raise ValueError("inner product is NaN")
    return v


def safe_cosine(inner: float, norm_a: float, norm_b: float) -> float:
    """`inner / (norm_a * norm_b)` clamped to [-1, 1]; 0.0 when either norm is zero."""
    if norm_a <= 0.0 or norm_b <= 0.0 or not math.isfinite(norm_a * norm_b):
        return 0.0
    return max(-1.0, min(1.0, float(inner) / (float(norm_a) * float(norm_b))))


def regex_tokenize(text: str, pattern: str = DEFAULT_TOKEN_PATTERN) -> list[str]:
    """Split `text` into the regex tokens used by text novelty (case kept)."""
    return re.findall(pattern, text)


def token_jaccard(a: Iterable[Hashable], b: Iterable[Hashable]) -> float:
    """Jaccard similarity of the token *sets* of `a` and `b`; two empty sets count as identical."""
    sa, sb = set(a), set(b)
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


def closest_index(tokens: Sequence[Hashable], references: Sequence[Sequence[Hashable]]) -> int:
    """Index of the reference with the largest token Jaccard to `tokens` (the first on ties);
    -1 when there are no references."""
    best, best_j = -1, -1.0
    for i, ref in enumerate(references):
        j = token_jaccard(tokens, ref)
        if j > best_j:
            best, best_j = i, j
    return best


def novelty(candidate_tokens: Sequence[Hashable], seed_tokens: Sequence[Hashable]) -> float:
    """`1 - Jaccard(tokens(candidate), tokens(seed))`, in [0, 1]. Tokens: model ids by default."""
    return 1.0 - token_jaccard(candidate_tokens, seed_tokens)


def text_novelty(
    candidate: str,
    seed: str,
    tokenizer: Callable[[str], Sequence[Hashable]] | None = None,
    pattern: str = DEFAULT_TOKEN_PATTERN,
) -> float:
    """Novelty of two texts under `tokenizer` (default: `regex_tokenize` with `pattern`)."""
    tok = tokenizer or (lambda s: regex_tokenize(s, pattern))
    return novelty(tok(candidate), tok(seed))


def cos_novelty_reward(cosine: float, novelty_value: float) -> float:
    """`cos x novelty`: alignment scaled by how different the task is from its seed."""
    return cosine_reward(cosine) * float(novelty_value)


def novelty_reward(novelty_value: float) -> float:
    """Novelty only (ablation without gradient alignment)."""
    return float(novelty_value)


def is_eligible(
    solve_rate: float,
    *,
    valid: bool = True,
    has_solution: bool = True,
    low: float = 0.0,
    high: float = 1.0,
) -> bool:
    """Eligibility for gradient scoring: a valid task with a verified solution whose solve rate
    is strictly inside (low, high) -- the solver neither always fails nor always succeeds."""
    s = _check_rate(solve_rate)
    return bool(valid and has_solution and low < s < high)


def format_penalty(well_formed: bool, penalty: float = -1.0) -> float | None:
    """The reward of an ill-formed proposal (`penalty`), or None when the proposal is well formed."""
    return None if well_formed else float(penalty)


def proposer_reward(
    kind: RewardKind,
    *,
    solve_rate: float,
    well_formed: bool = True,
    eligible: bool | None = None,
    cosine: float | None = None,
    inner: float | None = None,
    novelty_value: float | None = None,
    eta: float = 1.0,
    ineligible_reward: float = 0.0,
    penalty: float = -1.0,
) -> float:
    """Combine the rules: format penalty first, then eligibility, then the chosen reward `kind`.

    `eligible` defaults to `is_eligible(solve_rate)`. `difficulty` ignores eligibility and gives
    `ineligible_reward` outside 0 < s < 1; the other kinds give it to ineligible tasks.
    `precond_cosine` takes `cosine` as given: the caller computed it in the optimizer's metric.
    """
    pen = format_penalty(well_formed, penalty)
    if pen is not None:
        return pen
    if kind == "difficulty":
        return difficulty(solve_rate, outside=ineligible_reward)
    if kind not in REWARD_KINDS:
        raise ValueError(f"unknown reward kind {kind!r}; expected one of {REWARD_KINDS}")
    ok = is_eligible(solve_rate) if eligible is None else eligible
    if not ok:
        return float(ineligible_reward)
    if kind == "novelty":
        return novelty_reward(_need(novelty_value, "novelty_value", kind))
    if kind == "inner":
        return inner_reward(_need(inner, "inner", kind), eta)
    cos = cosine_reward(_need(cosine, "cosine", kind))
    if kind in ("cosine", "precond_cosine"):
        return cos
    return cos_novelty_reward(cos, _need(novelty_value, "novelty_value", kind))


def _need(value: float | None, name: str, kind: str) -> float:
    if value is None:
        raise ValueError(f"reward kind {kind!r} needs {name}")
    return float(value)
