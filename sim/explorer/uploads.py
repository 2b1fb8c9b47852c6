"""Untrusted uploads (:class:`UploadStore`): size limits, ``yaml.safe_load`` after refusing
anchors/aliases, schema validation with one readable line on failure (:func:`error_text`).

Nothing named in an upload is ever opened: every field that names a file, at any depth, is vetted
first — trace ``path`` keys must name a built-in trace under ``scenarios/`` or a trace uploaded in
the same session (written to a private temporary folder), ``cost_model.profile`` a built-in
profile or an uploaded one, and ``model.hf_config`` a shipped model config (:func:`resolve_paths`).
"""

from __future__ import annotations

import copy
import hashlib
import io
import math
import re
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from sim.config import SCENARIO_DIR, Scenario, file_fields, scenario_from_dict
from sim.errors import ConfigError
from sim.explorer.shipped import TRACE_EXTENSIONS, builtin_profiles, builtin_traces
from sim.inputs import decode, load_json, load_yaml, number_error
from sim.limits import MAX_SWEEP_POINTS as _MAX_DATASET_ROWS, MAX_TRACE_ROWS

#: Upload limits (bytes). Scenarios are a few hundred bytes; the largest built-in trace is ~1 MB.
MAX_SCENARIO_BYTES = 256 * 1024
MAX_UPLOAD_BYTES = 5 * 1024 * 1024
MAX_SWEEP_BYTES = 20 * 1024 * 1024
#: An uploaded sweep dataset once read (its rows are points: at most MAX_SWEEP_POINTS).
MAX_DATASET_BYTES = 256 * 1024 * 1024
#: Rows of an uploaded trace: five times the page's per-run budget (200,000 requests); ``kvsim
#: run`` reads traces of up to MAX_TRACE_ROWS (sim/limits.py).
MAX_UPLOAD_TRACE_ROWS = 1_000_000
#: Bytes of uploaded files (traces and profiles) one session keeps at a time; a file replaced by
#: an upload of the same name no longer counts.
MAX_SESSION_UPLOAD_BYTES = 64 * 1024 * 1024
#: A message shown in the page is cut to this many characters (a bad value may be huge).
MAX_MESSAGE_CHARS = 600

TRACE_FORMATS = ("auto", "azure", "mooncake", "csv", "parquet", "length_stats")


def _size(n: float) -> str:
    """Bytes in the binary units the limits are set in (5 MiB is 5,242,880 bytes, not 5.2 MB)."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} bytes"


def error_text(exc: BaseException) -> str:
    """One readable line for the page, cut to :data:`MAX_MESSAGE_CHARS`."""
    text = str(exc).strip().replace("\n", " ")
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 1] + "…"
    return text


#: What Streamlit's Markdown would read as markup in a one-line message: emphasis (``*``; ``_`` only
#: at a word's edge, as in CommonMark), code, math, strike-through (a single ``~``), links and colour
#: directives (``[``), HTML, and the escape character itself.
_MARKDOWN_SPECIAL = re.compile(r"[\\`*$~\[\]<>]|(?<!\w)_|_(?!\w)")


def plain_markdown(text: str) -> str:
    """``text`` shown as it is by a Streamlit element that renders Markdown (``st.error``, ``st.info``,
    ...): a message naming ``allocator.prefix_caching.*`` (twice) or a value with ``$`` must not turn
    into italics or math. Each markup character is backslash-escaped."""
    return _MARKDOWN_SPECIAL.sub(lambda m: "\\" + m.group(0), str(text))


def _check_size(data: bytes, limit: int, what: str) -> None:
    if len(data) > limit:
        raise ConfigError(what, f"{len(data):,} bytes", f"a file of at most {_size(limit)} ({limit:,} bytes)")
    if not data:
        raise ConfigError(what, "empty file", "a non-empty file")


def safe_yaml(data: bytes, what: str = "scenario upload") -> Any:
    """``yaml.safe_load`` of untrusted bytes: UTF-8, nested at most 64 levels (checked before PyYAML
    parses: sim/inputs.py), and without anchors or aliases (a few lines of aliases can expand into
    gigabytes once walked: the "billion laughs")."""
    text = decode(data, "the uploaded file", what, "YAML text file")
    try:
        load_yaml(text, what, "the uploaded file")  # nesting and syntax, before the event scan below
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
    """The base name of an uploaded file with only ``[A-Za-z0-9._-]`` kept, and an allowed extension
    (at most 100 characters, extension included)."""
    base = Path(str(name).replace("\\", "/")).name
    ext = next((e for e in extensions if base.lower().endswith(e)), None)
    if ext is None:
        raise ConfigError(what, name, f"a file ending in {', '.join(extensions)}")
    # The extension is split off first: leading dots are stripped (no hidden files) and long names
    # cut, and either done to the whole name would eat into it ("....csv" → "csv").
    stem = _SAFE_NAME.sub("_", base[: len(base) - len(ext)]).lstrip(".")
    if not stem:
        raise ConfigError(
            what,
            name,
            f"a file name with a name before its extension (letters, digits, '.', '_' or '-', not only "
            f"dots), such as trace{ext}",
        )
    return stem[: 100 - len(ext)] + base[len(base) - len(ext) :]


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


def resolve_paths(
    data: dict, traces: Mapping[str, Path] | None = None, profiles: Mapping[str, Path] | None = None
) -> dict:
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

    def vet_terms(node: dict, field: str, key: str) -> None:
        # No upload takes a terms file, and a path would be read from the server's disk.
        if node[field] is not None:
            raise ConfigError(
                key,
                node[field],
                "left out in the explorer: the engine's fitted preset applies here; a terms file from "
                "kvsim calibrate --from-serving-bench runs with kvsim run (engine.terms_file)",
            )

    vetters = {"profile": vet_profile, "hf_config": vet_model_config, "terms_file": vet_terms}
    names = file_fields()
    for node, field, key in list(_file_refs(out, "", names)):
        vetters.get(field, vet_trace)(node, field, key)
    return out


def resolve_scenario(
    data: dict, traces: Mapping[str, Path] | None = None, profiles: Mapping[str, Path] | None = None
) -> Scenario:
    """Validated :class:`Scenario` from a raw mapping whose file references are vetted first."""
    return scenario_from_dict(resolve_paths(data, traces, profiles), base_dir=SCENARIO_DIR)


#: Fit-quality families the Calibration page tabulates.
_FIT_FAMILIES = ("gemm", "context_attention", "generation_attention")


def _check_fit_quality(doc: Any, name: str) -> None:
    """The ``fit_quality`` section the Calibration page shows: the profile format leaves it free,
    so an upload could pass validation and still break the page's table on every rerun."""
    if not isinstance(doc, dict) or "fit_quality" not in doc:
        return
    fq = doc["fit_quality"]
    if not isinstance(fq, dict):
        raise ConfigError(f"{name}: fit_quality", fq, "a mapping of kernel family → held-out errors")
    for fam in _FIT_FAMILIES:
        if fam in fq and not isinstance(fq[fam], dict):
            raise ConfigError(f"{name}: fit_quality.{fam}", fq[fam], "a mapping (overall, groups)")
        overall = fq.get(fam, {}).get("overall")
        if overall is not None and not isinstance(overall, dict):
            raise ConfigError(f"{name}: fit_quality.{fam}.overall", overall, "a mapping of error statistics")

    def walk(node: Any, path: str, depth: int = 0) -> None:
        if depth > MAX_NESTING or not isinstance(node, dict):
            return
        for k, v in node.items():
            sub = f"{path}.{k}"
            if str(k).endswith("_rel_err") and not (
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
            ):
                raise ConfigError(f"{name}: {sub}", v, "a relative error: a finite number ≥ 0")
            walk(v, sub, depth + 1)

    walk(fq, "fit_quality")


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
    leave one empty folder per session behind. A file replaced by a new upload of the same name
    is deleted (unless the session still refers to it), and the uploaded files a session keeps
    total at most :data:`MAX_SESSION_UPLOAD_BYTES`.
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

    def _referenced(self) -> set[Path]:
        return {t.path for t in self.traces.values()} | set(self.profiles.values())

    def _discard(self, path: Path) -> None:
        """Delete an uploaded file (and its content-hash folder once empty) unless the session
        still refers to it."""
        if path in self._referenced():
            return
        path.unlink(missing_ok=True)
        try:
            path.parent.rmdir()
        except OSError:  # another name with the same content lives there, or already gone
            pass

    def stored_bytes(self) -> int:
        """Bytes of the uploaded files (traces and profiles) the session keeps."""
        if self._dir is None:
            return 0
        return sum(f.stat().st_size for sub in ("traces", "profiles") for f in (self._dir / sub).glob("*/*"))

    def _write(self, sub: str, name: str, data: bytes, replaces: Path | None = None) -> Path:
        """Keep ``data`` as ``sub/<hash>/name``; :class:`ConfigError` when the session's uploads
        would pass :data:`MAX_SESSION_UPLOAD_BYTES` (``replaces``, the file this upload would
        replace, does not count)."""
        folder = self.dir / sub / hashlib.sha256(data).hexdigest()[:16]
        path = folder / name
        if not path.is_file():
            used = self.stored_bytes() - (replaces.stat().st_size if replaces is not None and replaces.is_file() else 0)
            if used + len(data) > MAX_SESSION_UPLOAD_BYTES:
                raise ConfigError(
                    f"{sub.rstrip('s')} upload {name}",
                    f"{_size(len(data))} with {_size(used)} already uploaded",
                    f"at most {_size(MAX_SESSION_UPLOAD_BYTES)} of uploaded files per session (start a new "
                    "session, or upload under an existing name to replace that file)",
                )
        folder.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    def add_trace(self, filename: str, data: bytes, fmt: str = "auto") -> UploadedTrace:
        """Validate an uploaded trace (size, name, columns, token counts) and keep it; bad files are deleted."""
        from sim.engine.budget import EXPLORER_BUDGET
        from sim.workload.traces import TooManyRows, read_trace

        what = "trace upload"
        _check_size(data, MAX_UPLOAD_BYTES, what)
        if fmt not in TRACE_FORMATS:
            raise ConfigError(what, fmt, f"a format among {', '.join(TRACE_FORMATS)}")
        name = safe_filename(filename, TRACE_EXTENSIONS, what)
        old = self.traces.get(name)
        path = self._write("traces", name, data, old.path if old is not None else None)
        try:
            # Not cached: a validation read must not pin the trace in the process-wide cache (16
            # sessions' uploads of 10M rows held 4 GB); a run reads it again, capped by its budget.
            trace = read_trace(path, fmt, f"trace {name}", max_rows=MAX_UPLOAD_TRACE_ROWS, cache=False)
        except TooManyRows as exc:
            self._discard(path)
            raise ConfigError(
                f"trace {name}",
                name,
                f"a trace upload of at most {MAX_UPLOAD_TRACE_ROWS:,} rows ({exc.detail}; a page run draws at "
                f"most {EXPLORER_BUDGET.max_requests:,} requests; kvsim run reads traces of up to {MAX_TRACE_ROWS:,} rows)",
            ) from None
        except ConfigError as exc:
            self._discard(path)
            # The temporary path means nothing to the user: name the file they uploaded.
            raise ConfigError(f"trace {name}", name, exc.allowed) from None
        except Exception as exc:  # noqa: BLE001 - any reader failure on untrusted bytes is a bad file
            self._discard(path)
            if isinstance(exc, ValueError) and "integer string conversion" in str(exc):
                raise number_error(f"trace {name}", name, exc) from None
            raise ConfigError(f"trace {name}", name, f"a readable trace ({type(exc).__name__})") from None
        info = UploadedTrace(name, path, len(trace), trace.arrival_s is not None, fmt if fmt != "auto" else "auto")
        self.traces[name] = info
        if old is not None and old.path != path:
            self._discard(old.path)
        return info

    def add_profile(self, filename: str, data: bytes) -> str:
        """Validate an uploaded profile JSON (size, JSON, kvsim-profile schema); returns its name."""
        from sim.cost.profile import Profile
        from sim.cost.profile_format import validate_profile

        what = "profile upload"
        _check_size(data, MAX_UPLOAD_BYTES, what)
        name = safe_filename(filename, (".json",), what)
        doc = load_json(decode(data, name, what, "JSON file"), what, name)  # overlong integers said there
        validate_profile(doc, name)  # the whole format, naming the JSON path of a bad value
        _check_fit_quality(doc, name)
        Profile.from_json(doc, name, checked=True)
        key = name.removesuffix(".json")
        if key in builtin_profiles() or key in ("none", "auto"):
            key = f"uploaded-{key}"
        old = self.profiles.get(key)
        self.profiles[key] = path = self._write("profiles", name, data, old)
        if old is not None and old != path:
            self._discard(old)
        return key

    def parse_scenario(self, filename: str, data: bytes) -> dict:
        """An uploaded scenario YAML as a raw mapping, validated (schema and file references)."""
        what = "scenario upload"
        _check_size(data, MAX_SCENARIO_BYTES, what)
        safe_filename(filename, (".yaml", ".yml"), what)
        doc = safe_yaml(data, what)
        if not isinstance(doc, dict):
            raise ConfigError(what, type(doc).__name__, "a YAML mapping of sections (model, gpu, workload, ...)")
        from sim.explorer.runs import check_runnable

        sc = resolve_scenario(doc, self.trace_paths(), self.profiles)
        # The schema alone passes names that only a run looks up (model, GPU, reserve pNN): a
        # file that can never run is refused now, with the previous scenario kept, not at Run.
        try:
            check_runnable(sc)
        except ConfigError:
            raise
        except (ValueError, KeyError, LookupError) as exc:
            raise ConfigError(what, filename, f"a scenario that can run ({error_text(exc)})") from None
        return doc


def _dataset_too_big(what: str, got: str) -> ConfigError:
    return ConfigError(
        what, got, f"a dataset of at most {_MAX_DATASET_ROWS} rows and {_size(MAX_DATASET_BYTES)} once read"
    )


def _variable_width(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t)


def _read_bounded(data: bytes, filename: str, what: str) -> pa.Table:
    """A Parquet sweep dataset read batch by batch, refused as soon as its decoded size passes
    :data:`MAX_DATASET_BYTES`.

    The metadata's sizes are those of the stored (encoded) data: a dictionary-encoded string
    column holds its value once and an index per row, and reading it plainly writes the value into
    every row (a 5,763-byte upload read as 1 GB). So string and binary columns are read as
    dictionaries (what is stored), their decoded size is added up batch by batch from the
    dictionary's value lengths and the indices, and they are decoded only once the whole table is
    known to fit. Fixed-width columns take their width times the rows, known before anything is
    read. Other types (lists, structs, maps: a list of dictionary indices would repeat a value any
    number of times per row) are refused; a sweep dataset has none.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(io.BytesIO(data))
    schema = pf.schema_arrow
    rows = pf.metadata.num_rows
    variable: list[int] = []
    fixed = 0
    for i, field in enumerate(schema):
        t = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
        if _variable_width(t):
            variable.append(i)
        elif pa.types.is_null(t):
            pass
        elif pa.types.is_boolean(t):
            fixed += rows // 8 + 1
        elif pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) or pa.types.is_temporal(t):
            fixed += max(1, t.bit_width // 8) * rows
        else:
            raise ConfigError(
                what,
                f"{filename}: column {field.name!r} of type {field.type}",
                "a flat table of numbers, strings, booleans and times",
            )
    if fixed > MAX_DATASET_BYTES:
        raise _dataset_too_big(what, f"{filename}: {rows} rows, {_size(fixed)} of fixed-width columns")
    if variable:
        pf = pq.ParquetFile(io.BytesIO(data), read_dictionary=[schema.field(i).name for i in variable])
    total = fixed
    batches = []
    for batch in pf.iter_batches(batch_size=1024):
        for i in variable:
            col = batch.column(i)
            if pa.types.is_dictionary(col.type):
                lengths = pc.binary_length(col.dictionary)
                total += int(pc.sum(pc.take(lengths, col.indices)).as_py() or 0) + 8 * len(col)
            else:  # not expected (read_dictionary), counted as read
                total += col.nbytes
        if total > MAX_DATASET_BYTES:
            raise _dataset_too_big(
                what, f"{filename}: more than {_size(MAX_DATASET_BYTES)} once decoded (reading stopped)"
            )
        batches.append(batch)
    table = pa.Table.from_batches(batches) if batches else schema.empty_table()
    for i, field in enumerate(schema):  # decode what was read as dictionaries: it is known to fit
        col = table.column(i)
        if pa.types.is_dictionary(col.type) and not pa.types.is_dictionary(field.type):
            table = table.set_column(i, field, col.cast(field.type))
    return table


def read_sweep_upload(filename: str, data: bytes) -> pa.Table:
    """A sweep dataset uploaded as one Parquet file: at most :data:`MAX_DATASET_BYTES` once read,
    checked from its metadata and then while it is read (:func:`_read_bounded`)."""
    import pyarrow.parquet as pq

    what = "sweep upload"
    _check_size(data, MAX_SWEEP_BYTES, what)
    safe_filename(filename, (".parquet",), what)
    try:
        pf = pq.ParquetFile(io.BytesIO(data))
        # Rows and sizes from the metadata first: 20 MB of Parquet can hold gigabytes of rows.
        meta = pf.metadata
        size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        if meta.num_rows > _MAX_DATASET_ROWS or size > MAX_DATASET_BYTES:
            raise _dataset_too_big(what, f"{meta.num_rows} rows, {_size(size)}")
        table = _read_bounded(data, filename, what)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - untrusted bytes
        raise ConfigError(what, filename, f"a readable Parquet file ({type(exc).__name__})") from None
    if table.num_rows == 0:
        raise ConfigError(what, filename, "a dataset with at least one row")
    if not any(pa.types.is_integer(f.type) or pa.types.is_floating(f.type) for f in table.schema):
        cols = ", ".join(table.column_names[:8]) + (", …" if table.num_columns > 8 else "")
        raise ConfigError(
            what, filename, f"a dataset with at least one numeric column to plot (its columns: {cols or 'none'})"
        )
    return table
