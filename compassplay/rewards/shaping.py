"""The proposer's reward as the learner uses it under reward.normalize=gated_rank.

Two terms, the same for every reward kind (difficulty, cosine, inner, novelty, cos_novelty,
soar), so that arms differ only in the score that ranks eligible tasks:

* **the gate**, a class level: unparsed (`format_penalty`), invalid (`invalid_penalty`),
  ineligible (`ineligible_reward`), copy (`copy_reward`: an eligible task whose novelty factor
  is 0 under kinds novelty and cos_novelty, the paper's zero-reward class) and eligible (0).
  The learner z-scores it within each (task type, role) group, so a group whose classes differ
  always has a contrast, whatever the score values; the levels are validated to be strictly
  ordered (config), so no two classes can tie.
* **the direction**, for eligible tasks only: the mid-rank of the task's score among the
  scores of the last `rank_window` eligible candidates of every task type plus this step's,
  mapped to `sqrt(3) * (2u - 1)` (unit variance for distinct ranks, bounded by +-sqrt(3)) and
  multiplied by `rank_weight`. Among eligible tasks of a group, the advantage is ordered by the
  score alone; a lone eligible task is still ranked against the window.

Pure Python: `ScoreWindow` holds the only state (a bounded list of floats, checkpointed by
the learner) and `shape` maps one step's scores to (gate level, direction) per task.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from compassplay.records import Score

#: Scale that gives `2u - 1` for u uniform on (0, 1) unit variance.
RANK_SCALE = math.sqrt(3.0)

#: Kinds whose score multiplies by (or is) the novelty factor: a 0 there is a copy.
NOVELTY_KINDS = ("novelty", "cos_novelty")


def gate_of(*, parse_fail: bool, valid: bool, eligible: bool, kind: str,
            novelty: float | None) -> str:
    """The gate class of one proposal (see the module docstring)."""
    if not valid:
        return "unparsed" if parse_fail else "invalid"
    if not eligible:
        return "ineligible"
    if kind in NOVELTY_KINDS and novelty is not None and novelty <= 0.0:
        return "copy"
    return "eligible"


def gate_levels(format_penalty: float, invalid_penalty: float, ineligible_reward: float,
                copy_reward: float) -> dict[str, float]:
    """Class -> the level the learner z-scores (eligible is 0)."""
    return {"unparsed": float(format_penalty), "invalid": float(invalid_penalty),
            "ineligible": float(ineligible_reward), "copy": float(copy_reward),
            "eligible": 0.0}


def mid_ranks(pool: Sequence[float], values: Sequence[float]) -> list[float]:
    """Mid-rank fraction u in (0, 1) of each of `values` within `pool` (which must contain
    them): (#less + #equal / 2) / len(pool)."""
    ordered = sorted(float(v) for v in pool)
    n = len(ordered)
    out = []
    for v in values:
        lo = bisect.bisect_left(ordered, float(v))
        hi = bisect.bisect_right(ordered, float(v))
        if hi == lo:
            raise ValueError(f"value {v!r} is not in the rank pool")
        out.append((lo + (hi - lo) / 2.0) / n)
    return out


class ScoreWindow:
    """The scores of the last `size` eligible candidates (all task types), oldest first."""

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"rank window size must be >= 0, got {size}")
        self.size = size
        self.scores: deque[float] = deque(maxlen=size or None)

    def directions(self, scores: Sequence[float]) -> list[float]:
        """`sqrt(3) * (2u - 1)` per score, u its mid-rank among the window plus `scores`;
        then `scores` join the window. No NaN is accepted."""
        vals = [float(s) for s in scores]
        if any(math.isnan(v) for v in vals):
            raise ValueError("a proposer score is NaN: it cannot be ranked")
        if not vals:
            return []
        pool = ([*self.scores] if self.size else []) + vals
        out = [RANK_SCALE * (2.0 * u - 1.0) for u in mid_ranks(pool, vals)]
        if self.size:
            self.scores.extend(vals)
        return out

    def state_dict(self) -> dict:
        return {"size": self.size, "scores": list(self.scores)}

    def load_state_dict(self, state: dict) -> None:
        self.scores = deque((float(s) for s in state.get("scores", [])),
                            maxlen=self.size or None)


@dataclass(frozen=True)
class Shaped:
    """The gate level and the direction of one proposal (`direction` 0 unless eligible)."""

    gate: float
    direction: float


def shape(scores: Sequence[Score], levels: dict[str, float], window: ScoreWindow,
          rank_weight: float) -> dict[str, Shaped]:
    """task_id -> Shaped for one step's proposer scores; the eligible scores (in input order)
    are ranked against `window` and then join it."""
    eligible = [s for s in scores if s.gate == "eligible"]
    dirs = dict(zip((s.task_id for s in eligible),
                    window.directions([s.reward for s in eligible]), strict=True))
    return {s.task_id: Shaped(levels[s.gate], rank_weight * dirs.get(s.task_id, 0.0))
            for s in scores}
