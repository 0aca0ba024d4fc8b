"""Lean theorem proving on a target set (see `environment`)."""

from compassplay.envs.lean.lean_env import LeanEnvironment

__all__ = ["LeanEnvironment"]
