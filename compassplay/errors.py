"""Errors a user can cause (bad model dir, missing resources, an actor that cannot start).

The CLI prints a `RunError` as one line, `error: <message>`, and exits with code 1: no
traceback for something the user can fix. Everything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class RunError(RuntimeError):
    """A run cannot go on; the message names the part (role, file, field) and the cause."""


class ActorStartError(RunError):
    """An actor died in its constructor or could not be placed in time."""

    def __init__(self, role: str, cause: str) -> None:
        super().__init__(f"the {role} actor failed to start: {cause}")
        self.role, self.cause = role, cause


class RunInterrupted(RunError):
    """The user pressed Ctrl-C; the message says how to resume."""
