"""Errors a user can act on.

A :class:`ConfigError` names the offending key, the value given and what is
allowed; the CLI prints it on one line and exits with status 2. The value is
quoted with a bounded ``repr`` (:func:`quote`): a value built from YAML aliases
(a "billion laughs") or a huge number is never expanded into the message.
"""

from __future__ import annotations

import reprlib

from sim.limits import MAX_QUOTED_CHARS


class _BoundedRepr(reprlib.Repr):
    """``reprlib`` walks at most a few items per level and a few levels, whatever the value."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxlist = self.maxtuple = self.maxset = self.maxdict = 6
        self.maxstring = self.maxother = 300
        self.maxlong = 40

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:  # repr of a 10**5000 is itself an error (int_max_str_digits)
            return f"<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_REPR = _BoundedRepr()


def quote(value: object) -> str:
    """A one-line ``repr`` of ``value`` of at most :data:`~sim.limits.MAX_QUOTED_CHARS` characters."""
    try:
        text = _REPR.repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails is still named
        text = f"<{type(value).__name__}>"
    text = text.replace("\n", " ")
    return text if len(text) <= MAX_QUOTED_CHARS else text[: MAX_QUOTED_CHARS - 1] + "…"


def _one_line(text: str, limit: int = 1000) -> str:
    text = " ".join(str(text).split("\n"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ConfigError(ValueError):
    """Invalid user input (scenario key, override, trace file, profile, output path)."""

    def __init__(self, key: str, value: object, allowed: str):
        self.key = key
        self.value = value
        self.allowed = allowed
        super().__init__(f"{_one_line(key, 300)}: got {quote(value)}; {_one_line(allowed)}")
