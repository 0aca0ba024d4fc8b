"""LeanVerifier: a thin Ray actor around one LeanPool (all logic lives in the core).

Its Ray resources come from `verifiers.lean.actor` (default `{num_cpus: 1, resources:
{lean_repl: 1}}`), so it only lands on nodes that advertise `lean_repl` -- the Lean node type of
ray_cluster.yaml / deploy/kuberay/raycluster.yaml. `LeanFleet` (fleet.py) adds and
removes these actors to follow the backlog.
"""

from __future__ import annotations

from typing import Any

import ray

from compassplay.actors.whereabouts import here
from compassplay.verifiers.lean.repl_pool import LeanCheck, LeanPool
from compassplay.verifiers.lean.responses import LeanVerdict


@ray.remote
class LeanVerifier:
    """Ray actor owning one pool of Lean REPL processes."""

    def __init__(self, **pool_kwargs: Any) -> None:
        self._pool = LeanPool(**pool_kwargs).start()

    def where(self) -> dict:
        """This actor's node, node type and assigned resources (`whereabouts.here`)."""
        return here()

    def ready(self) -> bool:
        """True once placed and its pool started (the fleet's placement check)."""
        return True

    def check_many(self, requests: list[LeanCheck | str]) -> list[LeanVerdict]:
        return self._pool.check_many(requests)

    def stats(self) -> dict[str, Any]:
        return self._pool.stats()

    def close(self) -> None:
        self._pool.close()


def lean_actor_options(num_cpus: float, resources: dict[str, float],
                       processes: int) -> dict[str, Any]:
    """`.options()` of one LeanVerifier: its resources, room for several concurrent
    check_many calls (they queue inside the pool, which is what `stats()["backlog"]` counts),
    and restarts with retried calls (a check is idempotent)."""
    return {"num_cpus": num_cpus, "resources": dict(resources),
            "max_concurrency": max(4, 2 * processes), "max_restarts": -1,
            "max_task_retries": -1}
