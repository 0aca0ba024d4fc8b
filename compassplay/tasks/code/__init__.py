"""AZR-style coding self-play tasks: deduction, abduction, induction (see `environment`)."""

from compassplay.tasks.code.buffer import TaskBuffer
from compassplay.tasks.code.environment import CodeEnvironment
from compassplay.tasks.code.runner import CodeRunner, ExecResultLike

__all__ = ["CodeEnvironment", "CodeRunner", "ExecResultLike", "TaskBuffer"]
