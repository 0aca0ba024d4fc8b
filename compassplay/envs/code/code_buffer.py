"""The task buffer: seed tasks plus valid proposals, deduplicated, sampled, checkpointed.

Deduction and abduction share one pool of (program, input, output) tasks ("io" family): a task
sampled for either type is returned as a copy with `task_type` set to the requested type.
Induction tasks (program + several pairs + message) form the "induction" family. Any task's
program can serve as the program an induction proposal writes inputs for.

Dedup key: family + `ast.unparse`-normalized program + normalized literal inputs. When the
buffer exceeds `capacity`, the oldest proposed tasks are evicted first (seeds are kept).
Sampling strategies: `uniform` over the pool, or `recent` (uniform over the newest
`recent_window` entries of the pool).
"""

from __future__ import annotations

import random
from typing import Any, Literal

from compassplay.envs.code.programs import normalize_program, normalize_value
from compassplay.records import Task

Strategy = Literal["uniform", "recent"]
IO_TYPES = ("deduction", "abduction")


def family(task_type: str) -> str:
    """Pool a task type draws from: 'io' for deduction/abduction, else the type itself."""
    return "io" if task_type in IO_TYPES else task_type


def task_key(task: Task) -> str:
    """Deduplication key of a task (formatting-insensitive program + inputs)."""
    inputs = "\x1f".join(normalize_value(x) for x in task.inputs)
    return f"{family(task.task_type)}\x1e{normalize_program(task.program)}\x1e{inputs}"


class TaskBuffer:
    """Valid tasks available as references and as seed tasks for the solver."""

    def __init__(self, capacity: int = 4096, strategy: Strategy = "uniform",
                 recent_window: int = 256) -> None:
        self.capacity = capacity
        self.strategy = strategy
        self.recent_window = recent_window
        self._tasks: list[Task] = []
        self._keys: set[str] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self):
        return iter(list(self._tasks))

    def add(self, tasks: list[Task]) -> int:
        """Add valid, not-yet-seen tasks (generation payloads dropped); returns how many."""
        added = 0
        for task in tasks:
            if not task.valid or not task.program:
                continue
            key = task_key(task)
            if key in self._keys:
                continue
            self._keys.add(key)
            self._tasks.append(task.model_copy(update={"proposal": None}))
            added += 1
        self._evict()
        return added

    def _evict(self) -> None:
        while len(self._tasks) > self.capacity:
            idx = next((i for i, t in enumerate(self._tasks) if t.source != "seed"), 0)
            self._keys.discard(task_key(self._tasks.pop(idx)))

    def pool(self, task_type: str | None = None) -> list[Task]:
        """Tasks of the family of `task_type` (all tasks when None)."""
        if task_type is None:
            return list(self._tasks)
        fam = family(task_type)
        return [t for t in self._tasks if family(t.task_type) == fam]

    def get(self, task_id: str) -> Task | None:
        """The task with this id, if present."""
        return next((t for t in self._tasks if t.task_id == task_id), None)

    def sample(self, k: int, rng: random.Random, task_type: str | None = None) -> list[Task]:
        """Up to `k` distinct tasks by the buffer's strategy; with `task_type` given, from its
        family and relabelled as that type."""
        pool = self.pool(task_type)
        if self.strategy == "recent":
            pool = pool[-self.recent_window:]
        picked = rng.sample(pool, min(k, len(pool)))
        if task_type is not None and task_type in IO_TYPES:
            picked = [t if t.task_type == task_type else
                      t.model_copy(update={"task_type": task_type}) for t in picked]
        return picked

    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable state (for checkpoints)."""
        return {"capacity": self.capacity, "strategy": self.strategy,
                "recent_window": self.recent_window,
                "tasks": [t.model_dump(mode="json") for t in self._tasks]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the contents with a saved state."""
        self.capacity = int(state.get("capacity", self.capacity))
        self.strategy = state.get("strategy", self.strategy)
        self.recent_window = int(state.get("recent_window", self.recent_window))
        self._tasks, self._keys = [], set()
        for d in state.get("tasks", []):
            task = Task.model_validate(d)
            key = task_key(task)
            if key not in self._keys:
                self._keys.add(key)
                self._tasks.append(task)
