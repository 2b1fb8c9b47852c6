"""Shared fixtures-free helpers for the calibration tests (cached table loads)."""

from __future__ import annotations

from functools import cache

from calibration.build_builtin import builtin_tables

SYSTEMS = ("h100_sxm", "h200_sxm", "a100_sxm", "b200_sxm", "l40s")


@cache
def tables(system: str):
    """The tables the built-in profile of ``system`` is fitted from (TensorRT-LLM; SGLang decode attention but on B200)."""
    return builtin_tables(system)
