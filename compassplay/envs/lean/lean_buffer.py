"""The Lean seed buffer: the target set, and the first verified proof of each proved target.

Seeds (what the proposer is conditioned on) are the proved targets; `unsolved` are the rest
(the solver keeps attempting them). Coverage = proved / targets. The targets themselves come
from the target file, so the checkpoint state holds only the proofs (by target id).
"""

from __future__ import annotations

import random
from typing import Any

from compassplay.records import Task


class LeanBuffer:
    """Targets plus their proofs; the proposer's seeds are the proved targets."""

    def __init__(self, targets: list[Task]) -> None:
        self.targets = {t.task_id: t for t in targets}
        self.proofs: dict[str, str] = {}  # target id -> first verified proof (full theorem)

    def __len__(self) -> int:
        return len(self.proofs)

    def record(self, task_id: str, proof: str) -> bool:
        """Keep the first proof of a target; True when the target is newly proved."""
        if task_id not in self.targets or task_id in self.proofs:
            return False
        self.proofs[task_id] = proof
        return True

    def seeds(self) -> list[Task]:
        """Proved targets, in the order they were proved."""
        return [self.targets[i] for i in self.proofs]

    def unsolved(self) -> list[Task]:
        return [t for i, t in self.targets.items() if i not in self.proofs]

    def coverage(self) -> float:
        return len(self.proofs) / len(self.targets) if self.targets else 0.0

    def sample_seed(self, rng: random.Random) -> Task | None:
        seeds = self.seeds()
        return rng.choice(seeds) if seeds else None

    def sample_unsolved(self, k: int, rng: random.Random) -> list[Task]:
        pool = self.unsolved()
        return rng.sample(pool, min(k, len(pool)))

    def state_dict(self) -> dict[str, Any]:
        return {"proofs": dict(self.proofs)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.proofs = {k: v for k, v in state.get("proofs", {}).items() if k in self.targets}
