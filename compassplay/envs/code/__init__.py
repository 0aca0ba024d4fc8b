"""AZR-style coding self-play tasks: deduction, abduction, induction (see `environment`)."""

from compassplay.envs.code.code_buffer import TaskBuffer
from compassplay.envs.code.code_env import CodeEnvironment
from compassplay.envs.code.runner import CodeRunner, ExecResultLike

__all__ = ["CodeEnvironment", "CodeRunner", "ExecResultLike", "TaskBuffer"]
