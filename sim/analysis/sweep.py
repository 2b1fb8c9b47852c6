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
    slo:                           # optional: each point's attainment of this SLO (slo.* columns)
      ttft_p90_s: 0.5
      tpot_p90_s: 0.05
    step_breakdown: true           # optional: each point's iteration time by part (step_s.*, step_share.*)

Points = product(grid axes, each zip group) × seeds. An axis is a list of values, or a
mapping ``label: value`` (the label is what the dataset column holds; use it for whole
sections such as ``workload.lengths``). For a list axis the column holds the value the point's
scenario ran with (the validated config value: ``1.0e2`` or ``"8"`` for a rate is the number
100.0 or 8.0), so a column is typed by its config field. Values of an axis (value tuples of a
zip group) must be distinct, and so must the scenarios they resolve to: ``[4, 4.0]``, labels
``{a: 4, b: 4.0}``, or ``[8, "8"]`` are refused, naming the axis and the values.

Validation happens before any point runs: the file's structure, every axis key path
(unknown keys fail the sweep), then every point's scenario, and then each ``allocator.*`` axis:
one that the allocator of no point reads (``allocator.block_size`` of ``static`` without
``overflow: fallback``), or each ``workload.arrival.*`` axis that the arrival kind of no point reads
(``workload.arrival.rate`` of ``closed_loop``), fails the sweep, since its values would all give the
same run. A point whose scenario is
invalid for its *values* (a block size of 0, a model that does not fit the GPU) is recorded
as ``failed`` with its error, without running, and the sweep exits non-zero after the valid
points finish: a sweep that maps a feasible region should not abort on its infeasible corner.

Each point runs in its own process (a ``spawn``/``forkserver`` process pool, or a Ray task) and
is written as one Parquet file ``part-<point id>.parquet`` as soon as it finishes (written to a
hidden temporary name, then renamed, so a kill never leaves a partial file). A pool worker that
dies (out of memory, ``kill -9``, a native crash) fails only the point it ran, and only once that
point, run again alone, kills its worker again; the points beside it run in a fresh pool
(:func:`run_points_locally`). The point id is a hash of the resolved scenario (every key,
defaults filled) and of the keys it sets (:func:`point_id`), so it is stable across runs and
machines and independent of how the sweep file spells the point. The worker gets the keys set,
not a full dump (:func:`canonical_scenario`): which keys are set changes a run, so a point runs
exactly as ``kvsim run`` of its overrides.

Rerunning into the same folder (:func:`run_sweep`) makes the dataset describe exactly the
current sweep file's points: a point already ``ok`` there is reused only when its id is that
of a point of the new expansion (the same resolved scenario), and its row is rewritten with the
new expansion's point index, seed and axis columns (metrics kept); failed points are run again;
rows of points no longer in the sweep leave the dataset (finished ones move to ``_dropped/``,
which pyarrow's dataset readers skip, and come back without running if the sweep lists them
again; failed ones are deleted).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from sim.analysis.slo import SLO, slo_columns, slo_from_mapping
from sim.config import (
    AllocatorConfig,
    ArrivalConfig,
    Scenario,
    apply_overrides,
    check_key_path,
    check_name,
    read_scenario_dict,
    scenario_from_dict,
    set_keys,
)
from sim.engine.budget import RunBudget
from sim.errors import ConfigError, quote
from sim.inputs import is_file, load_json, load_yaml, read_text
from sim.limits import MAX_SEED, MAX_SWEEP_POINTS, MAX_SWEEP_SEEDS, MAX_WORKERS
from sim.output.results import replace_file, user_files
from sim.output.staging import out_dir

if TYPE_CHECKING:
    from sim.analysis.worker_lifetime import WorkerPool

SWEEP_KEYS = ("name", "description", "base", "set", "grid", "zip", "seeds", "slo", "step_breakdown")
META_FILE = "_sweep.json"
#: Finished points of earlier sweeps into the folder that the current sweep file no longer has.
DROPPED_DIR = "_dropped"
#: Metric columns are the run summary flattened; these keys are already columns of the row.
_ROW_KEYS = ("point", "point_id", "status", "error", "seed", "wall_s")
#: A summary dict of these keys only is a distribution: one column each (``client_wait_s`` adds ``max``).
_PCT_KEYS = {"p50", "p90", "p99", "mean", "max"}


# --- the sweep file -------------------------------------------------------------------


@dataclass(frozen=True)
class Axis:
    """One swept scenario key: ``values`` go into the scenario, ``labels`` into the dataset."""

    key: str
    values: tuple
    labels: tuple
    #: Given as a mapping ``label: value``: the dataset column holds the labels, not the values.
    mapped: bool = False


@dataclass
class Point:
    index: int
    point_id: str
    #: ``None`` for an invalid point whose seed is not an integer the dataset can hold.
    seed: int | None
    #: Dataset column → what this point takes: the label of a mapping axis; for a list axis the
    #: validated config value the scenario runs with (the value as given for an invalid point;
    #: JSON text for a mapping or list value).
    params: dict[str, Any]
    #: :func:`canonical_scenario` of the resolved scenario (what the worker validates again);
    #: ``None`` when invalid.
    scenario: dict | None
    base_dir: str
    error: str | None = None
    #: The sweep's SLO (:meth:`SLO.as_dict`), judged on the point's requests; ``None`` without one.
    slo: dict | None = None
    #: Split the point's iteration time by part (``step_s.*`` / ``step_share.*`` columns).
    step_breakdown: bool = False


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
    #: Each point's requests are judged against it (``slo.*`` columns); ``None``: the sweep has none.
    slo: SLO | None = None
    #: Each point's iteration time split by part (:mod:`sim.cost.breakdown`; its points run in
    #: ``engine.mode: step``).
    step_breakdown: bool = False

    @property
    def axes(self) -> list[Axis]:
        return [a for g in self.groups for a in g]

    def points(self) -> list[Point]:
        """Every point with its scenario validated (invalid ones carry their error). An
        ``allocator.*`` axis that the allocator of no valid point reads, or a ``workload.arrival.*``
        axis that the arrival kind of none reads, raises :class:`ConfigError`
        (:func:`check_sweep_axes`)."""

        base = apply_overrides(self.base_data, self.fixed)
        base_seed = base.get("seed", 0)
        if self.seeds is not None and not isinstance(base_seed, int):
            raise ConfigError("seed", base_seed, "an integer (seeds: N replicates base seed + i)")
        seed_values = [None] if self.seeds is None else [base_seed + i for i in range(self.seeds)]
        out: list[Point] = []
        #: point id → the value index of each group that gave it.
        seen: dict[str, tuple[int, ...]] = {}
        allocators: list[AllocatorConfig] = []
        arrivals: list[ArrivalConfig] = []
        for combo in itertools.product(*(range(len(g[0].values)) for g in self.groups)):
            for seed in seed_values:
                overrides: dict[str, Any] = {}
                for g, i in zip(self.groups, combo):
                    for ax in g:
                        overrides[ax.key] = ax.values[i]
                if seed is not None:
                    overrides["seed"] = seed
                data = apply_overrides(base, overrides)
                try:
                    sc = scenario_from_dict(data, base_dir=self.base_dir)
                    _check_fits(sc)
                except ConfigError as exc:
                    params = {ax.key: ax.labels[i] for g, i in zip(self.groups, combo) for ax in g}
                    pseed = data.get("seed", 0)
                    pseed = pseed if _fits_int64(pseed) else None
                    error = f"ConfigError: {exc}"
                    point = Point(len(out), json_digest(data), pseed, params, None, str(self.base_dir), error)
                else:
                    allocators.append(sc.allocator)
                    arrivals.append(sc.workload.arrival)
                    dump = canonical_scenario(sc)
                    params = {ax.key: _ran_with(ax, i, dump) for g, i in zip(self.groups, combo) for ax in g}
                    slo = self.slo.as_dict() if self.slo is not None else None
                    pid = point_id(sc, slo, self.step_breakdown)
                    point = Point(
                        len(out),
                        pid,
                        sc.seed,
                        params,
                        dump,
                        str(self.base_dir),
                        slo=slo,
                        step_breakdown=self.step_breakdown,
                    )
                if point.point_id in seen:
                    # Two spellings of one scenario ([8, "8"], gpu names that alias): one point run
                    # twice under two labels, or silently once. Distinct values are asked for.
                    raise _same_scenario(self.groups, seen[point.point_id], combo, point.scenario or {})
                seen[point.point_id] = combo
                out.append(point)
        # An axis the allocator (arrival kind) ignores everywhere would run one scenario per value.
        check_sweep_axes({a.key: a.values for a in self.axes}, allocators, arrivals)
        return out


def _fits_int64(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63


def _at(data: Any, key: str) -> Any:
    """``data[a][b]...`` for the dotted ``key`` ``a.b...``; ``KeyError`` where a part is missing."""
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            raise KeyError(key)
        data = data[part]
    return data


def _ran_with(ax: Axis, i: int, dump: dict) -> Any:
    """The dataset value of value ``i`` of ``ax`` at a valid point: a mapping axis's label, else
    the validated config value at the key (the number ``100.0`` for a rate given as ``1.0e2``);
    a section (or a value the config turns into one) keeps the spelling given, as JSON text."""
    if ax.mapped:
        return ax.labels[i]
    try:
        value = _at(dump, ax.key)
    except KeyError:
        return ax.labels[i]
    if isinstance(value, (dict, list)) or isinstance(ax.values[i], (dict, list)):
        return ax.labels[i]
    return value


def _same_scenario(groups: list[list[Axis]], a: tuple[int, ...], b: tuple[int, ...], dump: dict) -> ConfigError:
    """The error for two value combinations ``a`` and ``b`` (indices per group) that resolve to one scenario."""
    for g, i, j in zip(groups, a, b):
        if i == j:
            continue
        # In a zip group, the axis whose two values differ (rate [4, 4] beside max_num_seqs [16, "16"]).
        differ = [ax for ax in g if _same_key(ax.values[i]) != _same_key(ax.values[j])]
        for ax in differ or g:
            if ax.mapped:
                shown: Any = {ax.labels[i]: ax.values[i], ax.labels[j]: ax.values[j]}
                what = f"labels {ax.labels[i]} and {ax.labels[j]}"
            else:
                shown = [ax.values[i], ax.values[j]]
                what = f"{quote(ax.values[i])} and {quote(ax.values[j])}"
            try:
                ran = f" both run as {quote(_at(dump, ax.key))}"
            except KeyError:
                ran = " give the same scenario"
            return ConfigError(
                f"sweep axis {ax.key}",
                shown,
                f"values that give distinct scenarios; {what}{ran} (list the value once)",
            )
    return ConfigError("sweep", None, "points with distinct scenarios")  # unreachable: combos differ


def _check_fits(sc: Scenario) -> None:
    """The deployment checks that need no workload: the model fits the GPU, max_model_len fits."""
    from sim.engine.deployment import Deployment

    # A pNN reservation needs the workload's lengths; it is checked when the point runs.
    Deployment.from_scenario(sc, lambda q: 1)


def canonical_scenario(sc: Scenario) -> dict:
    """The resolved scenario as JSON-able data that a worker validates back into a scenario that runs
    as ``sc``: the keys it sets at every depth (:func:`sim.config.set_keys`; ``base_dir`` is not a
    key, the task carries it). Not a full dump: every key of one counts as set, and a run depends on
    which keys are set (the serving engine fills only the scheduler and client keys left unset;
    ``num_requests`` caps a ``duration_s`` workload only where given)."""
    return set_keys(sc)


def point_id(sc: Scenario, slo: dict | None = None, step_breakdown: bool = False) -> str:
    """Stable id of a scenario: 16 hex digits of the SHA-256 of the canonical JSON of its resolved
    values (every key, defaults filled) together with the keys it sets (:func:`canonical_scenario`)
    and, where it names files of the user's (a trace, a terms file, a model's config, a profile;
    :func:`sim.output.results.user_files`), their contents' SHA-256. Points that differ in a value,
    in whether a key is set or in what a named file holds get different ids: a sweep rerun after such
    a file was edited runs those points again instead of reusing what the old file gave. A dataset
    whose ids hash the resolved values alone (as older kvsim releases wrote them) shares no id with
    these: a sweep rerun into it runs every point again and moves its rows to ``_dropped/``.

    ``slo`` (:meth:`SLO.as_dict`), where the sweep judges its points against one, is hashed too: the
    dataset keeps each point's SLO figures, not its requests, so another SLO runs the point again;
    so is ``step_breakdown`` where it is on (a point without the split's columns is not reused for it)."""
    data: dict[str, Any] = {"resolved": sc.model_dump(mode="json"), "set": canonical_scenario(sc)}
    if slo is not None:  # only then: a sweep without one keeps the ids it always had
        data["slo"] = slo
    if step_breakdown:
        data["step_breakdown"] = True
    files = {key: _file_digest(path) for key, path in user_files(sc).items()}
    if files:  # only then: a scenario naming none has the same id in datasets whose ids leave files out
        data["files"] = files
    return json_digest(data)


_DIGESTS: dict[tuple[str, int, int], str] = {}


def _file_digest(path: Path) -> str:
    """SHA-256 of ``path``'s bytes, remembered per (resolved path, size, mtime): every point of a
    sweep names the same trace."""
    try:
        st = path.stat()
    except OSError:
        return "missing"  # the point fails when it runs, naming the file
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def json_digest(data: dict) -> str:
    """16 hex digits of the SHA-256 of ``data`` as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _axis(key: str, spec: Any, where: str) -> Axis:
    check_key_path(key, where, spec)
    if isinstance(spec, dict):
        if not spec:
            raise ConfigError(f"{where} {key}", spec, "a non-empty list of values (or mapping label: value)")
        labels = tuple(str(k) for k in spec)
        values = tuple(spec.values())
        if len(set(labels)) < len(labels):  # {4: x, "4": y}: two labels that read the same
            dup = next(lab for lab in labels if labels.count(lab) > 1)
            raise ConfigError(f"{where} {key}", spec, f"distinct labels; {dup} is given twice")
        return Axis(key, values, labels, mapped=True)
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


def _same_key(v: Any) -> Any:
    """A hashable stand-in for ``v`` equal for values YAML spells differently but that are the
    same value (``4`` and ``4.0``; mappings whatever their key order) and not for ``true`` and ``1``."""
    if isinstance(v, bool) or v is None:
        return ("bool", v)
    if isinstance(v, (int, float)):
        return ("num", v)  # 4 == 4.0 and hash(4) == hash(4.0)
    if isinstance(v, str):
        return ("str", v)
    if isinstance(v, dict):
        return ("map", frozenset((repr(k), _same_key(x)) for k, x in v.items()))
    if isinstance(v, list):
        return ("list", tuple(_same_key(x) for x in v))
    return ("other", repr(v))


def _check_distinct(axes: list[Axis], where: str) -> None:
    """Refuse a value (a value tuple of a zip group) given twice: the expansion would run one
    scenario under two labels, or merge them silently."""
    first: dict[Any, int] = {}
    for i in range(len(axes[0].values)):
        k = tuple(_same_key(ax.values[i]) for ax in axes)
        if k not in first:
            first[k] = i
            continue
        j = first[k]
        if len(axes) == 1:
            ax = axes[0]
            if ax.mapped:
                raise ConfigError(
                    f"{where} {ax.key}",
                    dict(zip(ax.labels, ax.values)),
                    f"distinct values; labels {ax.labels[j]} and {ax.labels[i]} both give {quote(ax.values[i])} "
                    "(keep one label)",
                )
            dups = [v for v in ax.values if _same_key(v) == k[0]]
            raise ConfigError(
                f"{where} {ax.key}",
                list(ax.values),
                f"distinct values; {', '.join(map(quote, dups))} {'is' if len(dups) == 1 else 'are'} one value "
                "(list it once)",
            )
        pair = tuple(ax.values[i] for ax in axes)
        raise ConfigError(
            f"{where} {', '.join(ax.key for ax in axes)}",
            [list(t) for t in zip(*(ax.values for ax in axes))],
            f"distinct value tuples; tuples {j + 1} and {i + 1} are both {quote(pair)} (list it once)",
        )


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
        _check_distinct(groups[-1], "grid")
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
        _check_distinct(axes, "zip")
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
    slo = slo_from_mapping(data["slo"]) if data.get("slo") is not None else None
    breakdown = data.get("step_breakdown", False)
    if not isinstance(breakdown, bool):
        raise ConfigError("step_breakdown", breakdown, "true or false (split each point's iteration time by part)")
    if breakdown:
        given = fixed.get("engine.mode", "step")
        modes = next((a.values for g in groups for a in g if a.key == "engine.mode"), (given,))
        if any(m != "step" for m in modes) or "engine" in keys:
            raise ConfigError(
                "step_breakdown",
                True,
                "points in engine.mode step, which it sets (each iteration priced on its own; the same "
                "results as fast_forward): leave engine.mode and the engine section out of set, grid and zip",
            )
        fixed["engine.mode"] = "step"
    return SweepSpec(p, str(name), base, base_data, Path(base_dir), dict(fixed), groups, seeds, slo, breakdown)


# --- running a point ------------------------------------------------------------------


def flatten_summary(summary: dict) -> dict[str, Any]:
    """Run summary → flat metric columns: percentile dicts become ``ttft_s.p90`` etc.; a step-time
    breakdown ``step_s.<part>`` (seconds; ``step_s.busy`` all of them) and ``step_share.<part>``;
    other dicts (reasons, refusals, whose keys vary) become JSON strings."""
    out: dict[str, Any] = {}
    for k, v in summary.items():
        if k in _ROW_KEYS:
            continue
        if k == "step_time_breakdown":
            # Numbers to plot, not a JSON text: seconds and share of the busy time per part.
            out["step_s.busy"] = v["busy_s"]
            out.update({f"step_s.{part}": x for part, x in v["seconds"].items()})
            out.update({f"step_share.{part}": x for part, x in v["share"].items()})
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
        breakdown = bool(task.get("step_breakdown"))
        result = simulate(sc, budget=RunBudget(**budget) if budget else None, step_breakdown=breakdown)
        metrics = flatten_summary(result.summary)
        if task.get("slo") is not None:
            metrics.update(slo_columns(result.requests, SLO(**task["slo"])))
        return {"status": "ok", "error": None, "metrics": metrics, "wall_s": time.perf_counter() - t0}
    except Exception as exc:  # a point's failure is a result, not a crash of the sweep
        return {
            "status": "failed",
            "error": f"{type(exc).__name__}: {exc}",
            "metrics": {},
            "wall_s": time.perf_counter() - t0,
        }


def _lost(what: str, exc: Exception) -> dict:
    """A point's result when the process running it died: failed, with no time measured."""
    return {"status": "failed", "error": f"{what}: {type(exc).__name__}: {exc}", "metrics": {}, "wall_s": None}


def process_pool(
    workers: int, start_method: str | None = None, initializer: Callable[[int], None] | None = None
) -> WorkerPool:
    """A pool whose workers die with this process, however it ends
    (:mod:`sim.analysis.worker_lifetime`). By default they start fresh (forkserver, else spawn: no
    fork of a parent that may hold threads or a bar); ``start_method="fork"`` is for a caller
    that knows it holds no threads yet and wants workers with its imports already loaded.
    ``initializer``: called with this process's id in each worker; it must do what
    :func:`~sim.analysis.worker_lifetime.init_worker` does (the default)."""
    from sim.analysis.worker_lifetime import WorkerPool, init_worker

    methods = multiprocessing.get_all_start_methods()
    if start_method is None:
        start_method = "forkserver" if "forkserver" in methods else "spawn"
    ctx = multiprocessing.get_context(start_method)
    return WorkerPool(
        max_workers=workers, mp_context=ctx, initializer=initializer or init_worker, initargs=(os.getpid(),)
    )


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


# --- the dataset ----------------------------------------------------------------------


def _arrow_type(labels: Iterable[Any]) -> pa.DataType:
    """The column type of these values (``None`` and integers past int64, which no column type
    but text holds, left out: they are recorded as null)."""
    labels = [v for v in labels if v is not None and not (isinstance(v, int) and not _fits_int64(v))]
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
        if ax.key in _ROW_KEYS:  # a seed axis: the row's own seed column holds it
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
    return v if _fits_int64(v) else None


def _row_table(point: Point, result: dict, axis_types: dict[str, pa.DataType]) -> pa.Table:
    cols: dict[str, pa.Array] = {
        "point": pa.array([point.index], pa.int64()),
        "point_id": pa.array([point.point_id], pa.string()),
        "status": pa.array([result["status"]], pa.string()),
        "error": pa.array([result["error"]], pa.string()),
        "seed": pa.array([point.seed if _fits_int64(point.seed) else None], pa.int64()),
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


def _relabelled(old: pa.Table, point: Point, axis_types: dict[str, pa.DataType]) -> pa.Table:
    """The finished row ``old`` (of this point's scenario, possibly written by another sweep file)
    as this sweep writes it: its index, seed and axis columns; status, error, wall time and
    metrics kept. A row's metric columns are those after ``wall_s`` (:func:`_row_table`)."""
    row = old.slice(0, 1).to_pylist()[0]
    result = {"status": row.get("status"), "error": row.get("error"), "wall_s": row.get("wall_s"), "metrics": {}}
    new = _row_table(point, result, axis_types)
    names = old.column_names
    metrics = names[names.index("wall_s") + 1 :] if "wall_s" in names else []
    for name in metrics:
        if name not in new.column_names:
            new = new.append_column(old.schema.field(name), old.column(name).slice(0, 1))
    return new


def _write_atomic(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def part_path(out: Path, pid: str) -> Path:
    return out / f"part-{pid}.parquet"


def _parts(folder: Path) -> dict[str, tuple[str, Path]]:
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


# --- the sweep ------------------------------------------------------------------------


@dataclass
class SweepResult:
    out: Path
    name: str
    #: Distinct points in the sweep.
    total: int
    #: Points already ``ok`` in the dataset (or kept in ``_dropped/``), reused without running.
    skipped: int
    #: Points simulated by this call.
    ran: int
    #: Points whose scenario failed validation (recorded failed without running).
    invalid: int
    #: ``{"point_id", "params", "error"}`` of every point that failed in this call.
    failures: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    axes: list[str] = field(default_factory=list)
    #: Of the reused points, those whose row was rewritten for this sweep file (its index, seed or
    #: axis columns had changed with the file).
    relabelled: int = 0
    #: Points in the dataset before this call that the sweep file no longer has, removed from it.
    dropped: int = 0
    #: Of the dropped points, the finished ones, moved to ``out/_dropped/``.
    kept_apart: int = 0
    #: The SLO the points were judged against (:meth:`SLO.describe`), or ``None``.
    slo_text: str | None = None

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
    (process pool) or ``ray`` (a local Ray of its own, or ``ray.init(address)`` for a cluster,
    whose nodes need kvsim installed and trace files at the same paths; Ray is connected to
    before anything in ``out`` changes, and an address where no Ray answers raises
    :class:`ConfigError` within about 20 s). ``out``: dataset directory (default
    ``sweeps/<sweep name>``). ``progress``: ``True`` shows it on stderr (a bar on a terminal, plain
    lines in a log: :mod:`sim.output.progress`), ``False`` nothing, a callable ``(done, total,
    failed)`` is called instead (once before any point runs, then as each finishes). ``budget``:
    limits of each point's run (:mod:`sim.engine.budget`; a point past it is recorded failed). Bad
    sweep files raise :class:`ConfigError` before any point runs.
    """
    t0 = time.perf_counter()
    if backend not in ("local", "ray"):
        raise ConfigError("--backend", backend, "local or ray")
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise ConfigError("--workers", workers, f"an integer in [1, {MAX_WORKERS}]")
    if address is not None and backend != "ray":
        raise ConfigError("--address", address, "only with --backend ray")
    if address is not None and not address.strip():
        raise ConfigError("--address", address, "a Ray cluster's address (host:port, or ray://host:port)")
    spec = load_sweep(sweep_path)
    points = spec.points()
    out_given = Path(out if out is not None else Path("sweeps") / spec.name)
    made = [d for d in (out_given, *out_given.parents) if not os.path.lexists(d)]  # what out_dir makes
    out = out_dir(out_given)
    ray_session = _RaySession(address, workers or default_workers()) if backend == "ray" else None
    if ray_session is not None and _runs_any(out, points):
        # Before anything in the folder changes: a bad --address (or a Ray that cannot start)
        # fails here with one line and leaves the dataset as it was.
        try:
            ray_session.connect()
        except BaseException:
            for d in made:  # made just now by out_dir, and still empty
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise
    try:
        return _sweep_into(out, sweep_path, spec, points, t0, workers, ray_session, progress, budget)
    finally:
        if ray_session is not None:
            ray_session.close()


def _sweep_into(
    out: Path,
    sweep_path: str | Path,
    spec: SweepSpec,
    points: list[Point],
    t0: float,
    workers: int | None,
    ray_session: _RaySession | None,
    progress: bool | ProgressHook,
    budget: RunBudget | None,
) -> SweepResult:
    """The body of :func:`run_sweep` once the folder and the backend are ready."""
    for stale in out.glob(".part-*.tmp"):  # left by a killed run; never a finished point
        stale.unlink(missing_ok=True)
    types = axis_types(spec.axes, points)
    meta = (
        json.dumps(
            {
                "name": spec.name,
                "sweep_file": str(Path(sweep_path).resolve()),
                "base": spec.base,
                "axes": [a.key for a in spec.axes],
                # Paired axes (each zip group of two or more): the report draws them as one axis.
                "zip": [[a.key for a in g] for g in spec.groups if len(g) > 1],
                "seeds": spec.seeds,
                "slo": spec.slo.as_dict() if spec.slo is not None else None,
                "step_breakdown": spec.step_breakdown,
                "points": len(points),
                "point_ids": [p.point_id for p in points],
            },
            indent=1,
        )
        + "\n"
    )
    # Written first: a run killed while it reconciles the folder below leaves a dataset that
    # read_dataset already narrows to this file's points; the rerun finishes the job.
    replace_file(out / META_FILE, lambda path: path.write_text(meta))
    reuse, relabelled, dropped, kept_apart = _reconcile(out, points, types)

    todo = [p for p in points if p.point_id not in reuse]
    skipped = len(points) - len(todo)
    invalid = [p for p in todo if p.scenario is None]
    runnable = [p for p in todo if p.scenario is not None]
    failures: list[dict] = []

    def record(point: Point, result: dict) -> None:
        _write_atomic(_row_table(point, result, types), part_path(out, point.point_id))
        if result["status"] != "ok":
            failures.append({"point_id": point.point_id, "params": point.params, "error": result["error"]})

    for p in invalid:
        record(p, {"status": "failed", "error": p.error, "metrics": {}, "wall_s": 0.0})

    n_workers = workers or default_workers()
    with _Progress(progress, spec.name, len(todo)) as bar:
        bar.update(len(invalid), len(failures))
        if runnable:

            def on_result(p: Point, r: dict) -> None:
                record(p, r)
                bar.update(1, len(failures))

            if ray_session is not None:
                _run_ray(ray_session, runnable, on_result, budget)
            else:
                run_points_locally(runnable, n_workers, None, on_result, budget)
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
        relabelled,
        dropped,
        kept_apart,
        spec.slo.describe() if spec.slo is not None else None,
    )


def _reconcile(out: Path, points: list[Point], types: dict[str, pa.DataType]) -> tuple[set[str], int, int, int]:
    """Make the dataset at ``out`` hold only points of this expansion, before any point runs.

    A finished (``ok``) row whose point id is a point of the expansion (the same resolved
    scenario) is reused: rewritten with this expansion's index, seed and axis columns when they
    differ (another sweep file put it there), taken back from ``_dropped/`` if an earlier sweep
    file had dropped it. Rows of points the expansion does not have leave ``out``: finished ones
    move to ``_dropped/``, failed ones are deleted. Returns (reused point ids, rows rewritten,
    points dropped, points moved to ``_dropped/``)."""
    here = _parts(out)
    apart_dir = out / DROPPED_DIR
    apart = _parts(apart_dir)
    by_id = {p.point_id: p for p in points}
    reuse: set[str] = set()
    relabelled = 0
    for pid, point in by_id.items():
        if point.scenario is None:  # an invalid point is recorded again, never reused
            continue
        src = here.get(pid, ("", None))
        if src[0] != "ok":
            src = apart.get(pid, ("", None))
        status, f = src
        if status != "ok" or f is None:
            continue
        try:
            old = pq.read_table(f)
        except Exception:  # unreadable since it was listed: run the point again
            continue
        new = _relabelled(old, point, types)
        if f.parent != out or not new.equals(old):
            _write_atomic(new, part_path(out, pid))
            relabelled += 1
        if f.parent != out:
            f.unlink(missing_ok=True)
        reuse.add(pid)
    dropped = kept_apart = 0
    for pid, (status, f) in here.items():
        if pid in by_id:
            continue
        dropped += 1
        if status == "ok":
            if not kept_apart:
                out_dir(apart_dir)
            os.replace(f, part_path(apart_dir, pid))
            kept_apart += 1
        else:
            f.unlink(missing_ok=True)
    return reuse, relabelled, dropped, kept_apart


def _task(p: Point, budget: RunBudget | None = None) -> dict:
    return {
        "point_id": p.point_id,
        "scenario": p.scenario,
        "base_dir": p.base_dir,
        "budget": None if budget is None else budget.__dict__,
        "slo": p.slo,
        "step_breakdown": p.step_breakdown,
    }


def run_points_locally(
    points: list[Point],
    workers: int,
    address,
    on_result,
    budget: RunBudget | None = None,
) -> None:
    """Run ``points`` in a process pool of ``workers``, calling ``on_result(point, result)`` as each
    finishes (once per point).

    A worker process that dies (the out-of-memory killer, ``kill -9``, a crash in native code) breaks
    a ``concurrent.futures`` pool: every point still running or queued in it fails with
    ``BrokenProcessPool``. Those points are not recorded; a fresh pool runs them. The point whose worker
    died is told by the workers' exit statuses and the marker each worker keeps of the point it runs
    (:func:`_run_marked`); where that cannot be told (the worker died of SIGTERM, which the pool's own
    clean-up sends the others too), every point then running is suspect. A suspect runs once more, alone
    (no other point running, a pool of its own), after the others: it is recorded failed, with how its
    worker ended, only when it breaks that pool too. Workers run :func:`run_point` (looked up when this
    is called)."""
    fn = run_point
    marks = Path(tempfile.mkdtemp(prefix="kvsim-sweep-"))
    pool: WorkerPool | None = None
    try:
        queue = list(points)
        suspects: list[Point] = []
        fruitless = 0  # pools in a row that broke before any point finished or a suspect was found
        while queue:
            pool = process_pool(min(workers, len(queue)))
            broke = _pool_round(pool, queue, fn, marks, budget, on_result)
            pool = None
            if broke is None:
                break
            unfinished, suspect_ids, how, delivered = broke
            suspects += [p for p in unfinished if p.point_id in suspect_ids]
            queue = [p for p in unfinished if p.point_id not in suspect_ids]
            fruitless = 0 if delivered or suspect_ids else fruitless + 1
            if fruitless >= _MAX_FRUITLESS_BREAKS:
                for p in queue:  # a pool that cannot run anything (workers dying at start)
                    on_result(
                        p, _died(f"{how}; the process pool broke {fruitless} times in a row before any point finished")
                    )
                queue = []
        for p in sorted(suspects, key=lambda p: p.index):
            pool = process_pool(1)
            broke = _pool_round(pool, [p], fn, marks, budget, on_result)
            pool = None
            if broke is not None:
                on_result(p, _died(f"{broke[2]} while running this point, in the pool and again when run alone"))
    except BaseException:
        # Ctrl-C or SIGTERM: kill the workers and drop queued points now; finished ones are on disk.
        if pool is not None:
            pool.stop()
        raise
    finally:
        shutil.rmtree(marks, ignore_errors=True)


#: Pools in a row that may break with no point finished and no point to blame before the points
#: left are recorded failed (workers that die however they start would otherwise loop for ever).
_MAX_FRUITLESS_BREAKS = 3


def _run_marked(fn: Callable[[dict], dict], task: dict, marks: str) -> dict:
    """In a pool worker: ``fn(task)``, with a file ``marks/<this process id>`` naming the task's point
    while it runs, so that the sweep knows which point a worker that died was running."""
    mark = os.path.join(marks, str(os.getpid()))
    with open(mark + ".tmp", "w") as f:
        f.write(task["point_id"])
    os.replace(mark + ".tmp", mark)
    try:
        return fn(task)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(mark)


def _pool_round(
    pool: WorkerPool,
    points: list[Point],
    fn: Callable[[dict], dict],
    marks: Path,
    budget: RunBudget | None,
    on_result,
) -> tuple[list[Point], set[str], str, int] | None:
    """Run ``points`` in ``pool`` (shut down after). ``None`` when every point delivered a result;
    when a worker died, (the points that did not, the ids of those to blame, how the worker ended,
    results delivered)."""
    futures: dict[Future, Point] = {}
    for p in points:
        try:
            futures[pool.submit(_run_marked, fn, _task(p, budget), str(marks))] = p
        except BrokenProcessPool:  # a worker died while the points were being submitted
            break
    pending = set(futures)
    unfinished = points[len(futures) :]
    delivered = 0
    while pending:
        # Once a worker has died, every future not done fails at once: wait for them all.
        done, pending = wait(pending, return_when=ALL_COMPLETED if unfinished else FIRST_COMPLETED)
        for fut in sorted(done, key=lambda f: futures[f].index):
            try:
                result = fut.result()
            except BrokenProcessPool:  # a worker died: every future not done fails alike
                unfinished.append(futures[fut])
                continue
            except Exception as exc:  # the task could not be sent or its result not read back
                result = _lost("worker failed", exc)
            delivered += 1
            on_result(futures[fut], result)
    if not unfinished:
        pool.shutdown(wait=True)
        return None
    procs = dict(getattr(pool, "_processes", None) or {})
    pool.shutdown(wait=True)  # the pool has ended its workers: their exit statuses are known
    exits = {pid: proc.exitcode for pid, proc in procs.items()}
    running: dict[int, str] = {}
    for mark in marks.iterdir():
        with contextlib.suppress(OSError, ValueError):
            if mark.suffix != ".tmp":
                running[int(mark.name)] = mark.read_text()
        mark.unlink(missing_ok=True)
    # The pool ends the workers it did not lose with SIGTERM: any other end is a death.
    dead = {pid: code for pid, code in exits.items() if code is not None and code != -signal.SIGTERM}
    if dead:
        blamed = {running[pid] for pid in dead if pid in running}
        how = _how_it_ended(next(iter(dead.values())))
    else:  # died of SIGTERM, or no status to read: each point then running is suspect
        blamed = set(running.values())
        how = _how_it_ended(-signal.SIGTERM if any(c == -signal.SIGTERM for c in exits.values()) else None)
    unfinished.sort(key=lambda p: p.index)
    return unfinished, blamed & {p.point_id for p in unfinished}, how, delivered


#: What a signal that ends a worker usually means.
_SIGNAL_CAUSES = {
    signal.SIGKILL: "out of memory, or kill -9",
    signal.SIGSEGV: "a segmentation fault",
    signal.SIGBUS: "a bus error",
    signal.SIGABRT: "aborted",
    signal.SIGFPE: "a floating-point exception",
    signal.SIGILL: "an illegal instruction",
    signal.SIGTERM: "terminated",
}


def _how_it_ended(exitcode: int | None) -> str:
    """How a worker process ended, from its exit code (``-N``: signal N), in words."""
    if exitcode is None:
        return "its process ended abruptly"
    if exitcode < 0:
        try:
            sig = signal.Signals(-exitcode)
        except ValueError:
            return f"its process was killed by signal {-exitcode}"
        cause = _SIGNAL_CAUSES.get(sig)
        return f"its process was killed by signal {-exitcode} ({sig.name}{': ' + cause if cause else ''})"
    return f"its process exited with status {exitcode}"


def _died(why: str) -> dict:
    """A point's result when the process running it died: failed, with no time measured."""
    return {"status": "failed", "error": f"worker died: {why}", "metrics": {}, "wall_s": None}


def _runs_any(out: Path, points: list[Point]) -> bool:
    """Whether a sweep into ``out`` has a point to simulate (read-only: the folder is not changed).

    A valid point runs unless it is ``ok`` in ``out`` or in ``out/_dropped/`` (:func:`_reconcile`
    reuses it); invalid points are recorded without running."""
    done = {pid for folder in (out, out / DROPPED_DIR) for pid, (st, _) in _parts(folder).items() if st == "ok"}
    return any(p.scenario is not None and p.point_id not in done for p in points)


#: Ray settings for connecting to ``--address``, unless set in the environment: one attempt
#: (Ray's default is 20, each up to ~40 s, so a wrong address hung for minutes) whose wait for
#: the GCS to answer is 10 s (Ray's default 30 s). Read when ``ray`` is imported (the GCS
#: timeout) and by ``ray.init`` (the attempts).
_RAY_CONNECT_ENV = {"RAY_gcs_server_port_wait_time_s": "1", "RAY_py_gcs_connect_timeout_s": "10"}
#: Seconds to wait for the head's port to accept a TCP connection before asking Ray to connect.
RAY_REACH_TIMEOUT_S = 10.0
_RAY_ADDRESS_NEEDS = (
    "the address of a running Ray cluster's head: host:port of its GCS (port 6379 by default, not the "
    "dashboard's 8265), or ray://host:10001 for Ray Client"
)


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "") or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ray_client_missing() -> str | None:
    """Why Ray Client (``ray://`` addresses) cannot be used here, or ``None``: it needs grpcio,
    which ``pip install 'ray[client]'`` adds (as Ray itself checks)."""
    try:
        import grpc  # noqa: F401
    except ImportError as exc:
        return _first_line(exc)
    return None


def _address_problem(target: str, default_port: int | None) -> str | None:
    """What is wrong with ``target``, a ``host:port`` (``default_port``: the port may be left out),
    or ``None``: an empty host (``:6379``), a missing port, a port that is no TCP port."""
    host, sep, port = target.rpartition(":")
    if not sep:
        return None if default_port is not None else f"no port: host:port, such as {target}:6379"
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):  # an IPv6 address
        host = host[1:-1]
    if not host:
        return f"the host before ':{port}' is empty"
    if not port:
        return f"no port after '{host}:'"
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"{port!r} is not a port (an integer in 1-65535)"
    return None


@contextlib.contextmanager
def _ray_quiet():
    """Ray's Python loggers muted and file descriptor 2 held (:func:`_stderr_held`): Ray logs an
    exception with its traceback before it raises it, which kvsim reports in one line."""
    loggers = [logging.getLogger(name) for name in ("ray", "ray._private.services")]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        with _stderr_held():
            yield
    finally:
        for lg, was in zip(loggers, before):
            lg.disabled = was


def _check_reachable(address: str) -> None:
    """Fail at once (one :class:`ConfigError` naming ``--address``) when the address is malformed or
    nothing can answer at it, instead of Ray's connection retries; an address Ray resolves itself
    (``auto``, a scheme other than ``ray://``) is left to ``ray.init``."""
    if "://" in address:
        scheme, _, rest = address.partition("://")
        if scheme != "ray":
            return
        target = rest.split("/", 1)[0]
        problem = _address_problem(target, 10001)
        if problem is not None:
            raise ConfigError("--address", address, f"{_RAY_ADDRESS_NEEDS}; {problem}")
        missing = _ray_client_missing()
        if missing is not None:
            raise ConfigError(
                "--address",
                address,
                "a ray:// address connects through Ray Client, which needs pip install 'ray[client]' "
                f"(the kvsim cluster extra installs it; here: {missing}); or give the head's GCS "
                "address host:6379 from a machine of the cluster",
            )
        default_port = 10001
    else:
        if address.strip() not in ("auto", "local"):
            problem = _address_problem(address.strip(), None)
            if problem is not None:
                raise ConfigError("--address", address, f"{_RAY_ADDRESS_NEEDS}; {problem}")
        try:
            from ray._private.services import canonicalize_bootstrap_address
        except ImportError:  # another Ray layout: ray.init says what is wrong
            return
        try:
            # As ray.init resolves it: 127.0.0.1 and localhost become this node's address.
            with _ray_quiet():
                target = canonicalize_bootstrap_address(address) or ""
        except Exception as exc:  # "auto" with no cluster, a malformed address
            raise ConfigError("--address", address, f"{_RAY_ADDRESS_NEEDS}; {_first_line(exc)}") from None
        default_port = 6379
    host, sep, port_text = target.rpartition(":")
    if not sep:
        host, port_text = target, str(default_port)
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError("--address", address, f"{_RAY_ADDRESS_NEEDS}; {port_text!r} is not a port") from None
    if not host:
        return
    try:
        socket.create_connection((host, port), timeout=RAY_REACH_TIMEOUT_S).close()
    except (OSError, OverflowError) as exc:
        why = getattr(exc, "strerror", None) or _first_line(exc) or type(exc).__name__
        given = address.split("://", 1)[-1].split("/", 1)[0]
        where = (
            f"{host}:{port}" if given in (f"{host}:{port}", host) else f"{given} (which Ray resolves to {host}:{port})"
        )
        raise ConfigError("--address", address, f"{_RAY_ADDRESS_NEEDS}; nothing answers at {where} ({why})") from None


@contextlib.contextmanager
def _env(values: dict[str, str]):
    """``values`` set in ``os.environ`` where not already set, restored after."""
    added = [k for k in values if k not in os.environ]
    for k in added:
        os.environ[k] = values[k]
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


@contextlib.contextmanager
def _stderr_held():
    """Hold what is written to file descriptor 2 (Ray's C++ log lines included) while connecting:
    written out after a success, dropped after a failure, which is reported in one line."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to hold
        yield
        return
    held = tempfile.TemporaryFile()
    ok = False
    try:
        os.dup2(held.fileno(), 2)
        try:
            yield
            ok = True
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
        if ok:
            held.seek(0)
            text = held.read()
            if text:
                os.write(2, text)
    finally:
        os.close(saved)
        held.close()


class _RaySession:
    """Ray for one sweep: connected (``ray.init``) before the dataset folder is touched, so that a
    bad ``--address`` fails with one line and leaves the dataset as it was; shut down when the sweep
    ends if this session started it.

    ``ray.init`` installs Ray's SIGTERM handler (and its C++ core worker a failure-signal handler
    that dumps a stack and exits 1); the caller's Python handlers of SIGINT and SIGTERM (those of
    :mod:`sim.cli.interrupts`) are put back afterwards, so that SIGTERM ends a Ray sweep as it
    ends a local one."""

    def __init__(self, address: str | None, workers: int):
        self.address = address
        self.workers = workers
        self.ray: Any = None
        self.started = False

    def connect(self) -> Any:
        if self.ray is not None:
            return self.ray
        address = self.address
        # ray reads RAY_py_gcs_connect_timeout_s when first imported: import it in here.
        with _env(_RAY_CONNECT_ENV if address is not None else {}):
            try:
                import ray
            except ImportError as exc:
                raise ConfigError("--backend", "ray", "needs ray installed: pip install 'kvsim[cluster]'") from exc
            if not ray.is_initialized():
                if address is not None:
                    _check_reachable(address)
                self._init(ray, address)
                self.started = True
        self.ray = ray
        return ray

    def _init(self, ray: Any, address: str | None) -> None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        main = threading.current_thread() is threading.main_thread()
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
        try:
            if address:
                with _stderr_held():
                    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            else:
                # "local": a Ray of its own, not one RAY_ADDRESS or /tmp/ray/ray_current_cluster names
                # (which num_cpus cannot be given to, nor may still be running).
                ray.init(
                    address="local",
                    num_cpus=self.workers,
                    include_dashboard=False,
                    logging_level=logging.WARNING,
                    log_to_driver=False,
                )
        except BaseException as exc:
            with contextlib.suppress(Exception):
                ray.shutdown()  # whatever the failed init started
            if isinstance(exc, SystemExit) and exc.code == signal.SIGTERM:
                # SIGTERM during ray.init, where Ray's handler turns it into sys.exit(15).
                on_term = handlers.get(signal.SIGTERM)
                if callable(on_term):
                    on_term(signal.SIGTERM, None)
                raise
            if not isinstance(exc, Exception):
                raise
            if address:
                raise ConfigError(
                    "--address",
                    address,
                    f"{_RAY_ADDRESS_NEEDS}; Ray could not connect: {_first_line(exc)}",
                ) from None
            raise ConfigError(
                "--backend", "ray", f"a local Ray that starts; ray.init failed: {_first_line(exc)}"
            ) from None
        finally:
            for sig, handler in handlers.items():
                if callable(handler) and signal.getsignal(sig) is not handler:
                    signal.signal(sig, handler)

    def close(self) -> None:
        if self.started:
            self.started = False
            self.ray.shutdown()


def _run_ray(session: _RaySession, points: list[Point], on_result, budget: RunBudget | None = None) -> None:
    ray = session.connect()
    remote = ray.remote(num_cpus=1, max_retries=0)(run_point)
    refs = {remote.remote(_task(p, budget)): p for p in points}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            try:
                result = ray.get(ref)
            except Exception as exc:  # a worker or node died
                result = _lost("ray task failed", exc)
            on_result(refs[ref], result)


class _Progress:
    """The sweep's progress (:mod:`sim.output.progress`: a bar on a terminal, plain lines in a log),
    a user callback ``(done, total, failed)``, or nothing."""

    def __init__(self, progress: bool | ProgressHook, name: str, total: int):
        from sim.output.progress import Progress

        self.hook = progress if callable(progress) else None
        self.total = total
        self.done = 0
        # The last state of the bar stays on the terminal (not transient), as it always has.
        # Nothing to run (every point reused): no 0/0 line; the command says what it reused.
        self.shown = Progress(
            f"sweep {name}", "points", total, show=progress is True and total > 0, transient=False, extra=", 0 failed"
        )

    def __enter__(self):
        self.shown.start()
        return self

    def update(self, advance: int, failed: int) -> None:
        self.done += advance
        self.shown.update(self.done, extra=f", {failed} failed")
        if self.hook is not None:
            self.hook(self.done, self.total, failed)

    def __exit__(self, exc_type, *exc):
        self.shown.stop(ok=exc_type is None)
        return False


#: The metrics ``kvsim sweep`` prints per point: (column, header, format).
RESULT_COLUMNS = (
    ("ttft_s.p90", "TTFT p90 s", "{:.3g}"),
    ("tpot_s.p90", "TPOT p90 s", "{:.3g}"),
    ("throughput_requests_per_s", "req/s", "{:.3g}"),
    ("preemptions", "preempt", "{:d}"),
    ("kv_internal_fragmentation", "KV waste", "{:.0%}"),
)


def result_rows(table: pa.Table, axes: Sequence[str], limit: int = 40) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a sweep's results as ``kvsim sweep`` prints them: each point's axis values,
    ``completed / refused``, :data:`RESULT_COLUMNS` and, where the sweep has an SLO, the share of
    requests that met it and whether that reaches the target (a failed point: its error), at most
    ``limit`` rows in point order."""
    cols = table.column_names
    seeds = "seed" in cols and len(set(table.column("seed").to_pylist())) > 1
    slo = "slo.attainment" in cols
    head = [
        *axes,
        *(["seed"] if seeds else []),
        "completed / refused",
        *(h for _, h, _ in RESULT_COLUMNS),
        *(["SLO attained"] if slo else []),
    ]
    rows = []
    for r in table.slice(0, limit).to_pylist():
        row = [_cell(r.get(a)) for a in axes] + ([str(r.get("seed"))] if seeds else [])
        if r.get("status") != "ok":
            rows.append(row + [f"failed: {r.get('error') or ''}"[:80]] + [""] * (len(head) - len(row) - 1))
            continue
        row.append(f"{r.get('completed')} / {r.get('rejected')}")
        for c, _, fmt in RESULT_COLUMNS:
            v = r.get(c)
            row.append("-" if v is None else fmt.format(v))
        if slo:
            att = r.get("slo.attainment")
            # One decimal: 89.6 % against a 90 % target must not print as a met 90 %.
            cell = "-" if att is None else f"{att * 100:.1f}% " + ("met" if r.get("slo.met") else "missed")
            long = r.get("slo.attainment.long")
            # The joint share can pass while every long prompt misses (they are few): say so.
            row.append(cell if long is None else f"{cell} (long {long * 100:.1f}%)")
        rows.append(row)
    return head, rows


def _cell(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def describe_params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "(base scenario)"


def check_sweep_axes(
    axes: Mapping[str, Sequence], allocators: Sequence[AllocatorConfig], arrivals: Sequence[ArrivalConfig]
) -> None:
    """Every check of a sweep's axes against what its points read, before any point runs:
    :func:`sim.allocators.knob_use.check_axes_read` (``allocators``: the valid points' ``allocator``
    sections) and :func:`sim.workload.arrival_use.check_arrival_axes_read` (``arrivals``: their
    ``workload.arrival`` sections). Each raises a one-line :class:`ConfigError` naming the axis."""
    from sim.allocators.knob_use import check_axes_read
    from sim.workload.arrival_use import check_arrival_axes_read

    check_axes_read(axes, allocators)
    check_arrival_axes_read(axes, arrivals)


__all__ = [
    "Axis",
    "check_sweep_axes",
    "Point",
    "SweepSpec",
    "SweepResult",
    "load_sweep",
    "run_sweep",
    "read_dataset",
    "run_point",
    "flatten_summary",
    "point_id",
    "json_digest",
    "run_points_locally",
    "process_pool",
    "default_workers",
]
