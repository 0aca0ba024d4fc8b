"""Wait for a run's actors to come up: log what is pending, name the one that fails.

Ray places an actor when the cluster has its resources. `wait_ready` calls every actor's
`ready()` (see `actors.shells`: the constructor keeps its error instead of raising), logs
every `log_every_s` seconds which roles are still pending with the resources they asked for
and what the cluster has free, and turns a constructor failure into one
`ActorStartError` naming the role and the cause (the traceback goes to the DEBUG log).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, RayTaskError

from compassplay.errors import ActorStartError

log = logging.getLogger(__name__)


def describe_cause(exc: BaseException) -> str:
    """The original exception behind a Ray actor/task error, as 'Type: message'."""
    cause: Any = exc
    if isinstance(exc, ActorDiedError) and isinstance(getattr(exc, "cause", None), RayTaskError):
        cause = exc.cause
    if isinstance(cause, RayTaskError):
        inner = getattr(cause, "cause", None)
        if inner is not None:
            cause = inner
        else:  # the exception could not be deserialized: the last line of its traceback
            lines = [x for x in str(cause).strip().splitlines() if x.strip()]
            return lines[-1].strip() if lines else type(cause).__name__
    first = " ".join(str(cause).split())[:500]
    if isinstance(cause, RayActorError) and not first:
        first = RayActorError.__name__
    return f"{type(cause).__name__}: {first}" if first else type(cause).__name__


def failed_call(exc: BaseException) -> str:
    """The actor call a Ray error came from ('SolverActor.run_stage'): the innermost one of a
    chain (a task whose input failed names that input's task too), else the error's type."""
    calls = re.findall(r"ray::([\w.]+)\(\)", re.sub(r"\x1b\[[0-9;]*m", "", str(exc)))
    return calls[-1] if calls else type(exc).__name__


def _free() -> str:
    try:
        free = ray.available_resources()
    except Exception:  # noqa: BLE001 - only for a log line
        return "unknown"
    keep = {k: round(v, 2) for k, v in free.items()
            if not k.startswith("node:") and k not in ("memory", "object_store_memory")}
    return str(keep)


def wait_ready(actors: dict[str, Any], requests: dict[str, dict[str, float]],
               timeout_s: float, log_every_s: float = 10.0,
               poll: Callable[[], None] = lambda: None) -> None:
    """Block until every actor in `actors` (role name -> handle) has finished its constructor.

    `requests[role]` is what the actor asked for (for the log). `timeout_s` 0 waits forever
    (with a log line every `log_every_s`); otherwise pending roles fail with ActorStartError.
    `poll()` runs about once a second (the driver's Ctrl-C check raises from it)."""
    refs = {a.ready.remote(): role for role, a in actors.items()}
    start = last = time.monotonic()
    while refs:
        done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=1.0)
        poll()
        for ref in done:
            role = refs.pop(ref)
            try:
                cause, trace = ray.get(ref)
            except (RayActorError, RayTaskError, GetTimeoutError) as exc:
                raise ActorStartError(role, describe_cause(exc)) from None
            if cause:
                log.debug("the %s actor's constructor failed:\n%s", role, trace)
                raise ActorStartError(role, cause)
        now = time.monotonic()
        if refs and now - last >= log_every_s:
            pending = ", ".join(f"{r} (asks {requests.get(r, {})})" for r in refs.values())
            log.info("waiting %.0f s for actors to start: %s; cluster has free %s",
                     now - start, pending, _free())
            last = now
        if refs and timeout_s and now - start > timeout_s:
            pending = ", ".join(f"{r} asks {requests.get(r, {})}" for r in refs.values())
            raise ActorStartError(
                sorted(refs.values())[0] if len(refs) == 1 else "/".join(sorted(refs.values())),
                f"not started after {timeout_s:.0f} s ({pending}; the cluster has free "
                f"{_free()}). Lower the cluster.<role>.num_cpus/num_gpus requests, add nodes, "
                "or raise cluster.startup_timeout_s")
