"""The Lean fleet of a Ray run: one `LeanFleetActor` owns the `LeanFleet`, and each
verifier actor checks through a `FleetLeanPool` (LeanPool's interface: check_many, stats).

    fleet = LeanFleetActor.options(name=f"{run}:lean-fleet").remote(cfg.verifiers.lean)
    pool = FleetLeanPool(fleet, cfg.verifiers.lean)  # the backend of a VerifierActor's env
    verdicts = pool.check_many(checks)               # spread over LeanVerifier actors

`LeanFleetActor.submit` resizes the fleet for the new backlog (the scaling policy is the pure
`LeanScaler`) and splits the batch over the placed LeanVerifier actors (all of it to one still
waiting for resources only when none is placed; the pure decisions of this module live in
`verifiers/lean/routing.py`), returning their
ObjectRefs: the verifier actor waits on them, not the fleet actor. A background thread polls
every `scaling.poll_s`, so actors go after `scaling.idle_grace_s` without traffic, and records
(t, backlog, actors) whenever they change (`history()`, the driver's per-step `lean_actors`
fields). Its timeline (`take_timeline()`) adds what the cluster did about it: placed actors,
alive nodes per type, and the seconds from each actor's demand to its start; the driver
appends it to lean_fleet.jsonl once per step (`ray_monitors.LeanMonitor`).

Nothing waits silently: an actor that is not placed (no node has a free `lean_repl`) is logged
every 10 s with what it asks for and what the cluster has free; after
`verifiers.lean.resource_wait_s` the fleet reports a problem, and every waiting `FleetLeanPool`
either raises `ResourceWaitError` (the driver then stops the run, no retry) or, with
`verifiers.lean.on_no_resource=local`, switches to a LeanPool of its own. A LeanVerifier whose
constructor fails (e.g. the REPL command does not exist) stops the run the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from compassplay.actors.lean.fleet import LeanFleet
from compassplay.actors.whereabouts import here, node_kind
from compassplay.errors import FatalStageError, ResourceWaitError
from compassplay.verifiers.lean.repl_pool import LeanCheck, LeanPool, as_check
from compassplay.verifiers.lean.responses import STATUSES, LeanVerdict
from compassplay.verifiers.lean.routing import (
    PlacementPolicy,
    Resubmit,
    split_checks,
    with_resubmits,
)

log = logging.getLogger(__name__)

Problem = tuple[str, str]  # (kind: '' | 'resource' | 'start', message)
NO_PROBLEM: Problem = ("", "")


def _free() -> dict[str, float]:
    try:
        free = ray.available_resources()
    except Exception:  # noqa: BLE001 -- only for a message
        return {}
    return {k: round(v, 2) for k, v in free.items()
            if not k.startswith("node:") and k not in ("memory", "object_store_memory")}


@ray.remote(max_concurrency=64)
class LeanFleetActor:
    """Owns the run's LeanVerifier actors; threaded (calls and the poll thread share a lock)."""

    def __init__(self, cfg: Any, log_every_s: float = 10.0) -> None:
        self.cfg = cfg
        self.policy = PlacementPolicy(cfg.resource_wait_s, log_every_s)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.fleet = LeanFleet.from_config(cfg)
        self._t0 = time.monotonic()
        self._peak = self.fleet.size()
        self._history: list[tuple[float, int, int]] = []
        self._timeline: list[dict[str, Any]] = []  # rows since the last take_timeline()
        self._last_row: tuple = ()
        self._nodes: dict[str, int] = {}
        self._nodes_at = -1e9  # monotonic s of the last node count
        self._problem: Problem = NO_PROBLEM
        self._last_log = 0.0
        self._note()
        self._thread = threading.Thread(target=self._loop, name="lean-fleet-poll", daemon=True)
        self._thread.start()

    def where(self) -> dict:
        """This actor's node, node type and assigned resources (`whereabouts.here`)."""
        return here()

    def ready(self) -> tuple[str, str]:
        return "", ""  # the shells' start-up report: built

    # ------------------------------------------------------------------ calls
    def submit(self, checks: Sequence[LeanCheck]) -> tuple[list[Any], Problem]:
        """ObjectRefs of list[LeanVerdict] covering `checks` in order, or ([], problem)."""
        with self._lock:
            if self._problem != NO_PROBLEM:
                return [], self._problem
            f = self.fleet
            f.poll(extra=len(checks))
            # (none placed yet: the whole batch waits on one actor; see _watch for the rest)
            refs = [f.submit(list(checks[part])) for part in
                    split_checks(len(checks), f.placed(), f.scaler.checks_per_actor)]
            self._note()
            return refs, NO_PROBLEM

    def problem(self) -> Problem:
        """What stops the fleet, after reaping what finished now: a caller whose batch just
        failed sees the constructor failure behind it, not only after the next poll."""
        with self._lock:
            try:
                self.fleet.poll()
                self._note()
                self._watch()
            except Exception:  # noqa: BLE001 -- the answer is still the last known problem
                log.exception("Lean fleet poll failed")
            return self._problem

    def state(self) -> dict[str, Any]:
        """Actors now, the most since the last state() call, backlog, unplaced actors."""
        with self._lock:
            size = self.fleet.size()
            out = {"actors": size, "peak": max(self._peak, size),
                   "backlog": self.fleet.backlog(), "unplaced": len(self.fleet.unplaced_ages()),
                   "problem": self._problem[1]}
            self._peak = size
            return out

    def history(self) -> list[tuple[float, int, int]]:
        """(seconds since the fleet started, backlog, actors) at every change."""
        with self._lock:
            return list(self._history)

    def take_timeline(self) -> list[dict[str, Any]]:
        """The timeline rows recorded since the last call (and forgets them): {t: s since the
        fleet started, unix: s, backlog, actors, placed, nodes: {node type: alive count},
        start_waits: [s from demand to a started actor, for each actor started since the
        row before]}; a row is kept whenever one of these changes."""
        with self._lock:
            self._note()
            out, self._timeline = self._timeline, []
            return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock:
            self.fleet.close()
            self._note()

    # ------------------------------------------------------------------ inside
    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.scaling.poll_s):
            with self._lock:
                try:
                    self.fleet.poll()
                    self._note()
                    self._watch()
                except Exception:  # noqa: BLE001 -- keep polling; the log says why
                    log.exception("Lean fleet poll failed")

    def _note(self) -> None:
        size, backlog = self.fleet.size(), self.fleet.backlog()
        self._peak = max(self._peak, size)
        t = round(time.monotonic() - self._t0, 2)
        if not self._history or self._history[-1][1:] != (backlog, size):
            self._history.append((t, backlog, size))
        placed, waits, nodes = self.fleet.placed(), self.fleet.take_start_waits(), self._count()
        row = (backlog, size, placed, tuple(sorted(nodes.items())))
        if waits or row != self._last_row:
            self._last_row = row
            self._timeline.append({"t": t, "unix": round(time.time(), 3), "backlog": backlog,
                                   "actors": size, "placed": placed, "nodes": nodes,
                                   "start_waits": waits})

    def _count(self, every_s: float = 1.0) -> dict[str, int]:
        """Alive nodes per node type (`whereabouts.node_kind`), asked of the GCS at most every
        `every_s` seconds; the last count while the GCS does not answer."""
        now = time.monotonic()
        if now - self._nodes_at >= every_s:
            self._nodes_at = now
            try:
                self._nodes = dict(Counter(node_kind(n) for n in ray.nodes() if n.get("Alive")))
            except Exception:  # noqa: BLE001 -- a count for the timeline only
                log.debug("node count unavailable", exc_info=True)
        return dict(self._nodes)

    def _watch(self) -> None:
        """Log actors waiting for placement; past resource_wait_s (or on a constructor
        failure) set the problem every waiting FleetLeanPool reads."""
        if self._problem != NO_PROBLEM:
            return
        f = self.fleet
        if f.failure:
            self._problem = ("start", f"a LeanVerifier actor failed to start: {f.failure}")
            log.error("%s", self._problem[1])
            f.drop_unplaced()
            return
        ages = f.unplaced_ages()
        if not ages:
            return
        policy = self.policy
        if f.placed() and f.drop_unplaced(loaded_older_than=policy.drop_loaded_after_s):
            # checks wait on an actor the cluster cannot place while others run: the
            # FleetLeanPool sees the batch fail and resubmits it (to the placed actors)
            log.warning("dropped LeanVerifier actors that waited for placement with checks "
                        "queued; %d placed actor(s) take them", f.placed())
            self._note()
            ages = f.unplaced_ages()
            if not ages:
                return
        now = time.monotonic()
        if policy.log_due(ages[0], now, self._last_log):
            self._last_log = now
            log.warning("%s", policy.waiting_message(len(ages), ages[0], f.actor_request(),
                                                     _free()))
        if policy.gives_up(ages[0], f.placed()):
            self._problem = ("resource", policy.give_up_message(
                len(ages), f.actor_request(), ray.cluster_resources(), _free()))
            log.error("%s", self._problem[1])
            f.drop_unplaced()
            self._note()


class FleetLeanPool:
    """A verifier actor's Lean backend in fleet mode: checks go to the run's LeanFleetActor."""

    def __init__(self, fleet: Any, cfg: Any, log_every_s: float = 10.0) -> None:
        self.fleet, self.cfg, self.log_every_s = fleet, cfg, log_every_s
        self.local: LeanPool | None = None  # after a fallback (on_no_resource=local)
        self._counts: Counter[str] = Counter({s: 0 for s in STATUSES})
        self._total = 0
        self._wait_s = 0.0

    def start(self) -> FleetLeanPool:
        return self

    def check_many(self, requests: Sequence[LeanCheck | str]) -> list[LeanVerdict]:
        checks = [as_check(r) for r in requests]
        if not checks:
            return []
        verdicts = self._on_fleet(checks) if self.local is None else None
        if verdicts is None:
            assert self.local is not None
            verdicts = self.local.check_many(checks)
        self._total += len(verdicts)
        self._counts.update(v.status for v in verdicts)
        return verdicts

    def check(self, request: LeanCheck | str) -> LeanVerdict:
        return self.check_many([request])[0]

    def _on_fleet(self, checks: list[LeanCheck]) -> list[LeanVerdict] | None:
        """The fleet's verdicts; None after switching to a local pool."""
        return with_resubmits(lambda: self._fleet_once(checks), f"{len(checks)} Lean checks")

    def _fleet_once(self, checks: list[LeanCheck]) -> list[LeanVerdict] | None:
        refs, problem = ray.get(self.fleet.submit.remote(checks))
        if problem != NO_PROBLEM:
            return self._handle(problem)
        start = last = time.monotonic()
        pending = list(refs)
        try:
            while pending:
                _, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
                if not pending:
                    break
                problem = ray.get(self.fleet.problem.remote(), timeout=60)
                if problem != NO_PROBLEM:
                    return self._handle(problem)
                now = time.monotonic()
                if now - last >= self.log_every_s:
                    last = now
                    log.warning("waiting %.0f s for %d Lean checks on the fleet (%d of %d "
                                "batches pending; fleet %s)", now - start, len(checks),
                                len(pending), len(refs),
                                ray.get(self.fleet.state.remote(), timeout=60))
            return [v for batch in ray.get(refs) for v in batch]
        except RayActorError as exc:  # e.g. its actor was dropped while waiting for placement
            problem = ray.get(self.fleet.problem.remote(), timeout=60)
            if problem != NO_PROBLEM:
                return self._handle(problem)
            raise Resubmit(type(exc).__name__) from exc
        except RayError:
            problem = ray.get(self.fleet.problem.remote(), timeout=60)
            if problem != NO_PROBLEM:
                return self._handle(problem)
            raise
        finally:
            self._wait_s += time.monotonic() - start

    def _handle(self, problem: Problem) -> None:
        kind, message = problem
        if kind == "resource" and self.cfg.on_no_resource == "local":
            log.warning("%s -- falling back to a local pool of %d Lean REPLs in this verifier "
                        "actor (verifiers.lean.on_no_resource=local)", message,
                        self.cfg.processes)
            self.local = LeanPool.from_config(self.cfg).start()
            return None
        if kind == "resource":
            raise ResourceWaitError(message)
        raise FatalStageError(message)

    def stats(self) -> dict[str, Any]:
        """Verdicts by status as this verifier received them; `fallback_local` after a
        fallback (then `local` holds that pool's stats)."""
        out: dict[str, Any] = {"counts": dict(self._counts), "checks_total": self._total,
                               "backend": "fleet", "fleet_wait_s": round(self._wait_s, 3),
                               "fallback_local": self.local is not None}
        if self.local is not None:
            out["local"] = self.local.stats()
        return out

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
