"""The sweep file: its axes and points, each point's scenario and id, all checked before any point runs
(the format: ``docs/sweeps.md``; the overview: :mod:`sim.analysis.sweep`)."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.analysis.slo import SLO, slo_from_mapping
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
from sim.errors import ConfigError, quote
from sim.inputs import is_file, load_yaml, read_text
from sim.limits import MAX_SEED, MAX_SWEEP_POINTS, MAX_SWEEP_SEEDS
from sim.output.results import user_files

SWEEP_KEYS = ("name", "description", "base", "set", "grid", "zip", "seeds", "slo", "step_breakdown")


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
                    pseed = pseed if fits_int64(pseed) else None
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


def fits_int64(v: Any) -> bool:
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
