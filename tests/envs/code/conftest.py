"""Fixtures for the coding-task tests: a code runner and the optional shared data folder.

The runner is the real `PythonSandbox` (session-scoped). Only when the sandbox reports that it
is unavailable (`SandboxUnavailableError`, e.g. no bubblewrap) do the tests fall back to a
plain subprocess runner with the same `run_many` interface; the fallback is announced in the
test report header.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from compassplay.config import TaskSection

DATA_DIR = Path(os.environ.get("COMPASSPLAY_DATA_DIR")
                or Path(__file__).resolve().parents[4] / "shared" / "data")
FALLBACK_NOTE: list[str] = []


@dataclass
class SubprocessResult:
    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    duration_s: float


class SubprocessRunner:
    """Test-only runner: one fresh `python -I -c` per program (no isolation)."""

    def __init__(self, timeout_s: float = 5.0, workers: int = 2) -> None:
        self.timeout_s = timeout_s
        self.workers = workers
        self.max_output_bytes = 65536

    def run(self, code: str) -> SubprocessResult:
        t0 = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True,
                               text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            return SubprocessResult("timeout", "", "", None, time.perf_counter() - t0)
        status = "ok" if p.returncode == 0 else "error"
        if len(p.stdout.encode()) + len(p.stderr.encode()) > self.max_output_bytes:
            status = "output_limit"
        return SubprocessResult(status, p.stdout, p.stderr, p.returncode,
                                time.perf_counter() - t0)

    def run_many(self, codes: list[str]) -> list[SubprocessResult]:
        with ThreadPoolExecutor(self.workers) as ex:
            return list(ex.map(self.run, codes))


def make_runner(timeout_s: float):
    """The real sandbox, or the subprocess runner when the sandbox is unavailable."""
    try:
        from compassplay.verifiers.sandbox.pool import PythonSandbox, SandboxUnavailableError
    except ImportError as e:  # sandbox module not there
        FALLBACK_NOTE.append(f"python_sandbox not importable ({e}); using subprocess runner")
        return SubprocessRunner(timeout_s), None
    sb = PythonSandbox(workers=2, timeout_s=timeout_s, memory_mb=512, max_output_bytes=65536)
    try:
        sb.start()
    except SandboxUnavailableError as e:
        FALLBACK_NOTE.append(f"sandbox unavailable ({e}); using subprocess runner")
        return SubprocessRunner(timeout_s), None
    return sb, sb


def pytest_report_header(config):
    return "tasks: code runner = " + ("; ".join(FALLBACK_NOTE) or "PythonSandbox")


@pytest.fixture(scope="session")
def runner():
    r, sb = make_runner(5.0)
    yield r
    if sb is not None:
        sb.close()


@pytest.fixture(scope="session")
def quick_runner():
    """A runner with a 1 s timeout, for the timeout tests."""
    r, sb = make_runner(1.0)
    yield r
    if sb is not None:
        sb.close()


@pytest.fixture
def cfg() -> TaskSection:
    return TaskSection(types=["deduction", "abduction", "induction"])


@pytest.fixture
def env(cfg, runner):
    from compassplay.envs.code import CodeEnvironment
    return CodeEnvironment(cfg, runner, seed=0)


def shared_file(name: str) -> Path:
    """A file of the shared data folder; skips the test when it is absent."""
    p = DATA_DIR / name
    if not p.exists():
        pytest.skip(f"{p} not present")
    return p


@pytest.fixture
def shared():
    """`shared(name)` -> path of a shared data file (skips the test when absent)."""
    return shared_file
