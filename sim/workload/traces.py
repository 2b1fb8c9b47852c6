"""Readers for request traces: Azure LLM 2023 CSV, Mooncake JSONL, generic CSV/Parquet, length stats.

Every reader returns a :class:`Trace` with arrival times in seconds from the
first request (``None`` for length-only files), token counts as int64 arrays,
and, for Mooncake, the 512-token prefix block hashes. Files are validated:
missing columns and negative or zero token counts are :class:`ConfigError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from sim.errors import ConfigError

#: Required columns per format: (arrival, prompt, output); arrival None = lengths only.
FORMATS: dict[str, tuple[str | None, str, str]] = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "mooncake": ("timestamp", "input_length", "output_length"),
    "csv": ("arrival_s", "prompt_tokens", "output_tokens"),
    "parquet": ("arrival_s", "prompt_tokens", "output_tokens"),
    "length_stats": (None, "num_prefill_tokens", "num_decode_tokens"),
}


@dataclass(frozen=True)
class Trace:
    arrival_s: np.ndarray | None
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: tuple[tuple[int, ...], ...] | None = None
    source: str = ""

    def __len__(self) -> int:
        return len(self.prompt_tokens)


def detect_format(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".jsonl"):
        return "mooncake"
    if name.endswith(".parquet"):
        return "parquet"
    with path.open() as f:
        header = f.readline()
    if "ContextTokens" in header:
        return "azure"
    if "num_prefill_tokens" in header:
        return "length_stats"
    return "csv"


def _table(path: Path, fmt: str, key: str) -> pa.Table:
    try:
        if fmt == "mooncake":
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            if not rows:
                raise ConfigError(key, str(path), "a non-empty JSONL trace")
            cols = {c: [r.get(c) for r in rows] for c in rows[0]}
            return pa.table(cols)
        if fmt == "parquet":
            return pq.read_table(path)
        return pacsv.read_csv(path)
    except ConfigError:
        raise
    except (pa.ArrowInvalid, json.JSONDecodeError, OSError, UnicodeDecodeError) as exc:
        raise ConfigError(key, str(path), f"a readable {fmt} trace ({str(exc).splitlines()[0][:120]})") from None


def _float64(col: pa.ChunkedArray, safe: bool = True) -> np.ndarray:
    """A null-free numeric column as float64, read from its Arrow buffer: pyarrow's ``to_numpy``
    imports pandas (~0.4 s, a fifth of a 10,000-request run)."""
    arr = pc.cast(col, pa.float64(), safe=safe).combine_chunks()
    return np.frombuffer(arr.buffers()[1], dtype=np.float64, count=len(arr), offset=arr.offset * 8).copy()


def _tokens(table: pa.Table, col: str, path: Path, key: str) -> np.ndarray:
    arr = table[col]
    if arr.null_count:
        raise ConfigError(key, str(path), f"column {col!r} has {arr.null_count} empty values; token counts must all be present")
    try:
        a = _float64(arr)
    except (TypeError, ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise ConfigError(key, str(path), f"column {col!r} must hold integer token counts") from None
    bad = np.flatnonzero(~(a >= 1) | (a != np.floor(a)))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(key, str(path), f"column {col!r} row {i} is {a[i]:g}; token counts must be integers >= 1")
    return a.astype(np.int64)


@lru_cache(maxsize=16)
def _read_cached(path: str, fmt: str, mtime: float, key: str) -> Trace:
    p = Path(path)
    arr_col, p_col, o_col = FORMATS[fmt]
    table = _table(p, fmt, key)
    needed = [c for c in (arr_col, p_col, o_col) if c]
    missing = [c for c in needed if c not in table.column_names]
    if missing:
        raise ConfigError(key, str(p), f"{fmt} trace needs columns {needed}; missing {missing} (found {table.column_names})")
    if table.num_rows == 0:
        raise ConfigError(key, str(p), "a trace with at least one row")
    prompt = _tokens(table, p_col, p, key)
    output = _tokens(table, o_col, p, key)
    arrival = None
    if arr_col:
        col = table[arr_col]
        if col.null_count:
            raise ConfigError(key, str(p), f"column {arr_col!r} has {col.null_count} empty values")
        if pa.types.is_timestamp(col.type):
            t = _float64(col.cast(pa.int64()), safe=False) / 1e9  # ns beyond 2**53: rounded, as astype did
        else:
            try:
                t = _float64(col)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise ConfigError(key, str(p), f"column {arr_col!r} must hold numeric times") from None
            if fmt == "mooncake":
                t = t / 1000.0
        if np.isnan(t).any() or (t < 0).any():
            raise ConfigError(key, str(p), f"column {arr_col!r} must hold non-negative times")
        order = np.argsort(t, kind="stable")
        t = t[order] - t[order][0]
        prompt, output = prompt[order], output[order]
        arrival = t
    hashes = None
    if fmt == "mooncake" and "hash_ids" in table.column_names:
        hashes = tuple(tuple(h or ()) for h in table["hash_ids"].to_pylist())
    return Trace(arrival, prompt, output, hashes, source=p.name)


def read_trace(path: Path, fmt: str = "auto", key: str = "workload.arrival.path") -> Trace:
    """Read and validate a trace file (cached on path and modification time)."""
    if not path.is_file():
        raise ConfigError(key, str(path), "an existing trace file")
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt not in FORMATS:
        raise ConfigError(key, fmt, f"allowed formats: {', '.join(FORMATS)}")
    return _read_cached(str(path.resolve()), fmt, path.stat().st_mtime, key)
