"""The values people edit in Explore (model, GPU, traffic, lengths, allocator, scheduler, cost model).

:func:`knobs_from_scenario` reads them out of a scenario; :func:`overrides_from_knobs` turns edited
widget values back into dotted overrides (only those that changed, so keys a scenario left unset
stay unset); :func:`edited_scenario_yaml` writes the result as YAML that ``kvsim run`` accepts.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from sim.catalog import MODELS
from sim.config import LengthsConfig, LengthSplitConfig, Scenario, apply_overrides, scenario_from_dict, sub_model
from sim.errors import ConfigError
from sim.hf_config import shipped_models

#: The routers the sidebar offers: every ``router`` the scenario takes.
ROUTERS: tuple[str, ...] = typing.get_args(Scenario.model_fields["router"].annotation)

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
    "poisson": ("rate", "max_concurrency"),
    "gamma": ("rate", "cv", "max_concurrency"),
    "trace": ("path", "format", "time_scale", "max_concurrency"),
    "closed_loop": ("concurrency", "think_time_s"),
}
#: The client cap's widget value when it is switched on and the scenario set none (the closed
#: loop's default number of clients, so switching kinds keeps a comparable load in flight).
DEFAULT_CLIENT_CAP = 16
_ALL_LENGTH_FIELDS = sorted({f for v in LENGTH_KNOBS.values() for f in v})
_ALL_ARRIVAL_FIELDS = sorted({f for v in ARRIVAL_KNOBS.values() for f in v})


def allocator_fields() -> list[str]:
    """Scalar ``allocator.*`` keys (nested sections such as compaction are left to the YAML)."""
    from sim.config import AllocatorConfig

    return [f for f, info in AllocatorConfig.model_fields.items() if f != "kind" and sub_model(info.annotation) is None]


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
        "router": sc.router,
        "length_split.prompt_tokens": sc.length_split.prompt_tokens,
        # The pool as the count it is at this replica count (a scenario may give it as a share).
        "length_split.replicas": sc.length_split.long_replicas(max(sc.gpu.replicas, 2)),
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


def reserve_value(v: Any) -> Any:
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
    router = knobs.get("router", ref["router"])
    relevant = [
        k
        for k in ref
        if not k.startswith(("workload.arrival.", "workload.lengths.", "allocator."))
        # The long-prompt pool only with its router (the hidden widgets keep their values).
        and (router == "length_split" or not k.startswith("length_split."))
    ]
    relevant += ["allocator.kind"] + [f"allocator.{f}" for f in allocator_knobs(alloc_kind)]
    relevant += ["workload.arrival.kind"] + [f"workload.arrival.{f}" for f in ARRIVAL_KNOBS.get(arrival_kind, ())]
    relevant += ["workload.lengths.kind"] + [f"workload.lengths.{f}" for f in LENGTH_KNOBS.get(lengths_kind, ())]
    out: dict[str, Any] = {}
    base_lengths_none = ref["workload.lengths.kind"] == "trace" and (
        (base.workload.lengths is None)
        if isinstance(base, Scenario)
        else not isinstance((base.get("workload") or {}).get("lengths"), dict)
    )
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
            out[k] = reserve_value(v) if k == "allocator.reserve" else v
            continue
        if k == "allocator.reserve":
            v = reserve_value(v)
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
    picked = out.get("model.name")
    if picked is not None and picked not in MODELS and picked in shipped_models():
        # A shipped Hugging Face config picked in the page: the config is the model.
        out["model.hf_config"], out["model.name"] = picked, None
    elif "model.name" in out and base_hf is not None:
        out["model.hf_config"] = None  # a catalog model picked in the page replaces the config's model
    if isinstance(out.get("workload.num_requests"), float):
        out["workload.num_requests"] = int(out["workload.num_requests"])
    if "length_split.replicas" in out:
        base_split = base.length_split if isinstance(base, Scenario) else (base.get("length_split") or {})
        share = base_split.share if isinstance(base_split, LengthSplitConfig) else base_split.get("share")
        if share is not None:
            out["length_split.share"] = None  # the page sets a count, which replaces the scenario's share
    return out


def model_choices() -> list[str]:
    """The page's model picker: catalog names, then the Hugging Face configs shipped with kvsim."""
    return [*MODELS, *shipped_models()]


#: Model fields a scenario may pin that describe one checkpoint, not the deployment.
_CHECKPOINT_DTYPES = ("weight_dtype", "kv_dtype")


def edited_scenario(base: dict, knobs: Mapping[str, Any]) -> dict:
    """The raw scenario mapping after the knob edits (file references still as the user named them).

    Picking another model drops the dtypes the base scenario pinned (unless edited in the page),
    as ``kvsim run --model`` does by replacing the model section: a ``bf16`` pinned for the base
    scenario's model would otherwise simulate an FP8 checkpoint with bf16 weights.
    """
    ref = scenario_from_dict(base)
    overrides = overrides_from_knobs(knobs, ref)
    data = apply_overrides(base, overrides)
    if ("model.name" in overrides or "model.hf_config" in overrides) and isinstance(data.get("model"), dict):
        for f in _CHECKPOINT_DTYPES:
            if f"model.{f}" not in overrides:
                data["model"].pop(f, None)
    # A kind picked in the page drops the fields only other kinds read: a trace path left over from
    # an empirical base would otherwise travel into the YAML download and into error messages.
    for section, table in (("lengths", LENGTH_KNOBS), ("arrival", ARRIVAL_KNOBS)):
        kind = overrides.get(f"workload.{section}.kind")
        node = (data.get("workload") or {}).get(section)
        if kind is None or not isinstance(node, dict):
            continue
        own = set(table.get(kind, ()))
        for f in {f for k, fields in table.items() if k != kind for f in fields} - own:
            node.pop(f, None)
    return data


def edited_scenario_yaml(
    base: dict,
    knobs: Mapping[str, Any],
    uploaded_traces: Sequence[str] = (),
    uploaded_profiles: Mapping[str, Any] | None = None,
) -> str:
    """YAML of the edited scenario, runnable by ``kvsim run`` (validated first). ``uploaded_profiles``
    (name → file of the session's uploaded profiles): a ``cost_model.profile`` naming one is written
    as its file name, a path ``kvsim run`` opens (relative to the folder it runs in), since the
    upload's name alone is neither a built-in profile nor a file there."""
    data = edited_scenario(base, knobs)
    scenario_from_dict(data)
    head = "# Edited in the kvsim explorer; run with: kvsim run <this file>\n"
    if uploaded_traces:
        head += "# Uploaded traces referenced here must sit next to this file: " + ", ".join(uploaded_traces) + "\n"
    profile = (data.get("cost_model") or {}).get("profile")
    if uploaded_profiles and isinstance(profile, str) and profile in uploaded_profiles:
        file = Path(str(uploaded_profiles[profile])).name
        data = {**data, "cost_model": {**data["cost_model"], "profile": file}}
        head += f"# Uploaded profile referenced here: run kvsim from the folder that holds {file}\n"
    return head + yaml.safe_dump(data, sort_keys=False)


#: The parts of a scenario :func:`changed_sections` names, in the order of the scenario file.
_SECTION_ORDER = (
    "router",
    "length_split",
    "model",
    "gpu",
    "workload",
    "workload.arrival",
    "workload.lengths",
    "scheduler",
    "allocator",
    "cost_model",
    "seed",
)


def _section_of(key: str) -> str:
    for nested in ("workload.arrival.", "workload.lengths."):
        if key.startswith(nested):
            return nested[:-1]
    return key.split(".", 1)[0]


def changed_sections(base: Scenario | dict, knobs: Mapping[str, Any]) -> list[str]:
    """The parts of ``base`` (``model``, ``gpu``, ``workload.arrival``, ``allocator``, ``seed`` ...)
    that the knobs changed, in the scenario file's order; empty when the knobs still say what
    ``base`` says. Read from :func:`overrides_from_knobs`, so it counts what a run would change."""
    found = {_section_of(k) for k in overrides_from_knobs(knobs, base)}
    return [s for s in _SECTION_ORDER if s in found] + sorted(found - set(_SECTION_ORDER))


def scenario_caption(label: str, base: dict, knobs: Mapping[str, Any]) -> str:
    """The Explore page's line about the scenario on screen (Markdown).

    A scenario file's ``description`` speaks of the file's own model, GPU and traffic; once the
    knobs change any of them it would describe a scenario that is no longer the one that runs, so
    the line then says which parts changed and marks the description as the file's as loaded."""
    from sim.explorer.uploads import plain_markdown

    desc = str(base.get("description") or "").strip()
    try:
        changed = changed_sections(base, knobs)
    except ConfigError:  # the page shows the error where it runs the scenario
        changed = []
    head = f"Scenario **{plain_markdown(label)}**"
    if changed:
        head += f", changed in the sidebar ({', '.join(changed)})"
        if desc:
            head += f" — as loaded: {plain_markdown(desc)}"
    elif desc:
        head += f" — {plain_markdown(desc)}"
    return head + "  ·  edit the knobs in the sidebar, then run."
