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


class FatalStageError(RunError):
    """A stage failed in a way a retry cannot fix: the driver stops the run at once."""


class ResourceWaitError(FatalStageError):
    """Actors asking for a resource (e.g. `lean_repl`) were not placed within the configured
    wait: no node offers it and no autoscaler added one. A step that fails with it is not
    retried (it would wait again)."""


class MissingExtraError(RunError, ImportError):
    """A feature needs packages of an optional extra that is not installed; the message names
    the extra and the command that installs it."""

    def __init__(self, feature: str, extra: str, packages: list[str]) -> None:
        super().__init__(f"{feature} needs the '{extra}' extra ({', '.join(packages)}), which "
                         f"is not installed: pip install 'compassplay[{extra}]' (or `make "
                         "setup`, which installs it)")
        self.feature, self.extra, self.packages = feature, extra, packages


def require_extra(feature: str, extra: str, modules: dict[str, str]) -> None:
    """Raise MissingExtraError unless every module of `modules` (import name -> package name)
    can be imported."""
    import importlib.util

    missing = [pkg for mod, pkg in modules.items() if importlib.util.find_spec(mod) is None]
    if missing:
        raise MissingExtraError(feature, extra, missing)
