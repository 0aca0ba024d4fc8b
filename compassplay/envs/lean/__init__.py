"""Lean theorem proving on a target set (see `environment`)."""

from compassplay.envs.lean.environment import LeanEnvironment

__all__ = ["LeanEnvironment"]
