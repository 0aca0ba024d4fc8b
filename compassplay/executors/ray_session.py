"""The driver's Ray session: start or join Ray, and call an actor while it restarts."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError

from compassplay.config import RunConfig
from compassplay.errors import RunError


def call_when_up(method, *args, timeout_s: float = 300.0,
                 poll: Callable[[], None] = lambda: None):
    """`ray.get(method.remote(*args))`, waiting while the actor restarts (at most `timeout_s`);
    `poll()` runs about once a second (the driver's Ctrl-C check raises from it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ref = method.remote(*args)
            while not ray.wait([ref], timeout=1.0)[0]:
                poll()
                if time.monotonic() > deadline:
                    raise RunError(f"{method._method_name}() got no answer in {timeout_s:.0f} s")
            return ray.get(ref)
        except (ActorUnavailableError, ActorDiedError):
            if time.monotonic() > deadline:
                raise
            poll()
            time.sleep(0.5)


def init_ray(cfg: RunConfig) -> bool:
    """Connect to `cluster.address` / RAY_ADDRESS, or start an embedded local Ray.

    Returns True when this call started an embedded Ray (the caller shuts it down)."""
    if ray.is_initialized():
        return False
    address = cfg.cluster.address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, log_to_driver=True)
        return False
    c = cfg.cluster
    need = (c.proposer.num_cpus + c.solver.num_cpus + c.verifier.num_cpus * c.num_verifiers
            + c.scorer.num_cpus * cfg.scorer.num_scorers
            + c.learner.num_cpus * cfg.learner.num_ranks
            + (c.eval.num_cpus if cfg.eval.every_steps else 0.0))
    ray.init(num_cpus=max(os.cpu_count() or 1, int(need + 0.999)), include_dashboard=False,
             log_to_driver=True)
    return True
