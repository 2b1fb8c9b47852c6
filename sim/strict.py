"""Strict scalar types for the scenario schema: what pydantic's lax mode would silently coerce.

Lax validation turns ``rate: true`` into 1 request/s, ``reserve: true`` into one token and
``chunked_prefill: 1`` (or the string ``"yes"``) into ``True``. :func:`strict_scalar` runs before
each field's own validation and refuses those: a boolean where a number is expected, and anything
but ``true``/``false`` where a boolean is. It also reads numbers that YAML 1.1 leaves as strings
(``1e-3``, ``1e6``: PyYAML needs a dot and a signed exponent to see a float) as numbers, so
``period_s: 1e-3`` means what it says; any other string in a number field stays a string and is
refused by the field itself.
"""

from __future__ import annotations

import re
import types
import typing
from functools import cache
from typing import Any, Literal, Union

from pydantic import BaseModel

_NUMBER = re.compile(r"^[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$")


def scalar_kinds(annotation: Any) -> frozenset[type]:
    """The scalar types a field annotation admits (``Literal`` values by their type; models and
    ``None`` left out)."""
    return _kinds(annotation)


@cache
def _kinds(annotation: Any) -> frozenset[type]:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return frozenset().union(*(_kinds(a) for a in typing.get_args(annotation)))
    if origin is Literal:
        return frozenset(type(a) for a in typing.get_args(annotation))
    if annotation is type(None) or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return frozenset()
    if isinstance(annotation, str):  # a forward reference: a model
        return frozenset()
    return frozenset([annotation]) if isinstance(annotation, type) else frozenset()


def strict_scalar(annotation: Any, value: Any) -> Any:
    """``value`` for a field of this annotation, or ``ValueError`` for a coercion lax mode would make."""
    kinds = scalar_kinds(annotation)
    if not kinds:
        return value
    numeric = bool(kinds & {int, float})
    if isinstance(value, bool):
        if bool not in kinds:
            raise ValueError("a number, not true/false" if numeric else "not true/false")
        return value
    if kinds == {bool} and value is not None:
        raise ValueError("true or false")
    if numeric and str not in kinds and isinstance(value, str) and _NUMBER.match(value.strip()):
        number = float(value.replace("_", ""))
        return int(number) if number.is_integer() and "." not in value and abs(number) < 2**53 else number
    return value
