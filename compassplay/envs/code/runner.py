"""The execution interface the coding tasks need: anything with `run_many` works.

`compassplay.verifiers.sandbox.pool.PythonSandbox` is the production runner; tests may use a
plain subprocess runner with the same shape.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


class ExecResultLike(Protocol):
    """What one execution reports. `status` is one of ok, error, timeout, memory,
    output_limit, killed."""

    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    duration_s: float


@runtime_checkable
class CodeRunner(Protocol):
    """Runs Python programs (each a full source text) and returns results in input order."""

    def run_many(self, codes: list[str]) -> list[ExecResultLike]: ...
