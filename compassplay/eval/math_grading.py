"""Math answers graded with math-verify in worker processes, with a host-side timeout.

math-verify bounds its own parse/verify time with SIGALRM, which only works in a process's
main thread: called from a Ray worker thread or any other thread it raises. Here each check
runs in a pre-started worker process (a plain subprocess, not a fork of a threaded host), in its
main thread where math-verify's alarms work; the host waits at most `timeout_s` for a reply
and otherwise kills and restarts that worker and counts the answer wrong. No signals are used
in the calling process, so `MathGrader` is safe from any thread (it is thread safe) and inside
Ray actors.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from compassplay.errors import require_extra
from compassplay.eval.eval_records import EvalItem, Grade

WORKER_MODULE = "compassplay.eval.math_worker"


def _worker_env() -> dict[str, str]:
    """The host environment with this package's root first on PYTHONPATH."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get(
        "PYTHONPATH") else []))
    return env


class _Worker:
    """One `python -m <module>` (default `compassplay.eval.math_worker`) process speaking JSON lines on stdio
    (a plain subprocess: no multiprocessing re-import of the caller's main module, which
    breaks in scripts without a main guard and in Ray workers)."""

    def __init__(self, module: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1,
            env=_worker_env())
        self._replies: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="math-grade-reader").start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                self._replies.put(line)
        except (OSError, ValueError):  # the pipe went away with a killed worker
            pass
        self._replies.put(None)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ask(self, prediction: str, golds: list[str], timeout_s: float) -> list | None:
        """The worker's reply [ok, extracted, error], or None when it did not answer in time
        (it is then killed)."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps([prediction, golds]) + "\n")
            self.proc.stdin.flush()
            line = self._replies.get(timeout=timeout_s)
            if line is not None:
                return json.loads(line)
        except (OSError, queue.Empty, ValueError):
            pass
        self.kill()
        return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        try:  # stdout is left to the reader thread, which sees EOF and ends
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass


class MathGrader:
    """`grade(items, predictions) -> list[Grade]`; `timeout_s` bounds one check (the first
    check of a fresh worker also pays for importing sympy: `startup_s` is added to it);
    `module` is the worker's module (tests swap in a stub)."""

    def __init__(self, workers: int = 2, timeout_s: float = 10.0, startup_s: float = 30.0,
                 module: str = WORKER_MODULE) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.workers = workers
        self.timeout_s = timeout_s
        self.startup_s = startup_s
        self.module = module
        self._idle: queue.Queue[tuple[_Worker, bool]] = queue.Queue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._spawn_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.timeouts = 0

    def start(self) -> MathGrader:
        """Start the worker processes; MissingExtraError when math-verify is not installed."""
        if self.module == WORKER_MODULE:
            require_extra("grading math benchmarks", "eval", {"math_verify": "math-verify"})
        with self._lock:
            if self._pool is None:
                for _ in range(self.workers):
                    self._idle.put((self._spawn(), True))
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="math-grade")
        return self

    def _spawn(self) -> _Worker:
        w = _Worker(self.module)
        with self._spawn_lock:
            self._all = [x for x in self._all if x.alive()] + [w]
        return w

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            for w in self._all:
                w.kill()
            self._all.clear()
            while not self._idle.empty():
                self._idle.get_nowait()

    def __enter__(self) -> MathGrader:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check(self, prediction: str, golds: list[str]) -> Grade:
        """Grade one answer (blocks for a free worker)."""
        worker, fresh = self._idle.get()
        answered = False
        try:
            reply = worker.ask(prediction, golds,
                               self.timeout_s + (self.startup_s if fresh else 0.0))
            answered = True
        finally:
            if not answered:  # interrupted mid-request: its late reply must not be read
                worker.kill()
            alive = worker.alive()
            self._idle.put((worker, False) if alive else (self._spawn(), True))
        if reply is None:
            self.timeouts += 1
            return Grade(correct=False, error=f"timeout after {self.timeout_s:g}s")
        ok, extracted, err = reply
        return Grade(correct=bool(ok), extracted=str(extracted)[:500], error=err)

    def grade(self, items: list[EvalItem], predictions: list[str]) -> list[Grade]:
        if len(items) != len(predictions):
            raise ValueError("items and predictions differ in length")
        self.start()
        assert self._pool is not None
        return list(self._pool.map(lambda ip: self.check(ip[1], list(ip[0].golds())),
                                   zip(items, predictions, strict=True)))
