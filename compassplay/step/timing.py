"""Wall-clock and device time of one stage call, and the cost fields of a step.

Every stage message carries a `Timing`, filled by `timed()` around the stage's work in the
worker: Unix start/end, the worker process's CPU seconds (`time.process_time()`, all its
threads; subprocesses such as sandbox workers are not counted), and device seconds: wall
seconds x GPUs where the worker runs on GPUs, else its CPU seconds. `step_cost` turns the
timings of a step into the StepStats cost fields (per role, per step, cumulative).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Timing:
    """When a stage ran (Unix seconds) and what it cost (seconds of CPU / device time)."""

    start: float = 0.0
    end: float = 0.0
    cpu_seconds: float = 0.0
    device_seconds: float = 0.0
    gpus: float = 0.0

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)

    @staticmethod
    def merge(parts: list[Timing]) -> Timing:
        """Parts run at once on several workers: their span, their summed costs."""
        if not parts:
            return Timing()
        return Timing(min(p.start for p in parts), max(p.end for p in parts),
                      sum(p.cpu_seconds for p in parts), sum(p.device_seconds for p in parts),
                      max(p.gpus for p in parts))


@contextmanager
def timed(gpus: float = 0.0) -> Iterator[Timing]:
    """`with timed(gpus) as t: ...` fills `t` when the block ends (also on error)."""
    t = Timing(start=time.time(), gpus=gpus)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    try:
        yield t
    finally:
        wall = time.perf_counter() - wall0
        t.end = t.start + wall
        t.cpu_seconds = time.process_time() - cpu0
        t.device_seconds = wall * gpus if gpus else t.cpu_seconds


def step_cost(timings: dict[str, Timing], role_of: dict[str, str],
              cumulative_before: float) -> dict:
    """The StepStats timing and cost fields of one step from its stage timings
    (`role_of[stage]`: the role that ran it; `cumulative_before`: device seconds so far)."""
    roles: dict[str, float] = {}
    kinds: dict[str, str] = {}
    for name, t in timings.items():
        role = role_of[name]
        roles[role] = roles.get(role, 0.0) + t.device_seconds
        if t.gpus or kinds.get(role) != "gpu":
            kinds[role] = "gpu" if t.gpus else "cpu"
    total = sum(roles.values())
    return {
        "stage_seconds": {k: t.seconds for k, t in timings.items()},
        "step_seconds": sum(t.seconds for t in timings.values()),
        "stage_start": {k: t.start for k, t in timings.items()},
        "stage_end": {k: t.end for k, t in timings.items()},
        "step_start": min((t.start for t in timings.values()), default=0.0),
        "step_end": max((t.end for t in timings.values()), default=0.0),
        "device_seconds": roles,
        "device_kind": kinds,
        "step_device_seconds": total,
        "cumulative_device_seconds": cumulative_before + total,
    }
