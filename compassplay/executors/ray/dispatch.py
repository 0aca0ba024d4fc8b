"""How the Ray driver submits stages and tells what runs: stage calls as actor calls, the refs
of a step in flight, and which stage errors no retry can fix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ray

from compassplay.actors.placement import ActorSet
from compassplay.errors import FatalStageError
from compassplay.step.graph import Role, StageCall


class RayDispatch:
    """A Dispatch that submits each stage as an actor call (handles are ObjectRefs)."""

    def __init__(self, actors: ActorSet) -> None:
        self.by_role: dict[Role, list[Any]] = {
            "proposer": [actors.proposer], "solver": [actors.solver],
            "verifier": actors.verifiers, "scorer": actors.scorers,
            "learner": [actors.learner]}

    def count(self, role: Role) -> int:
        return len(self.by_role[role])

    def call(self, role: Role, index: int, call: StageCall, args: list[Any]) -> Any:
        return self.by_role[role][index].run_stage.remote(call, *args)


@dataclass
class InFlight:
    """The refs of one submitted step: its result and every stage's handle(s)."""

    step: int
    result: Any
    handles: dict[str, Any] = field(default_factory=dict)

    def running_stage(self) -> str:
        """The first stage (graph order) whose output is not ready yet, '' when all are."""
        for name, h in self.handles.items():
            refs = [r for r in (h if isinstance(h, list) else [h]) if r is not None]
            if refs and len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) < len(refs):
                return name
        return ""


def is_fatal(exc: BaseException) -> bool:
    """A stage error a retry cannot fix (`FatalStageError`, e.g. no node offers lean_repl)."""
    seen: Any = exc
    for _ in range(4):
        if isinstance(seen, FatalStageError):
            return True
        seen = getattr(seen, "cause", None)
        if seen is None:
            break
    return "FatalStageError" in str(exc) or "ResourceWaitError" in str(exc)
