"""LeanFleet: routes Lean checks to LeanVerifier actors and resizes the set of actors.

    fleet = LeanFleet.from_config(cfg.verifiers.lean)
    ref = fleet.submit([LeanCheck(proof)])      # an ObjectRef of list[LeanVerdict]
    fleet.poll()                                # reap, then add/remove actors; call it often
    verdicts = ray.get(ref)

The target count is LeanScaler's (pure, in compassplay/verifiers/lean/scaling.py), fed with
the backlog = checks submitted through this fleet and not finished. New actors ask for
`lean_repl`; when no node has a free one they stay pending and the Ray autoscaler adds a Lean
node; removed actors free their `lean_repl`, and idle Lean nodes are then terminated. Only idle
actors are removed (never one with a check in flight); the next poll retries. A removed actor
is asked to close its REPLs and killed once it has (or after `CLOSE_WAIT_S`) by a later poll:
no call here waits on an actor, so a poll stays short while a node goes away under it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from compassplay.actors.lean.verifier import LeanVerifier, lean_actor_options
from compassplay.actors.startup import describe_cause
from compassplay.verifiers.lean.repl_pool import LeanCheck, as_check
from compassplay.verifiers.lean.scaling import LeanScaler

CLOSE_WAIT_S = 30.0  # a removed actor's REPL shutdown gets this long before it is killed


class LeanFleet:
    """Driver-side owner of LeanVerifier actors (not thread-safe: one driver thread)."""

    def __init__(self, pool_kwargs: dict[str, Any], scaler: LeanScaler, num_cpus: float = 1.0,
                 resources: dict[str, float] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pool_kwargs = dict(pool_kwargs)
        self.scaler = scaler
        self._options = lean_actor_options(num_cpus, {"lean_repl": 1.0} if resources is None
                                           else resources,
                                           int(pool_kwargs.get("processes", 2)))
        self._clock = clock
        self._actors: list[Any] = []
        self._load: dict[int, int] = {}            # id(actor) -> checks in flight
        self._refs: dict[Any, tuple[Any, int]] = {}  # ref -> (actor, checks)
        self.history: list[tuple[float, int, int]] = []  # (t s, backlog, actors) per poll
        self._t0 = clock()
        self._unplaced: dict[int, tuple[Any, float]] = {}  # id(actor) -> (ready ref, added at)
        self.failure = ""  # why a LeanVerifier could not start (its constructor's error)
        # seconds from an actor's creation (the demand) to its `ready` answer (placed on a
        # node, the autoscaler's launch included, and constructed), for each actor that came
        # up since the last `take_start_waits`
        self._start_waits: list[float] = []
        # removed actors closing their REPLs: (actor, close ref, kill by this clock s)
        self._retiring: list[tuple[Any, Any, float]] = []
        for _ in range(scaler.min_actors):
            self._add()

    @classmethod
    def from_config(cls, cfg: Any) -> LeanFleet:
        """Build from a `compassplay.config.LeanSection`."""
        kwargs = dict(command=list(cfg.command), cwd=cfg.project_dir or None,
                      processes=cfg.processes, timeout_s=cfg.timeout_s,
                      header_timeout_s=cfg.header_timeout_s, memory_mb=cfg.memory_mb,
                      rss_limit_mb=cfg.rss_limit_mb, recycle_rss_mb=cfg.recycle_rss_mb,
                      max_uses=cfg.max_uses, max_reply_bytes=cfg.max_reply_bytes)
        return cls(kwargs, LeanScaler.from_config(cfg.scaling), cfg.actor.num_cpus,
                   dict(cfg.actor.resources))

    # ------------------------------------------------------------------ work
    def submit(self, requests: Sequence[LeanCheck | str]) -> Any:
        """Send one batch to the least-loaded actor (validated here, so bad input raises in the
        driver); returns the ObjectRef of its verdicts."""
        checks = [as_check(r) for r in requests]
        self.poll(extra=len(checks))
        if not self._actors:
            self._add()
        # placed actors first: one that waits for resources would hold the batch back
        placed = [a for a in self._actors if id(a) not in self._unplaced] or self._actors
        actor = min(placed, key=lambda a: self._load[id(a)])
        ref = actor.check_many.remote(checks)
        self._refs[ref] = (actor, len(checks))
        self._load[id(actor)] += len(checks)
        return ref

    def backlog(self) -> int:
        return sum(n for _, n in self._refs.values())

    def size(self) -> int:
        return len(self._actors)

    def poll(self, extra: int = 0) -> int:
        """Reap finished batches, then resize to the scaler's target for backlog + `extra`;
        returns the actor count."""
        self._reap_retiring()
        if self._refs:
            done, _ = ray.wait(list(self._refs), num_returns=len(self._refs), timeout=0)
            for ref in done:
                actor, n = self._refs.pop(ref)
                if id(actor) in self._load:
                    self._load[id(actor)] -= n
        self._check_placed()
        backlog = self.backlog() + extra
        target = self.scaler.decide(backlog, len(self._actors), self._clock())
        while len(self._actors) < target:
            self._add()
        idle = [a for a in self._actors if self._load[id(a)] == 0]
        for actor in idle[:max(0, len(self._actors) - target)]:
            self._remove(actor)
        self.history.append((round(self._clock() - self._t0, 2), backlog, len(self._actors)))
        return len(self._actors)

    def placed(self) -> int:
        """Actors placed and started (the others wait for resources)."""
        self._check_placed()
        return len(self._actors) - len(self._unplaced)

    def unplaced_ages(self) -> list[float]:
        """Seconds each actor not yet placed and started has waited (oldest first)."""
        self._check_placed()
        now = self._clock()
        return sorted((now - t for _, t in self._unplaced.values()), reverse=True)

    def actor_request(self) -> dict[str, float]:
        """What one LeanVerifier asks the cluster for."""
        return {"CPU": self._options["num_cpus"], **self._options["resources"]}

    def drop_unplaced(self, loaded_older_than: float | None = None) -> int:
        """Kill the actors not placed yet (their queued batches fail); with
        `loaded_older_than` only those holding checks and waiting longer; returns how many."""
        self._check_placed()
        now = self._clock()
        gone = [a for a in self._actors if id(a) in self._unplaced and (
            loaded_older_than is None or (self._load[id(a)] > 0 and
                                          now - self._unplaced[id(a)][1] > loaded_older_than))]
        for actor in gone:
            self._remove(actor)
        for ref in [r for r, (a, _) in self._refs.items() if any(a is g for g in gone)]:
            self._refs.pop(ref)
        return len(gone)

    def _check_placed(self) -> None:
        if not self._unplaced:
            return
        refs = {ref: key for key, (ref, _) in self._unplaced.items()}
        done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        now = self._clock()
        for ref in done:
            _, added = self._unplaced.pop(refs[ref])
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 -- reported by failure, once
                self.failure = self.failure or describe_cause(exc)
            else:
                self._start_waits.append(round(now - added, 3))

    def take_start_waits(self) -> list[float]:
        """Seconds from demand to a started actor, for the actors started since the last call
        (polled actors only: a start is seen at the poll after it)."""
        self._check_placed()
        out, self._start_waits = self._start_waits, []
        return out

    def stats(self) -> list[dict[str, Any]]:
        """Each actor's pool stats (blocks until every actor answers)."""
        return ray.get([a.stats.remote() for a in self._actors])

    # ------------------------------------------------------------------ actors
    def _add(self) -> None:
        actor = LeanVerifier.options(**self._options).remote(**self.pool_kwargs)
        self._actors.append(actor)
        self._load[id(actor)] = 0
        self._unplaced[id(actor)] = (actor.ready.remote(), self._clock())

    def retiring(self) -> int:
        """Removed actors still closing their REPLs (killed by a later poll)."""
        return len(self._retiring)

    def _remove(self, actor: Any) -> None:
        self._actors.remove(actor)
        self._load.pop(id(actor), None)
        if self._unplaced.pop(id(actor), None) is None:
            # stop its REPL process groups before the actor process goes (`_reap_retiring`)
            self._retiring.append((actor, actor.close.remote(), self._clock() + CLOSE_WAIT_S))
        else:
            ray.kill(actor)

    def _reap_retiring(self, wait_s: float = 0.0) -> None:
        """Kill the removed actors whose close finished (or failed, or is past its time),
        waiting up to `wait_s` for the others first."""
        if not self._retiring:
            return
        refs = [ref for _, ref, _ in self._retiring]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        finished, now, keep = set(done), self._clock(), []
        for actor, ref, kill_by in self._retiring:
            if ref in finished or now >= kill_by or wait_s > 0:
                ray.kill(actor)
            else:
                keep.append((actor, ref, kill_by))
        self._retiring = keep

    def close(self) -> None:
        """Close and kill every actor (in-flight batches fail; REPL shutdowns get up to
        `CLOSE_WAIT_S` in all)."""
        self._check_placed()
        for actor in list(self._actors):
            self._remove(actor)
        self._refs.clear()
        self._reap_retiring(wait_s=CLOSE_WAIT_S)
