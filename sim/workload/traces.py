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

from sim.errors import ConfigError, quote
from sim.inputs import check_file, decode
from sim.limits import MAX_TIME_S, MAX_TOKENS, MAX_TRACE_BYTES, MAX_TRACE_ROWS

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


def _head(path: Path, key: str, nbytes: int = 65536) -> bytes:
    """The first bytes of a (possibly compressed) trace file."""
    try:
        with pa.input_stream(str(path), compression="detect") as f:
            return f.read(nbytes)
    except (OSError, pa.ArrowException) as exc:
        raise ConfigError(key, str(path), f"a readable trace file ({_reason(exc)})") from None


def _reason(exc: BaseException) -> str:
    return (getattr(exc, "strerror", None) or str(exc).splitlines()[0] if str(exc) else type(exc).__name__)[:160]


def detect_format(path: Path, key: str = "workload.arrival.path") -> str:
    name = path.name.lower()
    if name.endswith(".jsonl"):
        return "mooncake"
    if name.endswith(".parquet"):
        return "parquet"
    head = _head(path, key)
    cut = head.rfind(b"\n")
    header = decode(head[:cut] if cut > 0 and len(head) == 65536 else head, str(path), key, "trace").split("\n", 1)[0]
    if "ContextTokens" in header:
        return "azure"
    if "num_prefill_tokens" in header:
        return "length_stats"
    return "csv"


def _needs(fmt: str, needed: list[str], missing: list[str], found: list[str]) -> str:
    """What a trace of ``fmt`` lacks; for a plain CSV, also the other layouts a CSV is read in (by
    its header: :func:`detect_format`), which a user with an Azure or length-stats file looks for."""
    text = f"{fmt} trace needs columns {needed}; missing {missing} (found {found})"
    if fmt == "csv":
        text += (
            "; a CSV whose header has ContextTokens is read as an Azure trace (TIMESTAMP, ContextTokens, "
            "GeneratedTokens), one with num_prefill_tokens as length statistics (num_prefill_tokens, "
            "num_decode_tokens)"
        )
    return text


class TooManyRows(ConfigError):
    """A trace with more rows than the reader was allowed (``max_rows``); ``limit`` is that cap."""

    def __init__(self, key: str, path: Path, limit: int, what: str):
        self.limit = limit
        self.detail = what
        super().__init__(key, str(path), f"a trace of at most {limit} rows ({what})")


def _too_many_rows(key: str, path: Path, what: str, limit: int) -> ConfigError:
    return TooManyRows(key, path, limit, what)


def _csv_table(path: Path, key: str, max_rows: int) -> pa.Table:
    """A CSV trace, streamed: refused as soon as it passes ``max_rows`` rows or MAX_TRACE_BYTES
    (a compressed file can expand a thousandfold)."""
    head = _head(path, key)
    decode(head[: head.rfind(b"\n") + 1] if len(head) == 65536 else head, str(path), key, "CSV trace")
    reader = pacsv.open_csv(str(path))
    batches, rows, nbytes = [], 0, 0
    for batch in reader:
        rows += batch.num_rows
        nbytes += batch.nbytes
        if rows > max_rows:
            raise _too_many_rows(key, path, f"this one has more than {max_rows}", max_rows)
        if nbytes > MAX_TRACE_BYTES:
            raise ConfigError(key, str(path), f"a trace of at most {MAX_TRACE_BYTES // 2**20} MiB once read")
        batches.append(batch)
    return pa.Table.from_batches(batches, schema=reader.schema)


#: Parquet physical types of the columns a trace is read from: numbers only. A string or binary
#: column may be dictionary-encoded (one value stored once, an index per row) and be materialised
#: into every row by the reader: an 824-byte file asked for 20 GB.
_NUMERIC_PHYSICAL = frozenset({"INT32", "INT64", "FLOAT", "DOUBLE", "INT96"})


def _numeric(t: pa.DataType, arrival: bool) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return True
    return arrival and pa.types.is_timestamp(t)


def _check_column_types(pf: pq.ParquetFile, fmt: str, path: Path, key: str) -> None:
    """:class:`ConfigError` (file, column, type, what is allowed) for a needed column that is not a
    plain numeric column, decided from the schema before any data is read."""
    arr_col = FORMATS[fmt][0]
    needed = [c for c in FORMATS[fmt] if c]
    physical: dict[str, list[str]] = {}
    for i in range(len(pf.schema)):
        col = pf.schema.column(i)
        physical.setdefault(col.path.split(".")[0], []).append(col.physical_type)
    for field in pf.schema_arrow:
        if field.name not in needed:
            continue
        arrival = field.name == arr_col
        kinds = physical.get(field.name, [])
        if not _numeric(field.type, arrival) or len(kinds) != 1 or kinds[0] not in _NUMERIC_PHYSICAL:
            stored = "/".join(kinds) or "no data"
            allowed = "an integer or floating-point column" + (" (or a timestamp)" if arrival else "")
            raise ConfigError(
                key,
                str(path),
                f"column {field.name!r} is {field.type} (Parquet {stored}); {allowed}: string, binary and "
                "nested columns are refused before any data is read",
            )


def _parquet_table(path: Path, fmt: str, key: str, max_rows: int) -> pa.Table:
    """The needed columns of a Parquet trace; the row count, column types and sizes come from its
    metadata first, and only the needed columns are read."""
    pf = pq.ParquetFile(str(path))
    meta = pf.metadata
    if meta.num_rows > max_rows:
        raise _too_many_rows(key, path, f"its metadata says {meta.num_rows}", max_rows)
    names = pf.schema_arrow.names
    needed = [c for c in FORMATS[fmt] if c]
    missing = [c for c in needed if c not in names]
    if missing:
        raise ConfigError(key, str(path), _needs(fmt, needed, missing, names))
    _check_column_types(pf, fmt, path, key)
    size = sum(
        meta.row_group(i).column(j).total_uncompressed_size
        for i in range(meta.num_row_groups)
        for j in range(meta.num_columns)
        if meta.row_group(i).column(j).path_in_schema in needed
    )
    if size > MAX_TRACE_BYTES:
        raise ConfigError(
            key,
            str(path),
            f"a trace of at most {MAX_TRACE_BYTES // 2**20} MiB uncompressed (its metadata says {size // 2**20} MiB)",
        )
    return pf.read(columns=needed)


#: Mooncake columns kept (others are ignored).
_MOONCAKE = ("timestamp", "input_length", "output_length", "hash_ids")


def _jsonl_table(path: Path, key: str, max_rows: int) -> pa.Table:
    """A Mooncake JSONL trace, line by line: each line one JSON object (errors name the line)."""
    check_file(path, key, "JSONL trace")
    cols: dict[str, list] = {c: [] for c in _MOONCAKE}
    present: set[str] = set()
    rows = nbytes = 0
    try:
        f = path.open("rb")
    except OSError as exc:
        raise ConfigError(key, str(path), f"a readable JSONL trace ({_reason(exc)})") from None
    with f:
        for lineno, raw in enumerate(f, 1):
            nbytes += len(raw)
            if nbytes > MAX_TRACE_BYTES:
                raise ConfigError(key, str(path), f"a trace of at most {MAX_TRACE_BYTES // 2**20} MiB")
            if not raw.strip():
                continue
            text = decode(raw, f"{path} line {lineno}", key, "JSONL trace")
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(
                    key, str(path), f"valid JSON on line {lineno} ({exc.msg} at column {exc.colno})"
                ) from None
            except RecursionError:
                raise ConfigError(
                    key, str(path), f"a flat JSON object on line {lineno} (it is nested too deep)"
                ) from None
            if not isinstance(row, dict):
                raise ConfigError(
                    key, str(path), f"a JSON object on every line; line {lineno} holds a {type(row).__name__}"
                )
            rows += 1
            if rows > max_rows:
                raise _too_many_rows(key, path, f"this one has more than {max_rows}", max_rows)
            present.update(c for c in _MOONCAKE if c in row)
            for c in _MOONCAKE:
                cols[c].append(row.get(c))
    if not rows:
        raise ConfigError(key, str(path), "a non-empty JSONL trace")
    out = {}
    for c in _MOONCAKE:
        if c not in present:
            continue
        bad = next((i for i, v in enumerate(cols[c]) if not _plain(v, c)), None)
        if bad is not None:
            raise ConfigError(
                key,
                str(path),
                f"{c!r} of the {_ordinal(bad + 1)} object: got {quote(cols[c][bad])}; "
                + ("a list of integer block ids" if c == "hash_ids" else "a number below 2**63"),
            ) from None
        out[c] = pa.array(cols[c])
    return pa.table(out)


def _plain(v, col: str) -> bool:
    """A value pyarrow turns into the column's type: an int64 or float, or a list of int64 block ids."""
    if col == "hash_ids":
        return v is None or (isinstance(v, list) and all(_int64(h) for h in v))
    return v is None or _int64(v) or isinstance(v, float)


def _int64(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _table(path: Path, fmt: str, key: str, max_rows: int) -> pa.Table:
    try:
        if fmt == "mooncake":
            return _jsonl_table(path, key, max_rows)
        if fmt == "parquet":
            return _parquet_table(path, fmt, key, max_rows)
        return _csv_table(path, key, max_rows)
    except ConfigError:
        raise
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise ConfigError(key, str(path), f"a readable {fmt} trace ({_reason(exc)})") from None


def _float64(col: pa.ChunkedArray, safe: bool = True) -> np.ndarray:
    """A null-free numeric column as float64, read from its Arrow buffer: pyarrow's ``to_numpy``
    imports pandas (~0.4 s, a fifth of a 10,000-request run)."""
    arr = pc.cast(col, pa.float64(), safe=safe).combine_chunks()
    return np.frombuffer(arr.buffers()[1], dtype=np.float64, count=len(arr), offset=arr.offset * 8).copy()


def _tokens(table: pa.Table, col: str, path: Path, key: str) -> np.ndarray:
    arr = table[col]
    if arr.null_count:
        raise ConfigError(
            key, str(path), f"column {col!r} has {arr.null_count} empty values; token counts must all be present"
        )
    try:
        a = _float64(arr)
    except (TypeError, ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise ConfigError(key, str(path), f"column {col!r} must hold integer token counts") from None
    bad = np.flatnonzero(~((a >= 1) & (a <= MAX_TOKENS) & (a == np.floor(a))))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(
            key, str(path), f"column {col!r} row {i} is {a[i]:g}; token counts must be integers in [1, {MAX_TOKENS}]"
        )
    return a.astype(np.int64)


#: Ticks per second of each Arrow timestamp unit.
_TICKS_PER_S = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}


def _read(path: str, fmt: str, mtime: float, key: str, max_rows: int) -> Trace:
    p = Path(path)
    arr_col, p_col, o_col = FORMATS[fmt]
    table = _table(p, fmt, key, max_rows)
    needed = [c for c in (arr_col, p_col, o_col) if c]
    missing = [c for c in needed if c not in table.column_names]
    if missing:
        raise ConfigError(key, str(p), _needs(fmt, needed, missing, table.column_names))
    if table.num_rows == 0:
        raise ConfigError(key, str(p), "a trace with at least one row")
    prompt = _tokens(table, p_col, p, key)
    output = _tokens(table, o_col, p, key)
    arrival = None
    order: np.ndarray | None = None
    if arr_col:
        col = table[arr_col]
        if col.null_count:
            raise ConfigError(key, str(p), f"column {arr_col!r} has {col.null_count} empty values")
        if pa.types.is_timestamp(col.type):
            # Ticks of the column's own unit since the epoch (UTC for a zoned column), not always ns:
            # Parquet stores s as ms, Spark writes us. Beyond 2**53 ticks: rounded, as astype did.
            t = _float64(col.cast(pa.int64()), safe=False) / _TICKS_PER_S[col.type.unit]
        else:
            try:
                t = _float64(col)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise ConfigError(key, str(p), f"column {arr_col!r} must hold numeric times") from None
            if fmt == "mooncake":
                t = t / 1000.0
        bad = np.flatnonzero(~((t >= 0) & np.isfinite(t)))
        if bad.size:
            i = int(bad[0])
            raise ConfigError(key, str(p), f"column {arr_col!r} row {i} is {t[i]:g}; times must be finite and >= 0")
        order = np.argsort(t, kind="stable")
        t = t[order] - t[order][0]
        if t[-1] > MAX_TIME_S:
            raise ConfigError(
                key,
                str(p),
                f"column {arr_col!r}: arrivals within {MAX_TIME_S:g} s of the first (these span {t[-1]:g} s)",
            )
        prompt, output = prompt[order], output[order]
        arrival = t
    hashes = None
    if fmt == "mooncake" and "hash_ids" in table.column_names:
        rows = table["hash_ids"].to_pylist()
        # Each row's prefix ids go with its lengths, in the arrival order the rows were sorted to.
        hashes = tuple(tuple(rows[i] or ()) for i in (order if order is not None else range(len(rows))))
    return Trace(arrival, prompt, output, hashes, source=p.name)


#: Traces read for runs, kept per (path, modification time): a sweep reads one trace per point.
read_trace_cached = lru_cache(maxsize=16)(_read)


def read_trace(
    path: Path,
    fmt: str = "auto",
    key: str = "workload.arrival.path",
    *,
    max_rows: int | None = None,
    cache: bool = True,
) -> Trace:
    """Read and validate a trace file (cached on path and modification time unless ``cache`` is
    false: a one-off validation, such as an upload's, should not pin the trace in the process).
    More than ``max_rows`` rows (default :data:`MAX_TRACE_ROWS`) is :class:`TooManyRows`, refused
    before the rows are held."""
    check_file(path, key, "trace file")
    if fmt == "auto":
        fmt = detect_format(path, key)
    if fmt not in FORMATS:
        raise ConfigError(key, fmt, f"allowed formats: {', '.join(FORMATS)}")
    args = (str(path.resolve()), fmt, path.stat().st_mtime, key, MAX_TRACE_ROWS if max_rows is None else max_rows)
    return read_trace_cached(*args) if cache else _read(*args)
