"""A sweep's Parquet dataset: one file per point (``part-<point id>.parquet``, written atomically),
the metadata file, the points kept apart in ``_dropped/``, and reading them back as one table."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sim.analysis.sweep.point import ROW_KEYS
from sim.analysis.sweep.spec import Axis, Point, fits_int64
from sim.errors import ConfigError
from sim.inputs import load_json, read_text

#: The sweep's metadata file in its folder (the sweep file's points, for readers of the dataset).
META_FILE = "_sweep.json"
#: Finished points of earlier sweeps into the folder that the current sweep file no longer has.
DROPPED_DIR = "_dropped"


def _arrow_type(labels: Iterable[Any]) -> pa.DataType:
    """The column type of these values (``None`` and integers past int64, which no column type
    but text holds, left out: they are recorded as null)."""
    labels = [v for v in labels if v is not None and not (isinstance(v, int) and not fits_int64(v))]
    if not labels:
        return pa.int64()
    if all(isinstance(v, bool) for v in labels):
        return pa.bool_()
    if all(isinstance(v, int) and not isinstance(v, bool) for v in labels):
        return pa.int64()
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in labels):
        return pa.float64()
    return pa.string()


def axis_types(axes: Iterable[Axis], points: list[Point]) -> dict[str, pa.DataType]:
    """Dataset column type of each axis: text for a mapping axis (its labels); otherwise the type
    of the values the valid points ran with, i.e. of the config field (a rate is float64 whether
    written ``4``, ``"4"`` or ``4.0``). Only when no point is valid do the values as given decide."""
    types: dict[str, pa.DataType] = {}
    for ax in axes:
        if ax.key in ROW_KEYS:  # a seed axis: the row's own seed column holds it
            continue
        if ax.mapped:
            types[ax.key] = pa.string()
            continue
        ran = [p.params[ax.key] for p in points if p.scenario is not None]
        types[ax.key] = _arrow_type(ran or [p.params[ax.key] for p in points])
    return types


def _cast_label(v: Any, t: pa.DataType) -> Any:
    """``v`` as a value of a column of type ``t``; ``None`` (null) where it has none there (an
    invalid point's integer past int64, or text in a numeric column: its error names the value)."""
    if v is None:
        return None
    if t == pa.string():
        return v if isinstance(v, str) else json.dumps(v) if isinstance(v, (dict, list)) else str(v)
    if t == pa.bool_():
        return v if isinstance(v, bool) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if t == pa.float64():
        try:
            return float(v)
        except OverflowError:
            return None
    if isinstance(v, float):
        v = int(v) if v.is_integer() else None
    return v if fits_int64(v) else None


def row_table(point: Point, result: dict, axis_types: dict[str, pa.DataType]) -> pa.Table:
    cols: dict[str, pa.Array] = {
        "point": pa.array([point.index], pa.int64()),
        "point_id": pa.array([point.point_id], pa.string()),
        "status": pa.array([result["status"]], pa.string()),
        "error": pa.array([result["error"]], pa.string()),
        "seed": pa.array([point.seed if fits_int64(point.seed) else None], pa.int64()),
    }
    for key, t in axis_types.items():
        if key not in cols:
            cols[key] = pa.array([_cast_label(point.params.get(key), t)], t)
    cols["wall_s"] = pa.array([result.get("wall_s")], pa.float64())
    for k, v in result["metrics"].items():
        if k in cols:
            continue
        # Natural types; read_dataset unifies files (null → any, int64 + float64 → float64).
        if isinstance(v, bool):
            cols[k] = pa.array([v], pa.bool_())
        elif isinstance(v, int):
            cols[k] = pa.array([v], pa.int64())
        elif isinstance(v, float):
            cols[k] = pa.array([v], pa.float64())
        elif v is None:
            cols[k] = pa.nulls(1)
        else:
            cols[k] = pa.array([str(v)], pa.string())
    return pa.table(cols)


def relabelled_row(old: pa.Table, point: Point, axis_types: dict[str, pa.DataType]) -> pa.Table:
    """The finished row ``old`` (of this point's scenario, possibly written by another sweep file)
    as this sweep writes it: its index, seed and axis columns; status, error, wall time and
    metrics kept. A row's metric columns are those after ``wall_s`` (:func:`row_table`)."""
    row = old.slice(0, 1).to_pylist()[0]
    result = {"status": row.get("status"), "error": row.get("error"), "wall_s": row.get("wall_s"), "metrics": {}}
    new = row_table(point, result, axis_types)
    names = old.column_names
    metrics = names[names.index("wall_s") + 1 :] if "wall_s" in names else []
    for name in metrics:
        if name not in new.column_names:
            new = new.append_column(old.schema.field(name), old.column(name).slice(0, 1))
    return new


def write_atomic(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def part_path(out: Path, pid: str) -> Path:
    return out / f"part-{pid}.parquet"


def part_files(folder: Path) -> dict[str, tuple[str, Path]]:
    """point id → (status, file) of every readable part in ``folder``."""
    found: dict[str, tuple[str, Path]] = {}
    if not folder.is_dir():
        return found
    for f in sorted(folder.glob("part-*.parquet")):
        try:
            t = pq.read_table(f, columns=["point_id", "status"])
        except Exception:  # an unreadable file is a point to run again
            continue
        for pid, st in zip(t.column("point_id").to_pylist(), t.column("status").to_pylist()):
            found[pid] = (st, f)
    return found


def _concat(tables: list[pa.Table]) -> pa.Table:
    """Tables unified by column name (null → any type, int64 + float64 → float64); a column whose
    types do not unify (an axis that was a number in one file and a label in another, left by a
    sweep interrupted while it rewrote its rows) becomes text rather than an unreadable dataset."""
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    types: dict[str, set[pa.DataType]] = {}
    for t in tables:
        for f in t.schema:
            if f.type != pa.null():
                types.setdefault(f.name, set()).add(f.type)
    numeric = {pa.int64(), pa.float64()}
    clash = {name for name, ts in types.items() if len(ts) > 1 and not ts <= numeric}
    fixed = []
    for t in tables:
        for name in clash & set(t.column_names):
            i = t.column_names.index(name)
            t = t.set_column(i, pa.field(name, pa.string()), t.column(name).cast(pa.string()))
        fixed.append(t)
    return pa.concat_tables(fixed, promote_options="permissive")


def _meta_point_ids(meta: Path) -> set[str]:
    """The ``point_ids`` of a sweep folder's metadata file, read bounded (size, UTF-8, nesting:
    sim/inputs.py): the folder is the user's, so a damaged file is one ConfigError line."""
    key = str(meta)
    doc = load_json(read_text(meta, key, "sweep metadata file"), key, key)
    ids = doc.get("point_ids", []) if isinstance(doc, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        got = ids if isinstance(doc, dict) else type(doc).__name__
        raise ConfigError(key, got, "a JSON object with a point_ids list of strings (as kvsim writes it)")
    return set(ids)


def read_dataset(out: str | Path, all_points: bool = False) -> pa.Table:
    """The sweep dataset at ``out`` as one table (one row per point, sorted by point index).

    Files are unified by column name (a failed point has no metric columns: nulls there).
    By default only the points of the sweep last run into ``out`` are returned (:func:`run_sweep`
    keeps exactly those in ``out``); ``all_points`` adds the finished points of earlier sweep
    files kept in ``out/_dropped/``.
    """
    out = Path(out)
    files = sorted(out.glob("part-*.parquet"))
    if all_points:
        files += sorted((out / DROPPED_DIR).glob("part-*.parquet"))
    if not files:
        return pa.table({c: pa.array([], pa.string()) for c in ("point_id", "status", "error")})
    table = _concat([pq.read_table(f) for f in files])
    meta = out / META_FILE
    if not all_points and meta.is_file():
        keep = _meta_point_ids(meta)
        mask = pa.array([pid in keep for pid in table.column("point_id").to_pylist()])
        table = table.filter(mask)
    if "point" in table.column_names:
        table = table.sort_by([("point", "ascending")])
    return table
