"""What a run records, and the summary computed from it.

Per request: one row when it ends (completed or rejected). Per replica: one
time-series row per batch change (an iteration, or a fast-forwarded window of
identical-composition iterations, recorded at its end before finished
sequences free their memory, so peaks are kept).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sim.allocators.capabilities import MoveReport, PrefixCacheReport
from sim.request import COMPLETED, Request
from sim.workload.predictor import PredictionTally

if TYPE_CHECKING:
    from sim.engine.replica import Replica

REQUEST_COLUMNS = [
    "id",
    "replica",
    "status",
    "reason",
    "truncated",
    "arrival_s",
    "admitted_s",
    "first_token_s",
    "finish_s",
    "prompt_tokens",
    "output_tokens",
    "generated_tokens",
    "preemptions",
]
REQUEST_SCHEMA = pa.schema(
    [
        (n, t)
        for n, t in zip(
            REQUEST_COLUMNS,
            [
                pa.int64(),
                pa.int32(),
                pa.string(),
                pa.string(),
                pa.bool_(),
                pa.float64(),
                pa.float64(),
                pa.float64(),
                pa.float64(),
                pa.int64(),
                pa.int64(),
                pa.int64(),
                pa.int32(),
            ],
        )
    ]
)
TIMESERIES_COLUMNS = [
    "t_s",
    "replica",
    "running",
    "waiting",
    "batch_tokens",
    "iterations",
    "window_s",
    "first_step_s",
    "kv_capacity_bytes",
    "kv_reserved_bytes",
    "kv_used_bytes",
    "kv_free_bytes",
    "kv_largest_free_extent_bytes",
    "kv_internal_fragmentation",
    "kv_external_fragmentation",
    "kv_used_bytes_max",
    "kv_reserved_bytes_max",
    "waiting_max",
]
TIMESERIES_SCHEMA = pa.schema(
    [
        (
            n,
            pa.float64()
            if n in ("t_s", "window_s", "first_step_s", "kv_internal_fragmentation", "kv_external_fragmentation")
            else pa.int64(),
        )
        for n in TIMESERIES_COLUMNS
    ]
)
#: What the summary keeps of each request: (key, request column, dtype); ``ok`` = completed.
_SUMMARY_COLUMNS = [
    ("ok", "status", bool),
    ("arrival", "arrival_s", np.float64),
    ("first", "first_token_s", np.float64),
    ("finish", "finish_s", np.float64),
    ("generated", "generated_tokens", np.int64),
    ("prompt", "prompt_tokens", np.int64),
]
#: Rows buffered before they become an Arrow record batch (and, when streaming, go to disk).
BATCH_ROWS = 65_536


_NUMPY_TYPES = {pa.int64(): np.int64, pa.int32(): np.int32, pa.float64(): np.float64}


def arrow_column(values: tuple, typ: pa.DataType) -> pa.Array:
    """``pa.array(values, type=typ)`` built from numpy buffers: ``pa.array`` probes for pandas
    objects, which imports pandas (0.2–0.4 s per process, a tenth of a 10,000-request run)."""
    n = len(values)
    try:
        if typ == pa.string():
            enc = [v.encode() for v in values]
            offsets = np.zeros(n + 1, dtype=np.int32)
            np.cumsum(np.fromiter(map(len, enc), dtype=np.int32, count=n), out=offsets[1:])
            return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(enc))])
        if typ == pa.bool_():
            bits = np.packbits(np.fromiter(values, dtype=bool, count=n), bitorder="little")
            return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(bits)])
        dtype = _NUMPY_TYPES.get(typ)
        if dtype is not None:
            return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(np.fromiter(values, dtype=dtype, count=n))])
    except (TypeError, ValueError, AttributeError):
        pass  # a None or an odd value: let pyarrow convert it (and complain if it must)
    return pa.array(values, type=typ)


class _Sink:
    """Rows → Arrow record batches, kept in memory or streamed to one Parquet file."""

    def __init__(self, schema: pa.Schema, path: Path | None, on_columns: Callable[[list[tuple]], None] | None = None):
        self.schema = schema
        self.path = path
        #: Called with each batch's columns (tuples, schema order) before they become Arrow arrays.
        self.on_columns = on_columns
        self.rows: list[tuple] = []
        self.batches: list[pa.RecordBatch] = []
        self.writer: pq.ParquetWriter | None = None

    def add(self, row: tuple) -> None:
        self.rows.append(row)
        if len(self.rows) >= BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        cols = list(zip(*self.rows))
        if self.on_columns is not None:
            self.on_columns(cols)
        batch = pa.record_batch([arrow_column(c, f.type) for c, f in zip(cols, self.schema)], schema=self.schema)
        self.rows = []
        if self.path is None:
            self.batches.append(batch)
            return
        if self.writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(self._tmp_path(), self.schema)
        self.writer.write_batch(batch)

    def _tmp_path(self) -> Path:
        # Rows stream to a hidden temporary name and replace ``path`` only on close: a run killed
        # mid-way leaves an earlier run's file intact, and a symlink at ``path`` is replaced, never
        # written through.
        assert self.path is not None
        return self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")

    def close(self) -> None:
        self.flush()
        if self.path is not None:
            if self.writer is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(self.schema.empty_table(), self._tmp_path())
            else:
                self.writer.close()
                self.writer = None
            os.replace(self._tmp_path(), self.path)

    def table(self) -> pa.Table:
        if self.path is not None:
            return pq.read_table(self.path)
        return pa.Table.from_batches(self.batches, schema=self.schema)


class _Bin:
    """One replica's time-series interval (``timeseries.every_s``): last values plus exact peaks."""

    __slots__ = ("index", "last", "used_max", "reserved_max", "waiting_max", "iterations", "window_s")

    def __init__(self, index: int):
        self.index = index
        #: The latest sample's raw values (see ``Recorder._row``); the row is built when emitted.
        self.last: tuple | None = None
        self.used_max = self.reserved_max = self.waiting_max = 0
        self.iterations = 0
        self.window_s = 0.0


class Recorder:
    """Collects request rows and time-series rows; memory grows with live requests only.

    Rows go to Arrow record batches (to Parquet files when ``out_dir`` is given).
    For the summary, each finished request keeps a handful of numbers in
    numpy arrays (8 bytes each, taken column-wise from every batch of rows), so
    percentiles come from every request.
    """

    def __init__(self, kv_bytes_per_token: int, out_dir: Path | None = None, every_s: float | None = None):
        self.bpt = kv_bytes_per_token
        out = Path(out_dir) if out_dir is not None else None
        self.requests = _Sink(REQUEST_SCHEMA, out / "requests.parquet" if out else None, self._summary_columns)
        self.timeseries = _Sink(TIMESERIES_SCHEMA, out / "timeseries.parquet" if out else None)
        self.every_s = every_s
        self._bins: dict[int, _Bin] = {}
        #: Summary columns, one numpy array per flushed batch of request rows (``_summary_columns``).
        self._parts: dict[str, list[np.ndarray]] = {k: [] for k, _, _ in _SUMMARY_COLUMNS}
        self.reasons: Counter[str] = Counter()
        self.truncated = 0

    def request_done(self, r: Request) -> None:
        # One tuple per request; the summary's columns are taken from whole batches of them.
        self.requests.add(
            (
                r.id,
                r.replica,
                r.status,
                r.reason,
                r.truncated,
                r.arrival,
                r.admitted,
                r.first_token,
                r.finish,
                r.prompt,
                r.output,
                r.generated,
                r.preemptions,
            )
        )

    def _summary_columns(self, cols: list[tuple]) -> None:
        status = cols[REQUEST_COLUMNS.index("status")]
        n = len(status)
        ok = np.fromiter(map(COMPLETED.__eq__, status), dtype=bool, count=n)
        self._parts["ok"].append(ok)
        for key, column, dtype in _SUMMARY_COLUMNS[1:]:
            self._parts[key].append(np.fromiter(cols[REQUEST_COLUMNS.index(column)], dtype=dtype, count=n))
        reason = cols[REQUEST_COLUMNS.index("reason")]
        for i in np.flatnonzero(~ok).tolist():
            self.reasons[reason[i]] += 1
        self.truncated += sum(cols[REQUEST_COLUMNS.index("truncated")])

    def summary_column(self, key: str) -> np.ndarray:
        """Every finished request's ``key`` (``ok``, ``arrival``, ``first``, ``finish``,
        ``generated``, ``prompt``), in the order they finished."""
        self.requests.flush()
        parts = self._parts[key]
        if not parts:
            return np.zeros(0, dtype=dict((k, d) for k, _, d in _SUMMARY_COLUMNS)[key])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _row(
        self,
        now: float,
        replica: int,
        running: int,
        waiting: int,
        batch_tokens: int,
        iterations: int,
        window_s: float,
        first_step_s: float,
        capacity: int,
        reserved: int,
        used: int,
        largest: int,
    ) -> list:
        """A time-series row (TIMESERIES_SCHEMA order) from token counts."""
        bpt = self.bpt
        free = capacity - reserved
        return [
            now,
            replica,
            running,
            waiting,
            batch_tokens,
            iterations,
            window_s,
            first_step_s,
            capacity * bpt,
            reserved * bpt,
            used * bpt,
            free * bpt,
            largest * bpt,
            1.0 - used / reserved if reserved else 0.0,
            1.0 - largest / free if free else 0.0,
            used * bpt,
            reserved * bpt,
            waiting,
        ]

    def step(
        self,
        rep: Replica,
        now: float,
        iterations: int,
        window_s: float,
        first_step_s: float,
        batch_tokens: int,
        reserved_peak: int = 0,
    ) -> None:
        """A batch change of replica ``rep`` ended at ``now`` (simulated seconds): ``iterations``
        iterations in ``window_s`` seconds, the first ``first_step_s``. ``reserved_peak``: the most
        slots reserved during those iterations where it exceeds the state now (a sliding window's
        blocks slide out within a decode window)."""
        a = rep.alloc
        reserved = a.reserved_tokens()
        used = a.used_total
        waiting = len(rep.sched.waiting)
        if self.every_s is None:
            row = self._row(
                now,
                rep.index,
                len(rep.sched.running),
                waiting,
                batch_tokens,
                iterations,
                window_s,
                first_step_s,
                a.capacity_tokens,
                reserved,
                used,
                a.largest_free_extent_tokens(),
            )
            if reserved_peak > reserved:
                row[16] = reserved_peak * self.bpt
            self.timeseries.add(tuple(row))
            return
        b = self._bins.get(rep.index)
        idx = int(now // self.every_s)
        if b is None:
            b = self._bins[rep.index] = _Bin(idx)
        elif idx != b.index:
            self._emit(b, rep.index)
            b.index = idx
        # Raw values only: most samples are overwritten before their interval ends.
        b.last = (
            now,
            len(rep.sched.running),
            waiting,
            batch_tokens,
            first_step_s,
            a.capacity_tokens,
            reserved,
            used,
            a.largest_free_extent_tokens(),
        )
        if used > b.used_max:
            b.used_max = used
        if reserved > b.reserved_max:
            b.reserved_max = reserved
        if reserved_peak > b.reserved_max:
            b.reserved_max = reserved_peak
        if waiting > b.waiting_max:
            b.waiting_max = waiting
        b.iterations += iterations
        b.window_s += window_s

    def _emit(self, b: _Bin, replica: int) -> None:
        if b.last is None:
            return
        now, running, waiting, batch_tokens, first_step_s, capacity, reserved, used, largest = b.last
        row = self._row(
            now,
            replica,
            running,
            waiting,
            batch_tokens,
            b.iterations,
            b.window_s,
            first_step_s,
            capacity,
            reserved,
            used,
            largest,
        )
        row[15], row[16], row[17] = b.used_max * self.bpt, b.reserved_max * self.bpt, b.waiting_max
        self.timeseries.add(tuple(row))
        b.last = None
        b.used_max = b.reserved_max = b.waiting_max = 0
        b.iterations = 0
        b.window_s = 0.0

    def close(self) -> None:
        for replica, b in self._bins.items():
            self._emit(b, replica)
        self.requests.close()
        self.timeseries.close()

    def requests_table(self) -> pa.Table:
        return self.requests.table().sort_by("id")

    def timeseries_table(self) -> pa.Table:
        return self.timeseries.table()


def percentiles(values: np.ndarray) -> dict[str, float | None]:
    """p50, p90, p99 and mean of ``values`` (in their unit); ``None`` each when empty."""
    if values.size == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(values.mean())}


def summarize(rec: Recorder, replicas: list[Replica], bpt: int) -> dict:
    """Headline metrics of a run (see docs/scenario.md, "Outputs"), over every request."""
    ok, arrival, first, finish, gen, prompt = (rec.summary_column(k) for k, _, _ in _SUMMARY_COLUMNS)
    # Latencies only of requests that have the time in question (-1 marks "never happened"): a
    # sentinel must never enter a percentile or a mean.
    ttft = (first - arrival)[ok & (first >= 0)]
    e2e = (finish - arrival)[ok & (finish >= 0)]
    multi = ok & (gen > 1) & (first >= 0)
    tpot = (finish - first)[multi] / (gen[multi] - 1)
    t_start = float(arrival.min()) if arrival.size else 0.0
    t_end = float(finish.max()) if finish.size else 0.0
    makespan = max(t_end - t_start, 1e-12)
    reasons = dict(rec.reasons)
    stats = [r.stats for r in replicas]
    used = sum(s.used_token_s for s in stats)
    reserved = sum(s.reserved_token_s for s in stats)
    capacity = sum(r.alloc.capacity_tokens for r in replicas) * makespan
    refusals: dict[str, int] = {}
    for r in replicas:
        for k, v in r.alloc.refusal_counts().items():
            refusals[k] = refusals.get(k, 0) + v
    busy = sum(s.busy_s for s in stats)
    out_tokens = int(gen[ok].sum())
    work = {"events": 0, "copy_bytes": 0, "zero_bytes": 0, "swap_out_bytes": 0, "swap_in_bytes": 0}
    for r in replicas:
        for k in work:
            work[k] += getattr(r.alloc.work_total, k)
    return {
        "requests": int(len(ok)),
        "completed": int(ok.sum()),
        "rejected": int((~ok).sum()),
        "rejected_by_reason": dict(sorted(reasons.items())),
        "truncated": int(rec.truncated),
        "preemptions": int(sum(r.sched.preemptions for r in replicas)),
        "ttft_s": percentiles(ttft),
        "tpot_s": percentiles(tpot),
        "e2e_s": percentiles(e2e),
        "makespan_s": makespan,
        "throughput_tokens_per_s": (out_tokens + int(prompt[ok].sum())) / makespan,
        "output_tokens_per_s": out_tokens / makespan,
        "throughput_requests_per_s": float(ok.sum()) / makespan,
        "kv_token_utilization": used / reserved if reserved > 0 else None,
        "kv_memory_utilization": used / capacity if capacity > 0 else None,
        "kv_capacity_bytes_per_replica": int(replicas[0].alloc.capacity_tokens * bpt),
        "allocator_refusals": dict(sorted(refusals.items())),
        "stranded_refusals": refusals.get("no_contiguous_extent", 0),
        "kv_internal_fragmentation": 1.0 - used / reserved if reserved > 0 else None,
        "kv_external_fragmentation": sum(s.ext_frag_s for s in stats) / busy if busy > 0 else None,
        "admissions_paused_s": sum(s.paused_s for s in stats),
        "compactions": int(sum(s.compactions for s in stats)),
        "compaction_bytes": int(sum(s.compaction_bytes for s in stats)),
        "compaction_time_s": sum(s.compaction_s for s in stats),
        # Every compaction (first 10,000): when, on which replica, bytes moved, copy seconds.
        "compaction_log": [
            {"t_s": t, "replica": r.index, "bytes": b, "time_s": c}
            for r in replicas
            for (t, b, c) in r.stats.compaction_log
        ][:10_000],
        "swaps_out": int(sum(r.sched.swaps_out for r in replicas)),
        "swaps_in": int(sum(r.sched.swaps_in for r in replicas)),
        "recomputed_tokens": int(sum(r.sched.recomputed_tokens for r in replicas)),
        **_prefix_stats(replicas),
        **_move_stats(replicas),
        "allocation_events": work["events"],
        "allocation_time_s": sum(s.alloc_work_s for s in stats),
        "copy_bytes": work["copy_bytes"],
        "zero_fill_bytes": work["zero_bytes"],
        "swap_out_bytes": work["swap_out_bytes"],
        "swap_in_bytes": work["swap_in_bytes"],
        "iterations": int(sum(s.iterations for s in stats)),
        "busy_fraction": sum(s.busy_s for s in stats) / (makespan * len(replicas)),
    }


def _prefix_stats(replicas) -> dict:
    allocs = [r.alloc for r in replicas if isinstance(r.alloc, PrefixCacheReport)]
    if not allocs:
        return {}
    hit = sum(a.hit_tokens for a in allocs)
    queried = sum(a.queried_tokens for a in allocs)
    return {
        "prefix_hit_tokens": int(hit),
        "prefix_queried_tokens": int(queried),
        "prefix_hit_rate": hit / queried if queried else 0.0,
    }


def _move_stats(replicas) -> dict:
    """Moves between an allocator's regions (``MoveReport``), and the length predictor's confusion."""
    out: dict = {}
    moves: dict[str, int] = {}
    for r in replicas:
        if isinstance(r.alloc, MoveReport):
            for k, v in r.alloc.move_report().items():
                moves[k] = moves.get(k, 0) + v
    tallies = [r.sched.predictions for r in replicas if r.sched.predictions is not None]
    if tallies:
        total = PredictionTally(tallies[0].threshold_tokens)
        for t in tallies:
            total.add(t)
        # The predictor's own description is added by the run (sim/engine/cluster.py).
        out["length_predictor"] = {**total.as_dict(), **moves}
    else:
        out.update(moves)
    return out


def clean_json(obj):
    """Replace NaN/inf by None so summary.json is strict JSON."""
    if isinstance(obj, dict):
        return {k: clean_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean_json(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
