"""Errors a user can act on.

A :class:`ConfigError` names the offending key, the value given and what is
allowed; the CLI prints it on one line and exits with status 2.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Invalid user input (scenario key, override, trace file, profile)."""

    def __init__(self, key: str, value: object, allowed: str):
        self.key = key
        self.value = value
        self.allowed = allowed
        super().__init__(f"{key}: got {value!r}; {allowed}")
