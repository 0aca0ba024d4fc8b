"""The base of every config section and the error a bad config raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file and the dotted field."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
