"""Weight-version checks shared by every receiver (engines, vLLM workers, channels; no Ray).

A version is the learner's update count (0 = initial weights). Receivers never go back: an
older version is refused with `StaleWeightsError`; an equal one may be re-loaded.
"""

from __future__ import annotations


class StaleWeightsError(ValueError):
    """Weights older than the ones already loaded were offered to an engine."""


def check_version(current: int, offered: int) -> None:
    """Raise `StaleWeightsError` if `offered` < `current` (equal re-loads are allowed)."""
    if offered < current:
        raise StaleWeightsError(
            f"refusing weight version {offered}: engine already holds version {current}")


def check_offered(held: int, announced: int, got: int) -> None:
    """A receiver's check: `got` (what arrived) must be `announced` (None: whatever the
    sender says) and not older than `held`."""
    if got < held:
        raise StaleWeightsError(f"refusing weight version {got}: this receiver already "
                                f"holds version {held}")
    if announced is not None and got != announced:
        raise RuntimeError(f"expected weight version {announced}, the learner sent {got}")
