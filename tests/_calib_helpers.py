"""Shared fixtures-free helpers for the calibration tests (cached table loads)."""

from __future__ import annotations

from functools import lru_cache

from calibration.tables import DEFAULT_TABLES_DIR, load_kernel_tables

SYSTEMS = ("h100_sxm", "h200_sxm", "a100_sxm")


@lru_cache(maxsize=None)
def tables(system: str):
    return load_kernel_tables(DEFAULT_TABLES_DIR, system, "trtllm")
