"""Parameter sweeps: one scenario, many points, one resumable Parquet dataset.

A sweep file (YAML, format in ``docs/sweeps.md``)::

    name: alloc-vs-rate
    base: chat-api                 # scenario file (relative to this file) or built-in name
    set:                           # fixed overrides for every point
      workload.num_requests: 200
    grid:                          # Cartesian product of these axes
      allocator.kind: [static, paged]
      workload.arrival.rate: [5, 10, 20]
    zip:                           # paired axes (equal lengths), one value-tuple per point
      allocator.block_size: [16, 32]
      scheduler.max_num_seqs: [128, 256]
    seeds: 3                       # replicates: seed = base seed + i

Points = product(grid axes, each zip group) × seeds. An axis is a list of values, or a
mapping ``label: value`` (the label is what the dataset column holds; use it for whole
sections such as ``workload.lengths``).

Validation happens before any point runs: the file's structure, every axis key path
(unknown keys fail the sweep), then every point's scenario, and then each ``allocator.*`` axis:
one that the allocator of no point reads (``allocator.block_size`` of ``static`` without
``overflow: fallback``) fails the sweep, since its values would all give the same run. A point whose scenario is
invalid for its *values* (a block size of 0, a model that does not fit the GPU) is recorded
as ``failed`` with its error, without running, and the sweep exits non-zero after the valid
points finish: a sweep that maps a feasible region should not abort on its infeasible corner.

Each point runs in its own process (a ``spawn``/``forkserver`` process pool, or a Ray task) and
is written as one Parquet file ``part-<point id>.parquet`` as soon as it finishes (written to a
hidden temporary name, then renamed, so a kill never leaves a partial file). Rerunning skips
points already ``ok`` in the dataset; failed points are run again. The point id is a hash of
the resolved scenario (every key, defaults filled), so it is stable across runs and machines
and independent of how the sweep file spells the point.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel

from sim.config import AllocatorConfig, Scenario, apply_overrides, check_name, read_scenario_dict, scenario_from_dict
from sim.engine.budget import RunBudget
from sim.errors import ConfigError
from sim.inputs import is_file, load_yaml, read_text
from sim.limits import MAX_SEED, MAX_SWEEP_POINTS, MAX_SWEEP_SEEDS, MAX_WORKERS
from sim.output.results import replace_file
from sim.output.staging import out_dir

if TYPE_CHECKING:
    from sim.analysis.worker_lifetime import WorkerPool

SWEEP_KEYS = ("name", "description", "base", "set", "grid", "zip", "seeds")
META_FILE = "_sweep.json"
#: Metric columns are the run summary flattened; these keys are already columns of the row.
_ROW_KEYS = ("point", "point_id", "status", "error", "seed", "wall_s")
_PCT_KEYS = {"p50", "p90", "p99", "mean"}


# --- the sweep file -------------------------------------------------------------------


@dataclass(frozen=True)
class Axis:
    """One swept scenario key: ``values`` go into the scenario, ``labels`` into the dataset."""

    key: str
    values: tuple
    labels: tuple


@dataclass
class Point:
    index: int
    point_id: str
    seed: int
    #: Dataset column → label of the value this point takes.
    params: dict[str, Any]
    #: ``Scenario.model_dump(mode="json")`` of the resolved scenario; ``None`` when invalid.
    scenario: dict | None
    base_dir: str
    error: str | None = None


@dataclass
class SweepSpec:
    path: Path
    name: str
    base: str
    base_data: dict
    base_dir: Path
    fixed: dict[str, Any]
    #: Each group multiplies the number of points: one grid axis, or one zip group of paired axes.
    groups: list[list[Axis]]
    seeds: int | None

    @property
    def axes(self) -> list[Axis]:
        return [a for g in self.groups for a in g]

    def points(self) -> list[Point]:
        """Every point with its scenario validated (invalid ones carry their error). An
        ``allocator.*`` axis that the allocator of no valid point reads raises
        :class:`ConfigError` (:func:`sim.allocators.knob_use.check_axes_read`)."""
        from sim.allocators.knob_use import check_axes_read

        base = apply_overrides(self.base_data, self.fixed)
        base_seed = base.get("seed", 0)
        if self.seeds is not None and not isinstance(base_seed, int):
            raise ConfigError("seed", base_seed, "an integer (seeds: N replicates base seed + i)")
        seed_values = [None] if self.seeds is None else [base_seed + i for i in range(self.seeds)]
        out: list[Point] = []
        seen: set[str] = set()
        allocators: list[AllocatorConfig] = []
        for combo in itertools.product(*(range(len(g[0].values)) for g in self.groups)):
            for seed in seed_values:
                overrides: dict[str, Any] = {}
                params: dict[str, Any] = {}
                for g, i in zip(self.groups, combo):
                    for ax in g:
                        overrides[ax.key] = ax.values[i]
                        params[ax.key] = ax.labels[i]
                if seed is not None:
                    overrides["seed"] = seed
                data = apply_overrides(base, overrides)
                try:
                    sc = scenario_from_dict(data, base_dir=self.base_dir)
                    _check_fits(sc)
                except ConfigError as exc:
                    pid = _hash(data)
                    pseed = data.get("seed", 0) if isinstance(data.get("seed", 0), int) else 0
                    point = Point(len(out), pid, pseed, params, None, str(self.base_dir), f"ConfigError: {exc}")
                else:
                    allocators.append(sc.allocator)
                    dump = canonical_scenario(sc)
                    point = Point(len(out), _hash(dump), sc.seed, params, dump, str(self.base_dir))
                # The same resolved scenario twice (e.g. 10 and 10.0) is one point.
                if point.point_id in seen:
                    continue
                seen.add(point.point_id)
                out.append(point)
        # An axis the allocator ignores everywhere would run the same scenario once per value.
        check_axes_read({a.key: a.values for a in self.axes}, allocators)
        return out


def _check_fits(sc: Scenario) -> None:
    """The deployment checks that need no workload: the model fits the GPU, max_model_len fits."""
    from sim.engine.deployment import Deployment

    # A pNN reservation needs the workload's lengths; it is checked when the point runs.
    Deployment.from_scenario(sc, lambda q: 1)


def canonical_scenario(sc: Scenario) -> dict:
    """The resolved scenario as JSON-able data (``base_dir`` is excluded: it is not a key)."""
    return sc.model_dump(mode="json")


def point_id(sc: Scenario) -> str:
    """Stable id of a scenario: 16 hex digits of the SHA-256 of its canonical JSON."""
    return _hash(canonical_scenario(sc))


def _hash(data: dict) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _model_of(annotation) -> type[BaseModel] | None:
    for cand in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(cand, type) and issubclass(cand, BaseModel):
            return cand
    return None


def check_key_path(key: str, where: str, value: Any = None) -> None:
    """Raise a :class:`ConfigError` unless ``key`` is a dotted path of :class:`Scenario`."""
    if not isinstance(key, str) or not key or any(not p for p in key.split(".")):
        raise ConfigError(where, key, "a dotted scenario key such as workload.arrival.rate")
    model: type[BaseModel] | None = Scenario
    parts = key.split(".")
    for i, part in enumerate(parts):
        section = ".".join(parts[:i]) or "the top level"
        if model is None:
            raise ConfigError(f"{where} {key}", value, f"'{parts[i - 1]}' is a value, not a section")
        fields = {k: f for k, f in model.model_fields.items() if k != "base_dir"}
        if part not in fields:
            raise ConfigError(
                f"{where} {key}",
                value,
                f"unknown scenario key '{part}' in {section}; allowed there: {', '.join(fields)}",
            )
        model = _model_of(fields[part].annotation)


def _axis(key: str, spec: Any, where: str) -> Axis:
    check_key_path(key, where, spec)
    if isinstance(spec, dict):
        if not spec:
            raise ConfigError(f"{where} {key}", spec, "a non-empty list of values (or mapping label: value)")
        labels = tuple(str(k) for k in spec)
        values = tuple(spec.values())
    elif isinstance(spec, list):
        if not spec:
            raise ConfigError(f"{where} {key}", spec, "a non-empty list of values (or mapping label: value)")
        values = tuple(spec)
        labels = tuple(_label(v) for v in spec)
    else:
        raise ConfigError(
            f"{where} {key}", spec, "a list of values (or a mapping label: value); a single value belongs under 'set'"
        )
    return Axis(key, values, labels)


def _label(v: Any) -> Any:
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, separators=(",", ":"))
    return v


def load_sweep(path: str | Path) -> SweepSpec:
    """Parse and structurally validate a sweep file (points are validated by :meth:`SweepSpec.points`)."""
    p = Path(path)
    if not is_file(p):
        read_text(p, "sweep", "sweep YAML file")  # says what the path is instead (missing, a folder...)
    data = load_yaml(read_text(p, "sweep", "sweep YAML file"), "sweep", str(p))
    if not isinstance(data, dict):
        raise ConfigError("sweep", str(p), "a YAML mapping with keys " + ", ".join(SWEEP_KEYS))
    unknown = [k for k in data if k not in SWEEP_KEYS]
    if unknown:
        raise ConfigError(
            f"sweep key {unknown[0]}", data[unknown[0]], f"unknown sweep key; allowed: {', '.join(SWEEP_KEYS)}"
        )
    base = data.get("base")
    if not isinstance(base, str) or not base:
        raise ConfigError("base", base, "a scenario file (relative to the sweep file) or a built-in scenario name")
    rel = p.parent / base
    try:
        base_data, base_dir = read_scenario_dict(rel if is_file(rel) else base)
    except ConfigError as exc:
        raise ConfigError(
            "base", base, f"a scenario file relative to the sweep file ({p.parent}) or a built-in name; {exc.allowed}"
        ) from None
    if not isinstance(base_data, dict):
        raise ConfigError("base", base, "a scenario YAML mapping")

    fixed = data.get("set") or {}
    if not isinstance(fixed, dict):
        raise ConfigError("set", fixed, "a mapping of dotted scenario keys to values")
    for key, value in fixed.items():
        check_key_path(key, "set", value)

    groups: list[list[Axis]] = []
    grid = data.get("grid") or {}
    if not isinstance(grid, dict):
        raise ConfigError("grid", grid, "a mapping of dotted scenario keys to lists of values")
    for key, spec in grid.items():
        groups.append([_axis(key, spec, "grid")])
    zips = data.get("zip") or []
    if isinstance(zips, dict):
        zips = [zips]
    if not isinstance(zips, list):
        raise ConfigError("zip", zips, "a mapping of dotted keys to equal-length lists, or a list of such mappings")
    for z in zips:
        if not isinstance(z, dict) or not z:
            raise ConfigError("zip", z, "a non-empty mapping of dotted keys to equal-length lists")
        axes = [_axis(key, spec, "zip") for key, spec in z.items()]
        lengths = {a.key: len(a.values) for a in axes}
        if len(set(lengths.values())) > 1:
            raise ConfigError("zip", lengths, "paired axes of equal length")
        groups.append(axes)
    if not groups and data.get("seeds") is None:
        raise ConfigError("sweep", str(p), "at least one axis under 'grid' or 'zip', or 'seeds'")
    keys = [a.key for g in groups for a in g] + list(fixed)
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup:
        raise ConfigError(dup, None, "each scenario key at most once across set, grid and zip")
    for k in keys:
        for other in keys:
            if other != k and other.startswith(k + "."):
                raise ConfigError(other, None, f"not together with its section '{k}' (one would overwrite the other)")

    seeds = data.get("seeds")
    if seeds is not None:
        if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_SWEEP_SEEDS:
            raise ConfigError(
                "seeds", seeds, f"an integer in [1, {MAX_SWEEP_SEEDS}] (replicates with seed = base seed + i)"
            )
        if "seed" in keys:
            raise ConfigError("seeds", seeds, "not together with a 'seed' axis or 'set: seed'")
        base_seed = apply_overrides(base_data, dict(fixed)).get("seed", 0)
        if isinstance(base_seed, int) and not isinstance(base_seed, bool) and base_seed + seeds - 1 > MAX_SEED:
            raise ConfigError("seeds", seeds, f"base seed {base_seed} + seeds - 1 at most {MAX_SEED}")
    # Count before enumerating: each point's scenario is validated, and 100⁴ of them would take hours.
    points = seeds or 1
    for g in groups:
        points *= len(g[0].values)
    if points > MAX_SWEEP_POINTS:
        sizes = " × ".join([str(len(g[0].values)) for g in groups] + ([f"{seeds} seeds"] if seeds else []))
        raise ConfigError(
            "sweep",
            f"{points} points ({sizes})",
            f"at most {MAX_SWEEP_POINTS} points per sweep (split it into several sweeps)",
        )
    name = data.get("name")
    if name is not None:
        try:
            check_name(name)
        except ValueError as exc:
            raise ConfigError("name", name, str(exc)) from None
    else:
        # The file's stem, made safe as a directory name (sweeps/<name>).
        name = re.sub(r"[^A-Za-z0-9_.+=@,-]", "_", p.stem).lstrip(".").replace("..", "_")[:128] or "sweep"
    return SweepSpec(p, str(name), base, base_data, Path(base_dir), dict(fixed), groups, seeds)


# --- running a point ------------------------------------------------------------------


def flatten_summary(summary: dict) -> dict[str, Any]:
    """Run summary → flat metric columns: percentile dicts become ``ttft_s.p90`` etc.; other
    dicts (reasons, refusals, whose keys vary) become JSON strings."""
    out: dict[str, Any] = {}
    for k, v in summary.items():
        if k in _ROW_KEYS:
            continue
        if isinstance(v, dict) and v and set(v) <= _PCT_KEYS:
            for c, x in v.items():
                out[f"{k}.{c}"] = x
        elif isinstance(v, (dict, list)):
            out[k] = json.dumps(v, sort_keys=True)
        else:
            out[k] = v
    return out


def run_point(task: dict) -> dict:
    """Simulate one point (in a worker process). Never raises: failures come back as data."""
    from sim.engine.cluster import simulate

    t0 = time.perf_counter()
    try:
        sc = scenario_from_dict(task["scenario"], base_dir=task["base_dir"])
        budget = task.get("budget")
        summary = simulate(sc, budget=RunBudget(**budget) if budget else None).summary
        return {"status": "ok", "error": None, "metrics": flatten_summary(summary), "wall_s": time.perf_counter() - t0}
    except Exception as exc:  # a point's failure is a result, not a crash of the sweep
        return {
            "status": "failed",
            "error": f"{type(exc).__name__}: {exc}",
            "metrics": {},
            "wall_s": time.perf_counter() - t0,
        }


def process_pool(workers: int, start_method: str | None = None) -> WorkerPool:
    """A pool whose workers die with this process, however it ends
    (:mod:`sim.analysis.worker_lifetime`). By default they start fresh (forkserver, else spawn: no
    fork of a parent that may hold threads or a bar); ``start_method="fork"`` is for a caller
    that knows it holds no threads yet and wants workers with its imports already loaded."""
    from sim.analysis.worker_lifetime import WorkerPool, init_worker

    methods = multiprocessing.get_all_start_methods()
    if start_method is None:
        start_method = "forkserver" if "forkserver" in methods else "spawn"
    ctx = multiprocessing.get_context(start_method)
    return WorkerPool(max_workers=workers, mp_context=ctx, initializer=init_worker, initargs=(os.getpid(),))


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


# --- the dataset ----------------------------------------------------------------------


def _arrow_type(labels: Iterable[Any]) -> pa.DataType:
    labels = list(labels)
    if all(isinstance(v, bool) for v in labels):
        return pa.bool_()
    if all(isinstance(v, int) and not isinstance(v, bool) for v in labels):
        return pa.int64()
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in labels):
        return pa.float64()
    return pa.string()


def _cast_label(v: Any, t: pa.DataType) -> Any:
    if v is None:
        return None
    if t == pa.string():
        return v if isinstance(v, str) else json.dumps(v) if isinstance(v, (dict, list)) else str(v)
    if t == pa.float64():
        return float(v)
    return v


def _row_table(point: Point, result: dict, axis_types: dict[str, pa.DataType]) -> pa.Table:
    cols: dict[str, pa.Array] = {
        "point": pa.array([point.index], pa.int64()),
        "point_id": pa.array([point.point_id], pa.string()),
        "status": pa.array([result["status"]], pa.string()),
        "error": pa.array([result["error"]], pa.string()),
        "seed": pa.array([point.seed], pa.int64()),
    }
    for key, t in axis_types.items():
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


def _write_atomic(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def part_path(out: Path, pid: str) -> Path:
    return out / f"part-{pid}.parquet"


def existing_status(out: Path) -> dict[str, str]:
    """point id → status of every point already in the dataset at ``out``."""
    found: dict[str, str] = {}
    for f in sorted(out.glob("part-*.parquet")):
        try:
            t = pq.read_table(f, columns=["point_id", "status"])
        except Exception:  # an unreadable file is a point to run again
            continue
        for pid, st in zip(t.column("point_id").to_pylist(), t.column("status").to_pylist()):
            found[pid] = st
    return found


def read_dataset(out: str | Path, all_points: bool = False) -> pa.Table:
    """The sweep dataset at ``out`` as one table (one row per point, sorted by point index).

    Files are unified by column name (a failed point has no metric columns: nulls there).
    By default only the points of the sweep last run into ``out`` are returned.
    """
    out = Path(out)
    files = sorted(out.glob("part-*.parquet"))
    if not files:
        return pa.table({c: pa.array([], pa.string()) for c in ("point_id", "status", "error")})
    tables = [pq.read_table(f) for f in files]
    table = pa.concat_tables(tables, promote_options="permissive")
    meta = out / META_FILE
    if not all_points and meta.is_file():
        keep = set(json.loads(meta.read_text()).get("point_ids", []))
        mask = pa.array([pid in keep for pid in table.column("point_id").to_pylist()])
        table = table.filter(mask)
    if "point" in table.column_names:
        table = table.sort_by([("point", "ascending")])
    return table


# --- the sweep ------------------------------------------------------------------------


@dataclass
class SweepResult:
    out: Path
    name: str
    #: Distinct points in the sweep.
    total: int
    #: Points already ``ok`` in the dataset, not run again.
    skipped: int
    #: Points simulated by this call.
    ran: int
    #: Points whose scenario failed validation (recorded failed without running).
    invalid: int
    #: ``{"point_id", "params", "error"}`` of every point that failed in this call.
    failures: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    axes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def table(self) -> pa.Table:
        return read_dataset(self.out)


ProgressHook = Callable[[int, int, int], None]


def run_sweep(
    sweep_path: str | Path,
    workers: int | None = None,
    backend: str = "local",
    address: str | None = None,
    out: str | Path | None = None,
    progress: bool | ProgressHook = True,
    budget: RunBudget | None = None,
) -> SweepResult:
    """Run every point of a sweep file not already ``ok`` in the dataset at ``out``.

    ``workers``: parallel processes (default: the CPU cores available). ``backend``: ``local``
    (process pool) or ``ray`` (``ray.init()`` locally, or ``ray.init(address)`` for a cluster,
    whose nodes need kvsim installed and trace files at the same paths). ``out``: dataset
    directory (default ``sweeps/<sweep name>``). ``progress``: a rich bar on stderr, ``False``,
    or a callable ``(done, total, failed)``. ``budget``: limits of each point's run
    (:mod:`sim.engine.budget`; a point past it is recorded failed). Bad sweep files raise
    :class:`ConfigError` before any point runs.
    """
    t0 = time.perf_counter()
    if backend not in ("local", "ray"):
        raise ConfigError("--backend", backend, "local or ray")
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise ConfigError("--workers", workers, f"an integer in [1, {MAX_WORKERS}]")
    if address is not None and backend != "ray":
        raise ConfigError("--address", address, "only with --backend ray")
    spec = load_sweep(sweep_path)
    points = spec.points()
    out = out_dir(out if out is not None else Path("sweeps") / spec.name)
    for stale in out.glob(".part-*.tmp"):  # left by a killed run; never a finished point
        stale.unlink(missing_ok=True)
    axis_types = {a.key: _arrow_type(a.labels) for a in spec.axes}
    meta = (
        json.dumps(
            {
                "name": spec.name,
                "sweep_file": str(Path(sweep_path).resolve()),
                "base": spec.base,
                "axes": [a.key for a in spec.axes],
                "seeds": spec.seeds,
                "points": len(points),
                "point_ids": [p.point_id for p in points],
            },
            indent=1,
        )
        + "\n"
    )
    replace_file(out / META_FILE, lambda path: path.write_text(meta))

    done_before = existing_status(out)
    todo = [p for p in points if done_before.get(p.point_id) != "ok"]
    skipped = len(points) - len(todo)
    invalid = [p for p in todo if p.scenario is None]
    runnable = [p for p in todo if p.scenario is not None]
    failures: list[dict] = []

    def record(point: Point, result: dict) -> None:
        _write_atomic(_row_table(point, result, axis_types), part_path(out, point.point_id))
        if result["status"] != "ok":
            failures.append({"point_id": point.point_id, "params": point.params, "error": result["error"]})

    for p in invalid:
        record(p, {"status": "failed", "error": p.error, "metrics": {}, "wall_s": 0.0})

    n_workers = workers or default_workers()
    with _Progress(progress, spec.name, len(todo)) as bar:
        bar.update(len(invalid), len(failures))
        if runnable:
            run = _run_ray if backend == "ray" else _run_local

            def on_result(p: Point, r: dict) -> None:
                record(p, r)
                bar.update(1, len(failures))

            run(runnable, n_workers, address, on_result, budget)
    return SweepResult(
        out,
        spec.name,
        len(points),
        skipped,
        len(runnable),
        len(invalid),
        failures,
        time.perf_counter() - t0,
        [a.key for a in spec.axes],
    )


def _task(p: Point, budget: RunBudget | None = None) -> dict:
    return {
        "point_id": p.point_id,
        "scenario": p.scenario,
        "base_dir": p.base_dir,
        "budget": None if budget is None else budget.__dict__,
    }


def _run_local(points: list[Point], workers: int, address, on_result, budget: RunBudget | None = None) -> None:
    pool = process_pool(min(workers, len(points)))
    try:
        futures = {pool.submit(run_point, _task(p, budget)): p for p in points}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                try:
                    result = fut.result()
                except Exception as exc:  # the worker process died (killed, out of memory)
                    result = {
                        "status": "failed",
                        "error": f"worker died: {type(exc).__name__}: {exc}",
                        "metrics": {},
                        "wall_s": None,
                    }
                on_result(futures[fut], result)
    except BaseException:
        # Ctrl-C or SIGTERM: kill the workers and drop queued points now; finished ones are on disk.
        pool.stop()
        raise
    pool.shutdown(wait=True)


def _run_ray(
    points: list[Point], workers: int, address: str | None, on_result, budget: RunBudget | None = None
) -> None:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("--backend", "ray", "needs ray installed: pip install 'kvsim[cluster]'") from exc
    started = False
    if not ray.is_initialized():
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if address:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
        started = True
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_point)
        refs = {remote.remote(_task(p, budget)): p for p in points}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    result = ray.get(ref)
                except Exception as exc:  # a worker or node died
                    result = {
                        "status": "failed",
                        "error": f"ray task failed: {type(exc).__name__}: {exc}",
                        "metrics": {},
                        "wall_s": None,
                    }
                on_result(refs[ref], result)
    finally:
        if started:
            ray.shutdown()


class _Progress:
    """A rich progress bar with ETA on stderr, a user callback, or nothing."""

    def __init__(self, progress: bool | ProgressHook, name: str, total: int):
        self.hook = progress if callable(progress) else None
        self.total = total
        self.done = 0
        self.bar = None
        if progress is True:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn(f"sweep {name}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("points, {task.fields[failed]} failed"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
            )
            self.task = self.bar.add_task("sweep", total=total, failed=0)

    def __enter__(self):
        if self.bar is not None:
            self.bar.start()
        return self

    def update(self, advance: int, failed: int) -> None:
        self.done += advance
        if self.bar is not None:
            self.bar.update(self.task, advance=advance, failed=failed)
        if self.hook is not None:
            self.hook(self.done, self.total, failed)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False


def describe_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "(base scenario)"


__all__ = [
    "Axis",
    "Point",
    "SweepSpec",
    "SweepResult",
    "load_sweep",
    "run_sweep",
    "read_dataset",
    "run_point",
    "flatten_summary",
    "point_id",
    "check_key_path",
    "process_pool",
    "default_workers",
]
