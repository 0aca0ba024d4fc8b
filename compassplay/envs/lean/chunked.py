"""Many Lean checks through the verifier pool in chunks, with a progress line after each.

An SGS iteration sends every unsolved target's attempts at once (3323 targets x 8 attempts at
paper scale): `check_in_chunks` splits them into `task.lean.check_chunk` checks per
`check_many` call, so progress shows while they run, and a fleet that resubmits after losing an
actor (`actors.lean.fleet_actor`) redoes one chunk, not the iteration.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from compassplay.verifiers.lean.repl_pool import LeanCheck
from compassplay.verifiers.lean.responses import LeanVerdict

log = logging.getLogger(__name__)


class Checker(Protocol):
    """LeanPool's interface (also FleetLeanPool's)."""

    def check_many(self, requests: Sequence[LeanCheck]) -> list[LeanVerdict]: ...


def check_in_chunks(pool: Checker, checks: list[LeanCheck], chunk: int,
                    what: str) -> list[LeanVerdict]:
    """Verdicts of `checks` in order, at most `chunk` per call. With more than one chunk, an
    INFO line after each: checks done / total, verdict statuses so far, elapsed seconds."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    out: list[LeanVerdict] = []
    start = time.monotonic()
    for lo in range(0, len(checks), chunk):
        out += pool.check_many(checks[lo:lo + chunk])
        if len(checks) > chunk:
            counts = ", ".join(f"{k} {n}" for k, n in Counter(v.status for v in out)
                               .most_common())
            log.info("Lean %s: %d/%d checks (%s) in %.0f s", what, len(out), len(checks),
                     counts, time.monotonic() - start)
    return out
