"""The kvsim-profile file format (``"format": "kvsim-profile"``, version 1 or 2), validated as a whole.

:func:`validate_profile` checks a parsed profile document against :class:`ProfileDoc`, a pydantic
model of every part the cost model reads (see :mod:`sim.cost.profile` for their meaning):

* every number anywhere in the document is finite (no ``NaN``, ``Infinity``), and no ``true`` or
  ``false`` stands for one;
* times and latencies are >= 0, bandwidths > 0, ``cpu_overhead.by_tp`` is keyed by GPU counts;
* curves (``gemm``, ``allreduce``, ``memory.curves``, ``custom_allreduce``) have x strictly
  increasing and > 0 with one time > 0 per x, at least two points; grids (``context_attention``,
  ``generation_attention``) have strictly increasing positive axes and a positive time per cell;
* fitted kernel families (``kernels``, version 2) have a parametric form with positive launch
  latency and rates and ``p > 1``, strictly increasing grid axes, and a packed correction whose
  shape matches its axes (its bytes are checked when unpacked).

Keys the cost model does not read (provenance, notes, fit statistics) may hold anything finite.
The first problem is one :class:`~sim.errors.ConfigError` line naming the file and the JSON path
of the bad value, e.g. ``error: p.json: memory.latency_s: got -1.0; a finite number >= 0``. It runs
when a profile is loaded, never while a run prices a batch.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator, model_validator

from sim.errors import ConfigError

FORMAT = "kvsim-profile"
VERSION = 2
READABLE = (1, 2)

Seconds = Annotated[float, Strict(), Field(ge=0)]
Positive = Annotated[float, Strict(), Field(gt=0)]
Number = Annotated[float, Strict()]
Fraction = Annotated[float, Strict(), Field(ge=0, lt=1)]


class _Part(BaseModel):
    # Keys beyond the ones the cost model reads are kept (notes, sources, fit statistics).
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class _At(ValueError):
    """A problem inside a validated part: its location below the part, and the bad value."""

    def __init__(self, loc: tuple, value: Any, allowed: str):
        super().__init__(allowed)
        self.loc, self.value = loc, value


def _count_keys(v: dict, what: str) -> dict:
    """``v`` if its keys are counts (``"1"``, ``"16"``): GPU counts, block sizes."""
    for k in v:
        if not re.fullmatch(r"[1-9]\d*", k):
            raise _At((k,), k, f"keys that are {what} (integers >= 1)")
    return v


def _increasing(values: list[float], what: str) -> None:
    for i in range(1, len(values)):
        if not values[i] > values[i - 1]:
            raise _At((what, i), values[i], f"{what} strictly increasing ({what}[{i - 1}] is {values[i - 1]:g})")


class Curve(_Part):
    """Seconds vs one positive coordinate."""

    x: list[Positive] = Field(min_length=2)
    t_s: list[Positive] = Field(min_length=2)

    @model_validator(mode="after")
    def _shape(self):
        _increasing(self.x, "x")
        if len(self.t_s) != len(self.x):
            raise _At(("t_s",), f"{len(self.t_s)} values", f"one t_s per x ({len(self.x)})")
        return self


class Grid(_Part):
    """Seconds vs (batch, length)."""

    batch: list[Positive] = Field(min_length=2)
    length: list[Positive] = Field(min_length=2)
    t_s: list[list[Positive]]

    @model_validator(mode="after")
    def _shape(self):
        _increasing(self.batch, "batch")
        _increasing(self.length, "length")
        if len(self.t_s) != len(self.batch) or any(len(row) != len(self.length) for row in self.t_s):
            shape = f"{len(self.t_s)} rows of {sorted({len(r) for r in self.t_s})} values"
            raise _At(
                ("t_s",), shape, f"{len(self.batch)} rows (one per batch) of {len(self.length)} times (one per length)"
            )
        return self


class Memory(_Part):
    latency_s: Seconds
    bandwidth_bytes_per_s: Positive
    host_latency_s: Seconds
    host_bandwidth_bytes_per_s: Positive
    alloc_event_s: Seconds
    curves: dict[str, Curve] = {}


class Elementwise(_Part):
    kernels_per_layer: Annotated[float, Strict(), Field(ge=0)]
    latency_s: Seconds
    bandwidth_bytes_per_s: Positive


class Layout(_Part):
    # A contiguous layout divides decode attention by 1 + paged_overhead.
    paged_overhead: Annotated[float, Strict(), Field(gt=-1)]
    measured_block_size: Annotated[int, Strict(), Field(ge=1)] | None = None
    paged_overhead_by_block_size: dict[str, Annotated[float, Strict(), Field(gt=-1)]] = {}

    @field_validator("paged_overhead_by_block_size")
    @classmethod
    def _block_sizes(cls, v: dict) -> dict:
        return _count_keys(v, "block sizes")


class DeltaCurve(_Part):
    seqs: list[Annotated[float, Strict(), Field(ge=1)]] = Field(min_length=1)
    delta_s: list[Annotated[float, Strict(), Field(gt=-1, lt=1)]] = Field(min_length=1)

    @model_validator(mode="after")
    def _shape(self):
        _increasing(self.seqs, "seqs")
        if len(self.delta_s) != len(self.seqs):
            raise _At(("delta_s",), f"{len(self.delta_s)} values", f"one delta_s per seqs ({len(self.seqs)})")
        return self


class CpuOverheadTP(_Part):
    intercept_s: Seconds
    per_seq_s: Seconds
    batch_range: list[Number] = Field(min_length=2, max_length=2)
    after_prefill_s: list[Fraction] = []
    per_seq_delta_s: DeltaCurve | None = None
    mixed_per_decode_s: Fraction = 0.0

    @field_validator("batch_range")
    @classmethod
    def _range(cls, v: list[float]) -> list[float]:
        if not 0 <= v[0] <= v[1]:
            raise _At((), v, "[low, high] batch sizes with 0 <= low <= high")
        return v


class CpuOverhead(_Part):
    by_tp: dict[str, CpuOverheadTP] = Field(min_length=1)

    @field_validator("by_tp")
    @classmethod
    def _gpus(cls, v: dict) -> dict:
        return _count_keys(v, "GPU counts")


class Roofline(_Part):
    launch_s: Positive
    p: Annotated[float, Strict(), Field(gt=1)]

    @model_validator(mode="after")
    def _rates(self):
        extra = self.model_extra or {}
        rates = {k: v for k, v in extra.items() if k.endswith("_per_s")}
        if not rates:
            raise _At(("flops_per_s",), _Nothing(), "at least one work rate (<term>_per_s)")
        for k, v in rates.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise _At((k,), v, "a rate > 0")
        return self


class PackedCorrection(_Part):
    shape: list[Annotated[int, Strict(), Field(ge=1)]] = Field(min_length=1)
    step: Positive


class KernelGroup(_Part):
    roofline: Roofline
    axes_log: list[list[Number]] = Field(min_length=1)
    correction: PackedCorrection

    @model_validator(mode="after")
    def _axes(self):
        for i, ax in enumerate(self.axes_log):
            if not ax:
                raise _At(("axes_log", i), ax, "a non-empty axis")
            for j in range(1, len(ax)):
                if not ax[j] > ax[j - 1]:
                    raise _At(("axes_log", i, j), ax[j], "axis values strictly increasing")
        if [len(a) for a in self.axes_log] != list(self.correction.shape):
            raise _At(
                ("correction", "shape"), self.correction.shape, f"the axes' lengths {[len(a) for a in self.axes_log]}"
            )
        return self


class KernelFamily(_Part):
    kind: Literal["gemm", "context_attention", "generation_attention"]
    groups: dict[str, KernelGroup] = Field(min_length=1)


class Dtypes(_Part):
    weight: list[str] = Field(min_length=1)
    kv: list[str] = Field(min_length=1)
    #: user weight dtype -> the GEMM table's dtype group
    weight_tables: dict[str, str] = {}
    #: user KV dtype -> [context group [attn dtype, kv dtype, head_dim], generation group [kv dtype, head_dim]]
    kv_tables: dict[str, list[list[str | int]]] = {}

    @field_validator("kv_tables")
    @classmethod
    def _pairs(cls, v: dict) -> dict:
        for k, pair in v.items():
            if len(pair) != 2 or len(pair[0]) != 3 or len(pair[1]) != 2:
                raise _At((k,), pair, "[[attn dtype, kv dtype, head_dim], [kv dtype, head_dim]]")
        return v


class MoeKernel(_Part):
    """One fitted fused mixture-of-experts kernel (``sim/cost/moe.py``)."""

    latency_s: float = Field(ge=0)
    per_expert_s: float = Field(ge=0)
    bandwidth_bytes_per_s: float = Field(gt=0)
    flops: float = Field(gt=0)
    #: The table's own curves of the shapes it measured: seconds vs tokens.
    shapes: dict[str, Curve] = {}


class MlaKernel(_Part):
    """One fitted multi-head latent attention kernel (``sim/cost/mla.py``)."""

    latency_s: float = Field(ge=0)
    per_item_s: float = Field(ge=0)
    bandwidth_bytes_per_s: float = Field(gt=0)
    flops: float = Field(gt=0)


class ProfileDoc(_Part):
    format: Literal["kvsim-profile"]
    version: Literal[1, 2]
    name: str = Field(min_length=1)
    device: dict[str, Any]
    provenance: dict[str, Any] = {}
    fit_quality: dict[str, Any] = {}
    models: dict[str, Any] = {}
    dtypes: Dtypes
    memory: Memory
    elementwise: Elementwise
    layout: Layout
    cpu_overhead: CpuOverhead
    allreduce: dict[str, Curve] = {}
    gemm: dict[str, Curve]
    context_attention: dict[str, Grid]
    generation_attention: dict[str, Grid]
    kernels: dict[str, dict[str, KernelFamily]] = {}
    kernel_defaults: dict[str, str] = {}
    custom_allreduce: dict[str, dict[str, Curve]] = {}
    #: Fused MoE kernels: {backend: {weight dtype: constants}}.
    moe: dict[str, dict[str, MoeKernel]] = {}
    #: MLA attention kernels: {backend: {"generation" | "context": {KV dtype: constants}}}.
    mla: dict[str, dict[Literal["generation", "context"], dict[str, MlaKernel]]] = {}

    @field_validator("device")
    @classmethod
    def _peaks(cls, v: dict) -> dict:
        # The roofline divides by these: a 0 would price every kernel at infinity, and a run would
        # end with no request finished instead of an error.
        for k in ("peak_bf16_flops", "hbm_bandwidth"):
            x = v.get(k, _Nothing())
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0:
                raise _At((k,), x, "a number > 0 (FLOP/s or bytes/s)")
        for k in ("peak_fp8_flops", "peak_fp4_flops"):
            x = v.get(k)
            if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float)) or x < 0):
                raise _At((k,), x, "a number >= 0 (FLOP/s; 0 or null: none)")
        return v

    @field_validator("allreduce")
    @classmethod
    def _gpus(cls, v: dict) -> dict:
        return _count_keys(v, "GPU counts")

    @field_validator("custom_allreduce")
    @classmethod
    def _engine_gpus(cls, v: dict) -> dict:
        for per in v.values():
            _count_keys(per, "GPU counts")
        return v


def json_path(loc: tuple) -> str:
    """``('gemm', '4096x4096:bf16', 't_s', 3)`` → ``gemm["4096x4096:bf16"].t_s[3]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(part)):
            out += f".{part}" if out else str(part)
        else:
            out += f"[{str(part)!r}]".replace("'", '"')
    return out or "(the document)"


class _Nothing:
    def __repr__(self) -> str:
        return "nothing"


def _non_finite(node: Any, loc: tuple = ()) -> tuple[tuple, Any] | None:
    """The location and value of the first NaN or infinity anywhere in a JSON document."""
    todo = [(node, loc)]
    while todo:
        value, at = todo.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return at, value
        if isinstance(value, dict):
            todo.extend((v, (*at, k)) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            todo.extend((v, (*at, i)) for i, v in reversed(list(enumerate(value))))
    return None


_MESSAGES = {
    "missing": "a required key",
    "finite_number": "a finite number",
    "float_type": "a number",
    "int_type": "an integer",
    "dict_type": "a JSON object",
    "list_type": "a JSON array",
    "string_type": "a string",
    "literal_error": None,
    "too_short": None,
    "greater_than": None,
    "greater_than_equal": None,
    "less_than": None,
}


def validate_profile(doc: Any, source: str) -> ProfileDoc:
    """``doc`` as a :class:`ProfileDoc`, or a :class:`ConfigError` naming ``source`` and the JSON path."""
    if not isinstance(doc, dict):
        raise ConfigError(source, type(doc).__name__, f'a JSON object with "format": "{FORMAT}"')
    if doc.get("format") != FORMAT:
        raise ConfigError(f"{source}: format", doc.get("format", _Nothing()), f'"{FORMAT}" (not a kvsim profile)')
    if doc.get("version") not in READABLE or isinstance(doc.get("version"), bool):
        raise ConfigError(
            f"{source}: version",
            doc.get("version", _Nothing()),
            f"profile format version {' or '.join(map(str, READABLE))}",
        )
    try:
        json.dumps(doc, allow_nan=False)  # C speed; the walk below only runs to find a bad value
        bad = None
    except (ValueError, TypeError):
        bad = _non_finite(doc)
    if bad is not None:
        raise ConfigError(f"{source}: {json_path(bad[0])}", bad[1], "a finite number (no NaN or Infinity in a profile)")
    try:
        parsed = ProfileDoc.model_validate(doc)
    except ValidationError as err:
        e = err.errors()[0]
        loc = tuple(e["loc"])
        value = _Nothing() if e["type"] == "missing" else e.get("input")
        msg = _MESSAGES.get(e["type"]) or e["msg"].removeprefix("Value error, ")
        at = (e.get("ctx") or {}).get("error")
        if isinstance(at, _At):
            loc, value, msg = loc + at.loc, at.value, str(at)
        msg = msg.replace("Input should be", "a value").replace("List should have", "a list with")
        raise ConfigError(f"{source}: {json_path(loc)}", value, f"{msg} (kvsim-profile v{VERSION})") from None
    _check_pricing(parsed, source)
    return parsed


#: The kernel families every model is priced with: fitted (``kernels``) or baked (same-named curves).
PRICED_FAMILIES = ("gemm", "context_attention", "generation_attention")


def _restore(key: str) -> str:
    return f"copy {key} back from the profile this file came from, or rebuild the file with kvsim calibrate"


def _check_pricing(doc: ProfileDoc, source: str) -> None:
    """A profile that names fitted kernel families it does not hold, or holds neither fitted families
    nor baked curves, can price no model: one line naming the file, the missing key and what to do."""
    if not doc.kernels and not any(getattr(doc, f) for f in PRICED_FAMILIES):
        listed = f" of the {len(doc.models)} it lists under models" if doc.models else ""
        raise ConfigError(
            f"{source}: kernels",
            _Nothing(),
            f"fitted kernel families ({{engine: {{gemm, context_attention, generation_attention}}}}, kvsim-profile "
            f"v{VERSION}) or baked curves in gemm, context_attention and generation_attention: the file has "
            f"neither, so it prices no model{listed}; " + _restore('"kernels" (and "kernel_defaults")'),
        )
    for family in PRICED_FAMILIES:
        backend = doc.kernel_defaults.get(family)
        if backend is None or family in doc.kernels.get(backend, {}) or getattr(doc, family):
            continue
        where = "kernels" if not doc.kernels else f"kernels.{backend}" if backend not in doc.kernels else None
        where = where or f"kernels.{backend}.{family}"
        have = ", ".join(f"{b} ({', '.join(sorted(fams))})" for b, fams in sorted(doc.kernels.items()))
        raise ConfigError(
            f"{source}: {where}",
            _Nothing(),
            f"the fitted {family} family of engine {backend!r} that kernel_defaults.{family} names (the file has "
            f"no baked {family} curves to price with instead); kernels holds {have or 'nothing'}; "
            + _restore(f'"{where}"'),
        )
