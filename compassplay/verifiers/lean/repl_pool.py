"""A pool of Lean REPL processes with cached header environments (as the Kimina Lean server).

    with LeanPool(["lake", "env", "repl"], cwd=MATHLIB_PROJECT, processes=4) as pool:
        verdicts = pool.check_many([LeanCheck("theorem t : 1 + 1 = 2 := by decide")])
        pool.stats()   # {"counts": {...}, "restarts": 0, "backlog": 0, ...}

Each process runs a header (e.g. `import Mathlib`) once and checks every later proof as
{"cmd": proof, "env": header_env}; a check goes to an idle process that already has its header.
Per check: a wall-clock timeout, an RSS ceiling and RLIMIT_AS for the process; a process that
fails is killed (whole group) and restarted on its next use; a process is recycled after
`max_uses` checks or above `recycle_rss_mb`. Every failure is a verdict status ("timeout",
"crash", "memory", "protocol", "header_error"), never an exception; bad requests raise
TypeError/ValueError before anything runs.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from compassplay.verifiers.lean.repl import LeanRepl, LeanReplError
from compassplay.verifiers.lean.responses import (
    STATUSES,
    LeanVerdict,
    check_statement_preserved,
    declaration_header,
    lean_verdict,
)

DEFAULT_HEADER = "import Mathlib"


class LeanUnavailableError(RuntimeError):
    """The REPL command cannot be started at all (wrong command, missing project)."""


@dataclass(frozen=True)
class LeanCheck:
    """One check: `code` (Lean commands, e.g. a theorem with its proof) run in the environment
    `header` creates; `target`, when set, is a statement `code` must prove unchanged;
    `timeout_s` overrides the pool's per-check wall-clock limit (s)."""

    code: str
    header: str = DEFAULT_HEADER
    target: str | None = None
    timeout_s: float | None = None

    def validate(self) -> None:
        if not isinstance(self.code, str) or not self.code.strip():
            raise ValueError("LeanCheck.code must be a non-empty str")
        if not isinstance(self.header, str):
            raise TypeError("LeanCheck.header must be a str")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"LeanCheck.timeout_s must be > 0, got {self.timeout_s}")
        if self.target is not None:
            declaration_header(self.target if ":=" in self.target else self.target + " :=")


@dataclass
class _Slot:
    index: int
    repl: LeanRepl | None = None
    envs: dict[str, int] = field(default_factory=dict)
    uses: int = 0
    failed: bool = False


class LeanPool:
    """Thread-safe pool of `processes` REPLs; use as a context manager or call close()."""

    def __init__(self, command: Sequence[str], cwd: str | None = None, processes: int = 2,
                 timeout_s: float = 60.0, header_timeout_s: float = 600.0, memory_mb: int = 0,
                 rss_limit_mb: int = 0, recycle_rss_mb: int = 0, max_uses: int = 0,
                 max_reply_bytes: int = 8 << 20, env: Mapping[str, str] | None = None) -> None:
        """Times in seconds, memory in MiB (0 = no limit); `max_uses` 0 = never recycle."""
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        if min(timeout_s, header_timeout_s) <= 0:
            raise ValueError("timeout_s and header_timeout_s must be > 0")
        if min(memory_mb, rss_limit_mb, recycle_rss_mb, max_uses) < 0:
            raise ValueError("memory_mb, rss_limit_mb, recycle_rss_mb and max_uses must be >= 0")
        self._repl_args: dict[str, Any] = dict(
            command=list(command), cwd=cwd, timeout_s=timeout_s, memory_mb=memory_mb,
            rss_limit_mb=rss_limit_mb, max_reply_bytes=max_reply_bytes, env=env)
        self.processes = processes
        self.timeout_s = float(timeout_s)
        self.header_timeout_s = float(header_timeout_s)
        self.recycle_rss_bytes = int(recycle_rss_mb) << 20
        self.max_uses = int(max_uses)
        self._slots = [_Slot(i) for i in range(processes)]
        self._idle = list(range(processes))
        self._cv = threading.Condition()
        self._executor: ThreadPoolExecutor | None = None
        self._counts: Counter[str] = Counter({s: 0 for s in STATUSES})
        self._restarts = self._recycles = self._backlog = self._in_flight = self._total = 0
        self._latency_sum = self._latency_max = 0.0

    @classmethod
    def from_config(cls, cfg: Any) -> LeanPool:
        """Build from a `compassplay.config.LeanSection`."""
        return cls(command=cfg.command, cwd=cfg.project_dir or None, processes=cfg.processes,
                   timeout_s=cfg.timeout_s, header_timeout_s=cfg.header_timeout_s,
                   memory_mb=cfg.memory_mb, rss_limit_mb=cfg.rss_limit_mb,
                   recycle_rss_mb=cfg.recycle_rss_mb, max_uses=cfg.max_uses,
                   max_reply_bytes=cfg.max_reply_bytes)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> LeanPool:
        """Start every process; raises LeanUnavailableError if the command cannot run."""
        if self._executor is not None:
            return self
        for slot in self._slots:
            try:
                slot.repl = LeanRepl(**self._repl_args)
            except (OSError, TypeError, ValueError) as exc:
                self.close()
                raise LeanUnavailableError(f"cannot start Lean REPL "
                                           f"{self._repl_args['command']}: {exc}") from exc
        self._executor = ThreadPoolExecutor(self.processes, thread_name_prefix="lean-check")
        return self

    def close(self) -> None:
        """Stop all processes; idempotent."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        for slot in self._slots:
            if slot.repl is not None:
                slot.repl.close()
                slot.repl = None

    def __enter__(self) -> LeanPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pids(self) -> list[int]:
        """Pids (= process group ids) of the live REPLs, for tests and diagnostics."""
        return [s.repl.pid for s in self._slots if s.repl is not None and s.repl.alive()]

    # ------------------------------------------------------------------ checking
    def check_many(self, requests: Sequence[LeanCheck | str]) -> list[LeanVerdict]:
        """Check all requests concurrently across processes; verdicts in input order."""
        if self._executor is None:
            raise RuntimeError("LeanPool is not started (use `with` or .start())")
        checks = [as_check(r) for r in requests]
        with self._cv:
            self._backlog += len(checks)
        return list(self._executor.map(self._check_counted, checks))

    def check(self, request: LeanCheck | str) -> LeanVerdict:
        return self.check_many([request])[0]

    def _check_counted(self, req: LeanCheck) -> LeanVerdict:
        start = time.monotonic()
        slot = self._acquire(req.header)
        try:
            verdict = self._check_on(slot, req)
        except Exception as exc:  # never let a check escape as an exception
            self._discard(slot)
            verdict = LeanVerdict.failure("crash", f"{type(exc).__name__}: {exc}")
        finally:
            self._release(slot)
        took = time.monotonic() - start
        with self._cv:
            self._backlog -= 1
            self._total += 1
            self._counts[verdict.status] += 1
            self._latency_sum += took
            self._latency_max = max(self._latency_max, took)
        return verdict

    def _check_on(self, slot: _Slot, req: LeanCheck) -> LeanVerdict:
        if req.target is not None and not check_statement_preserved(req.target, req.code):
            return LeanVerdict.failure("statement_changed",
                                       "the proof does not state the target theorem unchanged")
        try:
            repl = self._ensure(slot)
            env = slot.envs.get(req.header)
            if env is None:
                head = repl.send({"cmd": req.header}, self.header_timeout_s)
                hv = lean_verdict(head)
                if hv.status not in ("accepted", "sorry") or not isinstance(head.get("env"), int):
                    return LeanVerdict(False, "header_error", hv.errors or [str(head)[:500]])
                env = slot.envs[req.header] = head["env"]
            resp = repl.send({"cmd": req.code, "env": env}, req.timeout_s or self.timeout_s)
        except LeanReplError as exc:
            self._discard(slot)
            return LeanVerdict.failure(exc.status, str(exc))
        verdict = lean_verdict(resp)
        if verdict.status == "repl_error" and "environment" in " ".join(verdict.errors).lower():
            slot.envs.pop(req.header, None)  # stale env id: rebuild the header next time
        slot.uses += 1
        self._maybe_recycle(slot)
        return verdict

    # ------------------------------------------------------------------ processes
    def _acquire(self, header: str) -> _Slot:
        """An idle slot, preferring one whose process already has `header`'s environment."""
        with self._cv:
            while not self._idle:
                self._cv.wait()
            best = next((i for i in self._idle if header in self._slots[i].envs), None)
            if best is None:
                best = next((i for i in self._idle if not self._slots[i].envs), self._idle[0])
            self._idle.remove(best)
            self._in_flight += 1
            return self._slots[best]

    def _release(self, slot: _Slot) -> None:
        with self._cv:
            self._idle.append(slot.index)
            self._in_flight -= 1
            self._cv.notify()

    def _ensure(self, slot: _Slot) -> LeanRepl:
        if slot.repl is None or not slot.repl.alive():
            if slot.repl is not None:
                slot.repl.kill()
            slot.envs.clear()
            slot.uses = 0
            slot.repl = LeanRepl(**self._repl_args)
            if slot.failed:
                with self._cv:
                    self._restarts += 1
            slot.failed = False
        return slot.repl

    def _discard(self, slot: _Slot) -> None:
        if slot.repl is not None:
            slot.repl.kill()
        slot.repl, slot.failed = None, True
        slot.envs.clear()

    def _maybe_recycle(self, slot: _Slot) -> None:
        repl = slot.repl
        if repl is None:
            return
        worn = self.max_uses and slot.uses >= self.max_uses
        fat = self.recycle_rss_bytes and repl.rss_bytes() > self.recycle_rss_bytes
        if worn or fat:
            repl.close()
            slot.repl = None
            slot.envs.clear()
            with self._cv:
                self._recycles += 1

    # ------------------------------------------------------------------ stats
    def stats(self) -> dict[str, Any]:
        """Counts by status, restarts (after failures), recycles, backlog (submitted, not yet
        finished), in-flight checks, live processes, latency (s)."""
        with self._cv:
            return {
                "counts": dict(self._counts), "checks_total": self._total,
                "restarts": self._restarts, "recycles": self._recycles,
                "backlog": self._backlog, "in_flight": self._in_flight,
                "processes": self.processes,
                "live_processes": sum(1 for s in self._slots
                                      if s.repl is not None and s.repl.alive()),
                "latency_s": {"mean": self._latency_sum / self._total if self._total else 0.0,
                              "max": self._latency_max},
            }


def as_check(req: LeanCheck | str) -> LeanCheck:
    """A validated LeanCheck (a bare str is a proof under the default header)."""
    if isinstance(req, str):
        req = LeanCheck(req)
    if not isinstance(req, LeanCheck):
        raise TypeError(f"a request is a LeanCheck or a str, got {type(req).__name__}")
    req.validate()
    return req


__all__ = ["DEFAULT_HEADER", "LeanCheck", "LeanPool", "LeanUnavailableError", "as_check"]
