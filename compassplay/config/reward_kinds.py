"""What each proposer reward kind needs, declared once (`REWARD_NEEDS`, by `reward.kind`).

The scorer (`workers/scorer_worker.py`: which pass it runs), the memory plan
(`plan/role_memory.py`: what a scorer holds), the dry run (`commands/dry_run.py`: which data it
checks) and the executors (whose snapshot the scorers take) read this table instead of
switching on the kind's name. A new kind: its name in `RewardKind`, its row here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

RewardKind = Literal["difficulty", "cosine", "inner", "novelty", "cos_novelty", "soar",
                     "precond_cosine"]

#: The scorer's work for a kind: none, the gradient-alignment partials, or SOAR's trained
#: copies evaluated on held-out problems.
ScorerPass = Literal["none", "gradients", "heldout_loss"]


@dataclass(frozen=True)
class RewardNeeds:
    """What one reward kind needs from the run beyond the solve rates s(x)."""

    gradients: bool = False  # the scorer's per-candidate loss gradients against a reference
    # gradient (alignment partials: inner products, squared norms)
    heldout_loss: bool = False  # SOAR: a solver copy trained per candidate group, its held-out
    # loss before and after (the scorer's pass; rewards are the measured gains)
    novelty: bool = False  # the novelty factor (token Jaccard to the closest shown reference)
    metric: bool = False  # the learner's AdamW preconditioner travels with the scorer's weights

    @property
    def scorer_pass(self) -> ScorerPass:
        """The scorer's work for the kind (gradients and heldout_loss never both)."""
        return "heldout_loss" if self.heldout_loss else "gradients" if self.gradients \
            else "none"

    def reference_set(self, reference: str) -> bool:
        """Whether the scorer scores against the reference set under `reward.reference`
        (global: one reference gradient; local: each task's own seed instead)."""
        return self.heldout_loss or (self.gradients and reference == "global")


REWARD_NEEDS: dict[str, RewardNeeds] = {
    "difficulty": RewardNeeds(),
    "cosine": RewardNeeds(gradients=True),
    "inner": RewardNeeds(gradients=True),
    "novelty": RewardNeeds(novelty=True),
    "cos_novelty": RewardNeeds(gradients=True, novelty=True),
    "soar": RewardNeeds(heldout_loss=True),
    "precond_cosine": RewardNeeds(gradients=True, metric=True),
}

#: The reward kinds scored by a task's loss gradient against a reference gradient (they need
#: the scorer's model passes and a reference set), in `RewardKind` order.
GRADIENT_KINDS: tuple[str, ...] = tuple(k for k in get_args(RewardKind)
                                        if REWARD_NEEDS[k].gradients)


def reward_needs(kind: str) -> RewardNeeds:
    """The row of `kind` (KeyError names the kinds there are)."""
    try:
        return REWARD_NEEDS[kind]
    except KeyError:
        raise KeyError(f"reward kind {kind!r} has no row in REWARD_NEEDS "
                       f"({', '.join(REWARD_NEEDS)})") from None
