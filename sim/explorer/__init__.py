"""Glue between the Streamlit explorer (``app.py``) and the simulator, testable without Streamlit.

The page only wires widgets to the functions here:

* **Knobs**: :func:`knobs_from_scenario` reads the values people edit (model, GPU, traffic,
  lengths, allocator, scheduler, cost model) out of a scenario; :func:`overrides_from_knobs`
  turns edited widget values back into dotted overrides (only those that changed, so keys a
  scenario left unset stay unset); :func:`edited_scenario_yaml` writes the result as YAML that
  ``kvsim run`` accepts.
* **Untrusted uploads** (:class:`UploadStore`): size limits, ``yaml.safe_load`` after refusing
  anchors/aliases, schema validation with one readable line on failure. Nothing named in an
  upload is ever opened: every field that names a file, at any depth, is vetted first — trace
  ``path`` keys must name a built-in trace under ``scenarios/`` or a trace uploaded in the same
  session (written to a private temporary folder), ``cost_model.profile`` a built-in
  profile or an uploaded one, and ``model.hf_config`` a shipped model config (:func:`resolve_paths`).
* **Runs**: :func:`resolve_scenario` and :func:`canonical_json` (the cache key of a run),
  :func:`run_canonical` (the simulation behind the page's cache), :func:`kpis` (headline
  numbers of a run), :func:`compare_rows` (side by side, best/worst marked).
* **Downloads**: :func:`table_bytes`, :func:`figures_html`.
* **Calibration**: :func:`profile_rows` (provenance and fit quality per profile) and
  :func:`calibration_figure` (measured table points against the profile's fitted curve).
* :func:`app_command` launches ``streamlit run app.py`` (``kvsim app``).
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import pyarrow as pa
import yaml

from sim.config import (REPO_ROOT, SCENARIO_DIR, LengthsConfig, Scenario, apply_overrides, file_fields, list_scenarios,
                     read_scenario_dict, scenario_from_dict)
from sim.errors import ConfigError

APP_PATH = REPO_ROOT / "app.py"

#: Upload limits (bytes). Scenarios are a few hundred bytes; the largest built-in trace is ~1 MB.
MAX_SCENARIO_BYTES = 256 * 1024
MAX_UPLOAD_BYTES = 5 * 1024 * 1024
MAX_SWEEP_BYTES = 20 * 1024 * 1024
#: A message shown in the page is cut to this many characters (a bad value may be huge).
MAX_MESSAGE_CHARS = 600

TRACE_EXTENSIONS = (".csv", ".jsonl", ".parquet")
TRACE_FORMATS = ("auto", "azure", "mooncake", "csv", "parquet", "length_stats")

#: Widget defaults for the SLO (not a scenario key: the SLO judges a run, it does not change it).
DEFAULT_SLO = {"slo.ttft_s": 0.5, "slo.tpot_s": 0.05, "slo.attainment": 0.9}

def error_text(exc: BaseException) -> str:
    """One readable line for the page, cut to :data:`MAX_MESSAGE_CHARS`."""
    text = str(exc).strip().replace("\n", " ")
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS - 1] + "…"
    return text


# --- built-ins ------------------------------------------------------------------------

def builtin_traces() -> dict[str, Path]:
    """Trace files shipped under ``scenarios/``, keyed by their path relative to it (``traces/x.csv``)."""
    out = {}
    for p in sorted(SCENARIO_DIR.rglob("*")):
        if p.is_file() and p.suffix.lower() in TRACE_EXTENSIONS:
            out[p.relative_to(SCENARIO_DIR).as_posix()] = p
    return out


def builtin_profiles() -> list[str]:
    try:
        from sim.cost.profile import list_profiles
    except ImportError:  # pragma: no cover - profile module absent in an old tree
        return []
    return list_profiles()


def builtin_scenarios() -> list[str]:
    """Names of the YAML files under ``scenarios/`` that are simulator scenarios (other specs
    kept there, such as ``kvsim validate`` files, are left out)."""
    names = []
    for name in list_scenarios():
        try:
            data, _ = read_scenario_dict(SCENARIO_DIR / f"{name}.yaml")
            scenario_from_dict(data)
        except ConfigError:
            continue
        names.append(name)
    return names


def builtin_scenario(name: str) -> dict:
    """Raw YAML mapping of a built-in scenario (only names from :func:`builtin_scenarios`)."""
    if name not in builtin_scenarios():
        raise ConfigError("scenario", name, f"a built-in scenario ({', '.join(builtin_scenarios())})")
    data, _ = read_scenario_dict(SCENARIO_DIR / f"{name}.yaml")
    return data


# --- untrusted input --------------------------------------------------------------------

def _check_size(data: bytes, limit: int, what: str) -> None:
    if len(data) > limit:
        raise ConfigError(what, f"{len(data) / 1e6:.1f} MB", f"a file of at most {limit / 1e6:.1f} MB")
    if not data:
        raise ConfigError(what, "empty file", "a non-empty file")


def safe_yaml(data: bytes, what: str = "scenario upload") -> Any:
    """``yaml.safe_load`` of untrusted bytes, after refusing anchors and aliases (a few lines of
    aliases can expand into gigabytes once walked: the "billion laughs")."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(what, "binary data", "a UTF-8 YAML text file") from None
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise ConfigError(what, "YAML anchor/alias", "plain YAML without anchors (&) or aliases (*)")
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(what, "invalid YAML", f"valid YAML ({first}{where})") from None


_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def safe_filename(name: str, extensions: tuple[str, ...], what: str) -> str:
    """The base name of an uploaded file with only ``[A-Za-z0-9._-]`` kept, and an allowed extension."""
    base = Path(str(name).replace("\\", "/")).name
    base = _SAFE_NAME.sub("_", base).lstrip(".")[:100] or "upload"
    if not base.lower().endswith(extensions):
        raise ConfigError(what, name, f"a file ending in {', '.join(extensions)}")
    return base


#: Nesting deeper than this is refused before anything else looks at an upload (the deepest
#: legitimate scenario, a mixture of mixtures, is a few levels).
MAX_NESTING = 64


def _file_refs(node: Any, key: str, names: set[str], depth: int = 0):
    """(parent mapping, field name, dotted key) of every field in ``names`` at any depth of ``node``;
    :class:`ConfigError` when the nesting exceeds :data:`MAX_NESTING`."""
    if depth > MAX_NESTING:
        raise ConfigError(key or "scenario", "…", f"nesting of at most {MAX_NESTING} levels")
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        sub = f"{key}.{k}" if key else str(k)
        if isinstance(node, dict) and k in names:
            yield node, k, sub
        if isinstance(v, (dict, list)):
            yield from _file_refs(v, sub, names, depth + 1)


def resolve_paths(data: dict, traces: Mapping[str, Path] | None = None,
                  profiles: Mapping[str, Path] | None = None) -> dict:
    """A copy of a raw scenario mapping whose file references are vetted absolute paths.

    Every field that names a file (:func:`sim.config.file_fields`), at any depth and under any
    key, is vetted: a trace ``path`` must be a built-in trace (``traces/…`` under ``scenarios/``)
    or the name of a trace in ``traces`` (uploaded this session); ``profile`` must be
    ``none``/``auto``, a built-in profile name or a name in ``profiles``; ``model.hf_config`` the
    id of a config shipped in ``scenarios/models/``. The strings are looked up in those tables,
    never opened, so an upload cannot reach other server files.
    """
    if not isinstance(data, dict):
        raise ConfigError("scenario", type(data).__name__, "a YAML mapping of sections (model, gpu, workload, ...)")
    if "base_dir" in data:
        raise ConfigError("base_dir", data["base_dir"], "not a scenario key (file paths resolve against scenarios/)")
    out = copy.deepcopy(data)
    traces = dict(traces or {})
    uploaded = dict(profiles or {})
    builtin = builtin_traces()

    def vet_trace(node: dict, field: str, key: str) -> None:
        ref = node[field]
        if ref is None:
            return
        if not isinstance(ref, str):
            raise ConfigError(key, ref, "a trace name")
        if ref in traces:
            node[field] = str(traces[ref])
        elif ref.removeprefix("./") in builtin:
            node[field] = str(builtin[ref.removeprefix("./")])
        else:
            allowed = ", ".join(list(builtin) + list(traces)) or "none"
            raise ConfigError(key, ref, f"a built-in trace or one uploaded in this session ({allowed})")

    def vet_profile(node: dict, field: str, key: str) -> None:
        ref = node[field]
        if ref is None:
            return
        if not isinstance(ref, str):
            raise ConfigError(key, ref, "a profile name")
        if ref in uploaded:
            node[field] = str(uploaded[ref])
        elif ref not in ("none", "auto", *builtin_profiles()):
            names = ", ".join(["none", "auto", *builtin_profiles(), *uploaded])
            raise ConfigError(key, ref, f"a built-in profile or one uploaded in this session ({names})")

    def vet_model_config(node: dict, field: str, key: str) -> None:
        from sim.hf_config import shipped_config, shipped_models
        ref = node[field]
        if ref is None:
            return
        path = shipped_config(ref) if isinstance(ref, str) else None
        if path is None:
            raise ConfigError(key, ref, f"the id of a shipped model config ({', '.join(shipped_models())})")
        node[field] = str(path)

    vetters = {"profile": vet_profile, "hf_config": vet_model_config}
    names = file_fields()
    for node, field, key in list(_file_refs(out, "", names)):
        vetters.get(field, vet_trace)(node, field, key)
    return out


def resolve_scenario(data: dict, traces: Mapping[str, Path] | None = None,
                     profiles: Mapping[str, Path] | None = None) -> Scenario:
    """Validated :class:`Scenario` from a raw mapping whose file references are vetted first."""
    return scenario_from_dict(resolve_paths(data, traces, profiles), base_dir=SCENARIO_DIR)


@dataclass
class UploadedTrace:
    name: str
    path: Path
    rows: int
    has_arrivals: bool
    format: str


class UploadStore:
    """Files uploaded in one browser session, in a private temporary folder removed with the store.

    Stored names embed a hash of the content, so a new upload under an old name never hits a
    stale cache entry or a reader's (path, mtime) cache. The folder is made on the first write:
    most sessions never upload, and a server killed without running its exit handlers would
    leave one empty folder per session behind.
    """

    def __init__(self) -> None:
        self._dir: Path | None = None
        self.traces: dict[str, UploadedTrace] = {}
        self.profiles: dict[str, Path] = {}
        self._finalizer: weakref.finalize | None = None

    @property
    def dir(self) -> Path:
        """The session's private folder (created on first use, removed by :meth:`close` or at exit)."""
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="kvsim-app-"))
            self._finalizer = weakref.finalize(self, shutil.rmtree, str(self._dir), True)
        return self._dir

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()

    def trace_paths(self) -> dict[str, Path]:
        return {k: v.path for k, v in self.traces.items()}

    def _write(self, sub: str, name: str, data: bytes) -> Path:
        folder = self.dir / sub / hashlib.sha256(data).hexdigest()[:16]
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        path.write_bytes(data)
        return path

    def add_trace(self, filename: str, data: bytes, fmt: str = "auto") -> UploadedTrace:
        """Validate an uploaded trace (size, name, columns, token counts) and keep it; bad files are deleted."""
        from sim.workload.traces import read_trace
        what = "trace upload"
        _check_size(data, MAX_UPLOAD_BYTES, what)
        if fmt not in TRACE_FORMATS:
            raise ConfigError(what, fmt, f"a format among {', '.join(TRACE_FORMATS)}")
        name = safe_filename(filename, TRACE_EXTENSIONS, what)
        path = self._write("traces", name, data)
        try:
            trace = read_trace(path, fmt, f"trace {name}")
        except ConfigError as exc:
            shutil.rmtree(path.parent, ignore_errors=True)
            # The temporary path means nothing to the user: name the file they uploaded.
            raise ConfigError(f"trace {name}", name, exc.allowed) from None
        except Exception as exc:  # noqa: BLE001 - any reader failure on untrusted bytes is a bad file
            shutil.rmtree(path.parent, ignore_errors=True)
            raise ConfigError(f"trace {name}", name, f"a readable trace ({type(exc).__name__})") from None
        info = UploadedTrace(name, path, len(trace), trace.arrival_s is not None,
                             fmt if fmt != "auto" else "auto")
        self.traces[name] = info
        return info

    def add_profile(self, filename: str, data: bytes) -> str:
        """Validate an uploaded profile JSON (size, JSON, kvsim-profile schema); returns its name."""
        from sim.cost.profile import Profile
        what = "profile upload"
        _check_size(data, MAX_UPLOAD_BYTES, what)
        name = safe_filename(filename, (".json",), what)
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(what, name, f"valid UTF-8 JSON ({type(exc).__name__}: {error_text(exc)[:120]})") from None
        Profile.from_json(doc, name)  # raises ConfigError naming what is missing
        key = name.removesuffix(".json")
        if key in builtin_profiles() or key in ("none", "auto"):
            key = f"uploaded-{key}"
        self.profiles[key] = self._write("profiles", name, data)
        return key

    def parse_scenario(self, filename: str, data: bytes) -> dict:
        """An uploaded scenario YAML as a raw mapping, validated (schema and file references)."""
        what = "scenario upload"
        _check_size(data, MAX_SCENARIO_BYTES, what)
        safe_filename(filename, (".yaml", ".yml"), what)
        doc = safe_yaml(data, what)
        if not isinstance(doc, dict):
            raise ConfigError(what, type(doc).__name__, "a YAML mapping of sections (model, gpu, workload, ...)")
        resolve_scenario(doc, self.trace_paths(), self.profiles)
        return doc


def read_sweep_upload(filename: str, data: bytes) -> pa.Table:
    """A sweep dataset uploaded as one Parquet file."""
    import pyarrow.parquet as pq
    what = "sweep upload"
    _check_size(data, MAX_SWEEP_BYTES, what)
    safe_filename(filename, (".parquet",), what)
    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - untrusted bytes
        raise ConfigError(what, filename, f"a readable Parquet file ({type(exc).__name__})") from None
    if table.num_rows == 0:
        raise ConfigError(what, filename, "a dataset with at least one row")
    return table


# --- knobs --------------------------------------------------------------------------------

#: Knobs shown in Explore, as dotted scenario keys (plus the ``slo.*`` keys, which are not).
LENGTH_KNOBS = {
    "fixed": ("prompt_tokens", "output_tokens"),
    "uniform": ("prompt_min", "prompt_max", "output_min", "output_max"),
    "lognormal": ("prompt_median", "prompt_sigma", "output_median", "output_sigma"),
    "empirical": ("path", "format"),
    "mixture": ("outlier_fraction", "outlier_multiplier"),
    "trace": (),
}
ARRIVAL_KNOBS = {
    "poisson": ("rate",),
    "gamma": ("rate", "cv"),
    "trace": ("path", "format", "time_scale"),
    "closed_loop": ("concurrency", "think_time_s"),
}
_ALL_LENGTH_FIELDS = sorted({f for v in LENGTH_KNOBS.values() for f in v})
_ALL_ARRIVAL_FIELDS = sorted({f for v in ARRIVAL_KNOBS.values() for f in v})


def allocator_fields() -> list[str]:
    """Scalar ``allocator.*`` keys (nested sections such as compaction are left to the YAML)."""
    from sim.config import AllocatorConfig
    return [f for f, info in AllocatorConfig.model_fields.items()
            if f != "kind" and not _is_model(info.annotation)]


def _is_model(annotation) -> bool:
    from pydantic import BaseModel
    cands = [annotation, *getattr(annotation, "__args__", ())]
    return any(isinstance(c, type) and issubclass(c, BaseModel) for c in cands)


def allocator_knobs(kind: str) -> dict[str, Any]:
    """The knobs (name → default) of an allocator kind, from :data:`sim.allocators.KINDS`;
    only scalar scenario fields (the page edits those)."""
    from sim.allocators import KINDS
    fields = set(allocator_fields())
    return {k: v for k, v in KINDS.get(kind, ({}, ""))[0].items() if k in fields}


def allocator_choices(name: str) -> list | None:
    """Allowed values of an ``allocator.<name>`` Literal field (``None`` for free values)."""
    import typing
    from sim.config import AllocatorConfig
    info = AllocatorConfig.model_fields.get(name)
    if info is None or typing.get_origin(info.annotation) is not typing.Literal:
        return None
    return list(typing.get_args(info.annotation))


def knobs_from_scenario(sc: Scenario | dict) -> dict[str, Any]:
    """Widget values (dotted key → value) of the knobs the Explore page edits, defaults filled."""
    if isinstance(sc, dict):
        sc = scenario_from_dict(sc)  # validation only: no file is opened
    w = sc.workload
    out: dict[str, Any] = {
        "model.name": sc.model.name or "custom",
        "model.kv_dtype": sc.model.kv_dtype,
        "gpu.name": sc.gpu.name,
        "gpu.replicas": sc.gpu.replicas,
        "gpu.tensor_parallel": sc.gpu.tensor_parallel,
        "workload.num_requests": w.num_requests,
        "workload.max_model_len": w.max_model_len,
        "workload.arrival.kind": w.arrival.kind,
        "workload.lengths.kind": w.lengths.kind if w.lengths is not None else "trace",
        "scheduler.max_num_seqs": sc.scheduler.max_num_seqs,
        "scheduler.max_num_batched_tokens": sc.scheduler.max_num_batched_tokens,
        "scheduler.chunked_prefill": sc.scheduler.chunked_prefill,
        "allocator.kind": sc.allocator.kind,
        "cost_model.profile": sc.cost_model.profile or "none",
        "seed": sc.seed,
    }
    for f in allocator_fields():
        v = getattr(sc.allocator, f)
        out[f"allocator.{f}"] = str(v) if f == "reserve" else v
    for f in _ALL_ARRIVAL_FIELDS:
        out[f"workload.arrival.{f}"] = getattr(w.arrival, f)
    if out["workload.arrival.rate"] is None:
        out["workload.arrival.rate"] = 1.0
    if out["workload.arrival.concurrency"] is None:
        out["workload.arrival.concurrency"] = 16
    lc = w.lengths if w.lengths is not None else LengthsConfig()
    for f in _ALL_LENGTH_FIELDS:
        out[f"workload.lengths.{f}"] = getattr(lc, f)
    return out


def _reserve_value(v: Any) -> Any:
    """``allocator.reserve`` from a text box: an int when it is digits, else the string (``p95``)."""
    s = str(v).strip()
    return int(s) if s.isdigit() else s


def overrides_from_knobs(knobs: Mapping[str, Any], base: Scenario | dict) -> dict[str, Any]:
    """Dotted overrides for the knobs whose value differs from ``base``.

    Only the knobs of the selected arrival/lengths kind count (a hidden ``cv`` does not leak
    into a Poisson run). ``slo.*`` keys are not scenario keys and are ignored here.
    """
    ref = knobs_from_scenario(base)
    arrival_kind = knobs.get("workload.arrival.kind", ref["workload.arrival.kind"])
    lengths_kind = knobs.get("workload.lengths.kind", ref["workload.lengths.kind"])
    alloc_kind = knobs.get("allocator.kind", ref["allocator.kind"])
    relevant = [k for k in ref if not k.startswith(("workload.arrival.", "workload.lengths.", "allocator."))]
    relevant += ["allocator.kind"] + [f"allocator.{f}" for f in allocator_knobs(alloc_kind)]
    relevant += ["workload.arrival.kind"] + [f"workload.arrival.{f}" for f in ARRIVAL_KNOBS.get(arrival_kind, ())]
    relevant += ["workload.lengths.kind"] + [f"workload.lengths.{f}" for f in LENGTH_KNOBS.get(lengths_kind, ())]
    out: dict[str, Any] = {}
    base_lengths_none = ref["workload.lengths.kind"] == "trace" and (
        (base.workload.lengths is None) if isinstance(base, Scenario) else
        not isinstance((base.get("workload") or {}).get("lengths"), dict))
    # A kind other than the base's takes all its knobs (a closed loop needs its concurrency
    # even when the widget still shows the default).
    forced = set()
    if arrival_kind != ref["workload.arrival.kind"]:
        forced |= {f"workload.arrival.{f}" for f in ARRIVAL_KNOBS.get(arrival_kind, ())}
    if lengths_kind != ref["workload.lengths.kind"]:
        forced |= {f"workload.lengths.{f}" for f in LENGTH_KNOBS.get(lengths_kind, ())}
    if alloc_kind != ref["allocator.kind"]:
        forced |= {f"allocator.{f}" for f in allocator_knobs(alloc_kind)}
    for k in relevant:
        if k not in knobs:
            continue
        v = knobs[k]
        if k in forced and v is not None:
            out[k] = _reserve_value(v) if k == "allocator.reserve" else v
            continue
        if k == "allocator.reserve":
            v = _reserve_value(v)
            if str(v) == ref[k]:
                continue
        elif v == ref[k]:
            continue
        if k == "cost_model.profile" and v == "none":
            v = None
        out[k] = v
    if lengths_kind == "trace" and base_lengths_none:
        out.pop("workload.lengths.kind", None)
    base_hf = base.model.hf_config if isinstance(base, Scenario) else (base.get("model") or {}).get("hf_config")
    if "model.name" in out and base_hf is not None:
        out["model.hf_config"] = None  # a catalog model picked in the page replaces the config's model
    if isinstance(out.get("workload.num_requests"), float):
        out["workload.num_requests"] = int(out["workload.num_requests"])
    return out


def edited_scenario(base: dict, knobs: Mapping[str, Any]) -> dict:
    """The raw scenario mapping after the knob edits (file references still as the user named them)."""
    ref = scenario_from_dict(base)
    return apply_overrides(base, overrides_from_knobs(knobs, ref))


def edited_scenario_yaml(base: dict, knobs: Mapping[str, Any], uploaded_traces: list[str] = ()) -> str:
    """YAML of the edited scenario, runnable by ``kvsim run`` (validated first)."""
    data = edited_scenario(base, knobs)
    scenario_from_dict(data)
    head = "# Edited in the kvsim explorer; run with: kvsim run <this file>\n"
    if uploaded_traces:
        head += "# Uploaded traces referenced here must sit next to this file: " + ", ".join(uploaded_traces) + "\n"
    return head + yaml.safe_dump(data, sort_keys=False)


# --- runs ---------------------------------------------------------------------------------

def canonical_json(sc: Scenario) -> str:
    """Canonical JSON of a resolved scenario: the cache key of its run.

    Only explicitly set keys are kept (``exclude_unset``): whether ``num_requests`` was given
    changes what a ``duration_s`` run does, so a full dump would not round-trip.
    """
    return json.dumps(sc.model_dump(mode="json", exclude_unset=True), sort_keys=True, separators=(",", ":"))


def scenario_from_canonical(key: str) -> Scenario:
    return scenario_from_dict(json.loads(key), base_dir=SCENARIO_DIR)


@dataclass
class RunData:
    """What the page keeps of a run (picklable: Streamlit's cache copies it)."""

    key: str
    summary: dict
    requests: pa.Table
    timeseries: pa.Table
    wall_s: float
    scenario_name: str = ""


def empty_run() -> RunData:
    """A run with no rows (typed like a real one): the page draws empty chart frames from it."""
    from sim.output.metrics import Recorder
    rec = Recorder(1)
    return RunData("", {}, rec.requests_table(), rec.timeseries_table(), 0.0)


def run_canonical(key: str, progress: Callable[[int, int], None] | None = None) -> RunData:
    """Simulate the scenario whose canonical JSON is ``key``."""
    from sim.engine.cluster import simulate
    sc = scenario_from_canonical(key)
    res = simulate(sc, progress=progress)
    return RunData(key, res.summary, res.requests, res.timeseries, res.run_info.get("wall_s", 0.0), sc.name)


# --- KPIs -----------------------------------------------------------------------------------

#: (key, label, format, better) — better: "low", "high" or "" (no ranking).
KPI_SPEC: list[tuple[str, str, str, str]] = [
    ("ttft_p50_s", "TTFT p50 (s)", "{:.3f}", "low"),
    ("ttft_p99_s", "TTFT p99 (s)", "{:.3f}", "low"),
    ("tpot_p50_s", "TPOT p50 (s)", "{:.4f}", "low"),
    ("tpot_p99_s", "TPOT p99 (s)", "{:.4f}", "low"),
    ("e2e_p50_s", "e2e p50 (s)", "{:.2f}", "low"),
    ("e2e_p99_s", "e2e p99 (s)", "{:.2f}", "low"),
    ("throughput_tokens_per_s", "throughput (tok/s)", "{:,.0f}", "high"),
    ("throughput_requests_per_s", "throughput (req/s)", "{:.2f}", "high"),
    ("slo_attainment", "SLO attainment", "{:.1%}", "high"),
    ("kv_waste", "KV waste", "{:.1%}", "low"),
    ("preemptions", "preemptions", "{:,}", "low"),
    ("rejected", "rejections", "{:,}", "low"),
]
KPI_LABELS = {k: label for k, label, _, _ in KPI_SPEC}


def slo_from_knobs(knobs: Mapping[str, Any]):
    """:class:`sim.analysis.slo.SLO` from the page's SLO widgets (a bound of 0 or empty = no bound)."""
    from sim.analysis.slo import SLO

    def bound(k):
        v = knobs.get(k, DEFAULT_SLO[k])
        return float(v) if v not in (None, "") and float(v) > 0 else None

    return SLO(ttft_s=bound("slo.ttft_s"), tpot_s=bound("slo.tpot_s"),
               attainment=float(knobs.get("slo.attainment", DEFAULT_SLO["slo.attainment"])))


def kpis(summary: dict, requests: pa.Table | None = None, slo=None) -> dict[str, Any]:
    """Headline numbers of a run. KV waste = 1 − kv_token_utilization (reserved but unused)."""
    util = summary.get("kv_token_utilization")
    out = {
        "ttft_p50_s": summary["ttft_s"]["p50"], "ttft_p99_s": summary["ttft_s"]["p99"],
        "tpot_p50_s": summary["tpot_s"]["p50"], "tpot_p99_s": summary["tpot_s"]["p99"],
        "e2e_p50_s": summary["e2e_s"]["p50"], "e2e_p99_s": summary["e2e_s"]["p99"],
        "throughput_tokens_per_s": summary.get("throughput_tokens_per_s"),
        "throughput_requests_per_s": summary.get("throughput_requests_per_s"),
        "slo_attainment": None,
        "kv_waste": None if util is None else 1.0 - util,
        "preemptions": summary.get("preemptions"),
        "rejected": summary.get("rejected"),
    }
    if requests is not None and slo is not None and (slo.ttft_s or slo.tpot_s or slo.e2e_s):
        from sim.analysis.slo import attainment
        out["slo_attainment"] = attainment(requests, slo)
    return out


def format_kpi(key: str, value: Any) -> str:
    if value is None:
        return "–"
    fmt = next(f for k, _, f, _ in KPI_SPEC if k == key)
    return fmt.format(value)


def kpi_delta(key: str, value: Any, previous: Any) -> tuple[str | None, str]:
    """(delta text, Streamlit delta_color) of a KPI against the previous run."""
    if value is None or previous is None or value == previous:
        return None, "off"
    better = next(b for k, _, _, b in KPI_SPEC if k == key)
    d = value - previous
    text = format_kpi(key, abs(d)) if key not in ("slo_attainment", "kv_waste") else f"{abs(d) * 100:.1f} pp"
    text = ("+" if d > 0 else "-") + text  # an ASCII sign: Streamlit picks the arrow from it
    return text, ("inverse" if better == "low" else "normal") if better else "off"


def compare_rows(kpis_by_label: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per KPI: ``{"KPI": label, <run label>: formatted value, ..., "best": label|""}``
    plus ``_best``/``_worst`` (labels) and ``_differs`` for highlighting."""
    labels = list(kpis_by_label)
    rows = []
    for key, label, _, better in KPI_SPEC:
        vals = {lb: kpis_by_label[lb].get(key) for lb in labels}
        row: dict[str, Any] = {"KPI": label}
        row.update({lb: format_kpi(key, v) for lb, v in vals.items()})
        present = {lb: v for lb, v in vals.items() if v is not None}
        differs = len(set(row[lb] for lb in labels)) > 1
        best = worst = ""
        if better and differs and len(present) > 1:
            order = sorted(present, key=lambda lb: present[lb], reverse=better == "high")
            if present[order[0]] != present[order[-1]]:
                best, worst = order[0], order[-1]
        row["_best"], row["_worst"], row["_differs"] = best, worst, differs
        rows.append(row)
    return rows


ALLOCATOR_KNOBS = ("kind", "block_size", "reserve", "overflow")


def allocator_label(cfg: Mapping[str, Any]) -> str:
    kind = cfg.get("kind", "paged")
    if kind == "paged":
        return f"paged b={cfg.get('block_size', 16)}"
    if kind == "static":
        return f"static {cfg.get('reserve', 'max_model_len')} ({cfg.get('overflow', 'reject')})"
    knobs = allocator_knobs(kind)
    extra = " ".join(f"{k}={cfg[k]}" for k in knobs if k in cfg and cfg[k] != knobs[k])
    return f"{kind} {extra}".strip()


def allocator_overrides(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted overrides for one Compare column: the kind and its knobs (``KINDS``) only."""
    kind = cfg.get("kind", "paged")
    out: dict[str, Any] = {"allocator.kind": kind}
    for k, default in allocator_knobs(kind).items():
        v = cfg.get(k, default)
        out[f"allocator.{k}"] = _reserve_value(v) if k == "reserve" else v
    return out


def unique_labels(cfgs: list[Mapping[str, Any]]) -> list[str]:
    labels, seen = [], {}
    for cfg in cfgs:
        lb = allocator_label(cfg)
        seen[lb] = seen.get(lb, 0) + 1
        labels.append(lb if seen[lb] == 1 else f"{lb} #{seen[lb]}")
    return labels


# --- downloads ------------------------------------------------------------------------------

def table_bytes(table: pa.Table, fmt: str) -> bytes:
    """A result table as Parquet or CSV bytes."""
    buf = io.BytesIO()
    if fmt == "parquet":
        import pyarrow.parquet as pq
        pq.write_table(table, buf)
    elif fmt == "csv":
        import pyarrow.csv as pacsv
        pacsv.write_csv(table, buf)
    else:
        raise ValueError(fmt)
    return buf.getvalue()


def figures_html(figs: Mapping[str, Any], title: str = "kvsim charts") -> str:
    """One self-contained HTML page with every figure (plotly.js inlined once: works offline)."""
    parts = []
    for i, (name, fig) in enumerate(figs.items()):
        parts.append(f"<h2>{_html_escape(name)}</h2>")
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_html_escape(title)}</title></head>"
            f"<body><h1>{_html_escape(title)}</h1>{''.join(parts)}</body></html>")


def _html_escape(s: str) -> str:
    import html
    return html.escape(str(s))


# --- sweeps and plans ----------------------------------------------------------------------

#: Axes a page sweep may vary, with example values (free text is parsed per value, scalars only).
SWEEP_AXES: dict[str, str] = {
    "allocator.kind": "static, paged",
    "workload.arrival.rate": "5, 10, 15, 20",
    "allocator.block_size": "16, 64, 256",
    "scheduler.max_num_seqs": "64, 128, 256",
    "scheduler.max_num_batched_tokens": "2048, 8192",
    "gpu.replicas": "1, 2",
    "workload.arrival.cv": "1, 2, 4",
    "allocator.reserve": "max_model_len, p99, p95",
}
MAX_AXIS_VALUES = 12
MAX_SWEEP_POINTS = 48


def parse_axis_values(text: str, key: str) -> list:
    """``"5, 10, 20"`` → ``[5, 10, 20]`` for one of :data:`SWEEP_AXES` (each value a YAML scalar)."""
    if key not in SWEEP_AXES:
        raise ConfigError("sweep axis", key, f"one of {', '.join(SWEEP_AXES)}")
    values = []
    for raw in str(text).split(","):
        raw = raw.strip()
        if not raw:
            continue
        try:
            v = yaml.safe_load(raw)
        except yaml.YAMLError:
            v = raw
        if not isinstance(v, (int, float, str)) or isinstance(v, bool):
            raise ConfigError(key, raw, "plain numbers or words separated by commas")
        values.append(v)
    if not values:
        raise ConfigError(key, text, "at least one value, separated by commas")
    if len(values) > MAX_AXIS_VALUES:
        raise ConfigError(key, f"{len(values)} values", f"at most {MAX_AXIS_VALUES} values per axis in the page")
    return list(dict.fromkeys(values))


def _write_run_scenario(data: dict, store: "UploadStore", sub: str) -> Path:
    """The scenario with vetted absolute paths, written into the session folder (for sweep/plan files)."""
    resolved = resolve_paths(data, store.trace_paths(), store.profiles)
    scenario_from_dict(resolved)
    text = yaml.safe_dump(resolved, sort_keys=False)
    folder = store.dir / sub / hashlib.sha256(text.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "scenario.yaml"
    path.write_text(text)
    return path


def run_small_sweep(data: dict, grid: dict[str, list], num_requests: int, store: "UploadStore",
                    progress: Callable[[int, int, int], None] | None = None, workers: int = 1):
    """Run a grid sweep of the edited scenario (``sim.analysis.sweep``); returns (dataset table, failures)."""
    from sim.analysis.sweep import run_sweep
    points = 1
    for values in grid.values():
        points *= len(values)
    if points > MAX_SWEEP_POINTS:
        raise ConfigError("sweep", f"{points} points", f"at most {MAX_SWEEP_POINTS} points from the page (use kvsim sweep)")
    base = _write_run_scenario(data, store, "sweeps")
    spec = {"name": "explorer", "base": base.name, "set": {"workload.num_requests": int(num_requests)},
            "grid": {k: list(v) for k, v in grid.items()}}
    sweep_file = base.parent / "sweep.yaml"
    sweep_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    res = run_sweep(sweep_file, workers=workers, out=base.parent / "dataset", progress=progress or False)
    return res.table(), res.failures


def run_small_plan(data: dict, slo, candidates: list[str], num_requests: int, store: "UploadStore",
                   progress: Callable[[int, int, str], None] | None = None, tol: float = 0.1,
                   max_evals: int = 10, workers: int = 1, seeds: int = 1, break_even: bool = False,
                   on_candidate: Callable[[dict], None] | None = None) -> dict:
    """Goodput per candidate allocator for the edited scenario (``sim.analysis.planner.plan``);
    ``on_candidate`` receives each candidate as it finishes (the page streams them into its table)."""
    from sim.analysis.planner import plan
    base = _write_run_scenario(data, store, "plans")
    return plan(base, slo, overrides={"workload.num_requests": int(num_requests)}, allocators=candidates or None,
                tol=tol, workers=workers, progress=progress, max_evals=max_evals, seeds=seeds, break_even=break_even,
                on_candidate=on_candidate)


def plan_stream_rows(cands: list[dict], seeds: int = 1) -> list[dict]:
    """The plan table's rows for the candidates finished so far (before the recommendation exists)."""
    from sim.analysis.planner import candidate_row, plan_columns
    partial = {"seeds": seeds, "target_rate": None}
    cols = plan_columns(partial)
    return [dict(zip(cols, candidate_row(partial, c))) for c in cands]


def numeric_columns(table: pa.Table) -> list[str]:
    return [f.name for f in table.schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]


def sweep_param_columns(table: pa.Table) -> list[str]:
    """The swept axes of a dataset: dotted scenario keys (``allocator.kind``) plus ``seed``."""
    prefixes = ("model.", "gpu.", "workload.", "scheduler.", "allocator.", "cost_model.", "engine.")
    cols = [c for c in table.column_names if c.startswith(prefixes)]
    if "seed" in table.column_names and len(set(table.column("seed").to_pylist())) > 1:
        cols.append("seed")
    return cols


def default_index(options: list, preferred: str) -> int:
    return options.index(preferred) if preferred in options else 0


def default_sweep_axes(table: pa.Table) -> tuple[str | None, str | None]:
    """(x, color) to plot a dataset by: a numeric swept axis on x, a categorical one as color."""
    params = sweep_param_columns(table)
    numeric = set(numeric_columns(table))
    x = next((c for c in params if c in numeric and c != "seed"), params[0] if params else None)
    color = next((c for c in params if c != x and c not in numeric), None)
    if color is None:
        color = next((c for c in params if c != x and c != "seed"), None)
    return x, color


def preferred_curve(family: str) -> str:
    """A representative measured curve to show first (Llama-3.1-8B-sized shapes)."""
    return {"gemm": "4096x4096:bf16", "generation_attention": "32/8/128:bf16",
            "context_attention": "32/8/128:bf16", "allreduce": "2"}.get(family, "")


def default_curve(profile, family: str) -> str | None:
    """The preferred curve when the profile has it measured, else its first measured one, else the first."""
    keys = profile.curve_keys(family)
    if not keys:
        return None
    measured = [k for k in keys if profile.curve(family, k).meta.get("measured_shape", True)]
    pref = preferred_curve(family)
    if pref in measured:
        return pref
    return measured[0] if measured else keys[0]


# --- calibration ------------------------------------------------------------------------------

def profile_rows(names: list[str] | None = None, loader=None) -> list[dict[str, Any]]:
    """Provenance and held-out fit quality of each profile (built-ins by default)."""
    from sim.cost.profile import list_profiles, load_profile
    loader = loader or load_profile
    rows = []
    for name in names if names is not None else list_profiles():
        p = loader(name)
        prov, fq = p.provenance, p.fit_quality
        row = {"profile": name, "device": prov.get("device") or p.device.get("name"),
               "backend": prov.get("backend", "")}
        for fam in ("gemm", "context_attention", "generation_attention"):
            o = (fq.get(fam) or {}).get("overall") or {}
            med, p95 = o.get("median_rel_err"), o.get("p95_rel_err")
            row[f"{fam} median / p95 err"] = (f"{med:.1%} / {p95:.1%}" if med is not None and p95 is not None else "–")
        row.update({"date": prov.get("date", ""), "source": prov.get("source", "")})
        rows.append(row)
    return rows


CURVE_FAMILIES = ("gemm", "generation_attention", "context_attention", "allreduce")


def curve_keys(profile, family: str) -> list[str]:
    return profile.curve_keys(family)


def _source_table(profile, needle: str) -> Path | None:
    try:
        from calibration.tables import DEFAULT_TABLES_DIR
    except ImportError:
        return None
    for rel in profile.provenance.get("source_tables", []):
        if needle in rel:
            p = (DEFAULT_TABLES_DIR / rel).resolve()
            if p.is_file() and DEFAULT_TABLES_DIR.resolve() in p.parents:
                return p
    return None


def measured_points(profile, family: str, key: str) -> dict | None:
    """Measured rows behind one curve of a built-in profile, from the repository's kernel tables
    (``None`` when the table is not shipped or the shape was not measured)."""
    import numpy as np
    try:
        from calibration import tables as T
    except ImportError:
        return None
    if family == "gemm":
        path = _source_table(profile, "gemm_perf")
        if path is None:
            return None
        shape, dtype = key.split(":")
        n, k = (int(x) for x in shape.split("x"))
        curve = profile.curve("gemm", key)
        table_dtype = curve.meta.get("table_dtype", dtype)
        t = T.read_gemm(path)
        sel = (t.n == n) & (t.k == k) & (t.dtype == table_dtype)
        if not sel.any():
            return None
        order = np.argsort(t.m[sel])
        return {"x": t.m[sel][order], "t_s": t.latency_s[sel][order]}
    if family in ("generation_attention", "context_attention"):
        kind = "generation" if family.startswith("generation") else "context"
        path = _source_table(profile, f"{kind}_attention_perf")
        if path is None:
            return None
        shape, kv_dtype = key.split(":")
        h, kvh, d = (int(x) for x in shape.split("/"))
        t = T.read_attention(path, kind)
        sel = (t.heads == h) & (t.kv_heads == kvh) & (t.head_dim == d) & (t.kv_dtype == kv_dtype)
        if kind == "context":
            sel &= t.attn_dtype == kv_dtype if (t.attn_dtype == kv_dtype).any() else sel
        if not sel.any():
            return None
        return {"batch": t.batch[sel], "length": t.length[sel], "t_s": t.latency_s[sel]}
    if family == "allreduce":
        path = _source_table(profile, "nccl_perf")
        if path is None:
            return None
        t = T.read_nccl(path)
        sel = t.num_gpus == int(key)
        if not sel.any():
            return None
        return {"x": t.nbytes[sel], "t_s": t.latency_s[sel]}
    return None


def calibration_figure(profile, family: str, key: str, max_batches: int = 6):
    """Measured points (markers) against the profile's fitted curve (lines), log-log."""
    import numpy as np
    import plotly.graph_objects as go
    from sim.analysis.plots import _palette
    fig = go.Figure()
    pts = measured_points(profile, family, key)
    curve = profile.curve(family, key)
    if family in ("gemm", "allreduce"):
        xlab = "tokens (m)" if family == "gemm" else "message bytes"
        fig.add_trace(go.Scatter(x=curve.x, y=curve.t_s * 1e6, mode="lines", name="profile curve"))
        if pts is not None:
            fig.add_trace(go.Scatter(x=pts["x"], y=pts["t_s"] * 1e6, mode="markers", name="measured",
                                     marker=dict(size=6, symbol="circle-open")))
    else:
        xlab = "KV tokens per sequence" if family.startswith("generation") else "prompt length (tokens)"
        idx = np.unique(np.linspace(0, len(curve.batch) - 1, min(max_batches, len(curve.batch))).round().astype(int))
        colors = _palette(len(idx))
        for c, i in zip(colors, idx):
            b = curve.batch[i]
            fig.add_trace(go.Scatter(x=curve.length, y=curve.t_s[i] * 1e6, mode="lines", name=f"batch {b:g} curve",
                                     line=dict(color=c), legendgroup=str(b)))
            if pts is not None:
                sel = pts["batch"] == b
                if sel.any():
                    o = np.argsort(pts["length"][sel])
                    fig.add_trace(go.Scatter(x=pts["length"][sel][o], y=pts["t_s"][sel][o] * 1e6, mode="markers",
                                             name=f"batch {b:g} measured", legendgroup=str(b),
                                             marker=dict(color=c, size=6, symbol="circle-open")))
    note = "" if pts is not None else " (no measured table for this shape: curve only)"
    fig.update_layout(title=f"{profile.name}: {family} {key}{note}", xaxis_title=xlab, yaxis_title="time (µs)",
                      xaxis_type="log", yaxis_type="log")
    return fig, pts is not None


# --- launcher ---------------------------------------------------------------------------------

def app_command(extra_args: list[str] | None = None) -> int:
    """``kvsim app``: run ``streamlit run <repo>/app.py`` and return its exit status."""
    try:
        import streamlit  # noqa: F401
    except ImportError:
        sys.stderr.write("error: the explorer needs streamlit and plotly: pip install 'kvsim[app]'\n")
        return 2
    cmd = [sys.executable, "-m", "streamlit", "run", str(APP_PATH),
           "--server.maxUploadSize", str(max(1, MAX_SWEEP_BYTES // (1024 * 1024))), *(extra_args or [])]
    try:
        return subprocess.call(cmd, cwd=str(REPO_ROOT))
    except KeyboardInterrupt:
        return 0
