"""Which cost profile priced a run: the ``cost_model_profile`` block of ``summary.json`` (and ``plan.json``).

The block tells a built-in profile from a profile file, and two calibrations apart even when they
carry the same ``name``: ``kind`` (``builtin``, ``file`` or ``roofline``), ``requested`` (the
``cost_model.profile`` value as given), ``path`` (a file's path as given), the profile's ``name`` and
``device``, its provenance ``date``, ``method`` and ``source``, and ``sha256`` (the first 16 hex
digits of the SHA-256 of the file's bytes). Nothing in it depends on when or where the run ran, so
the same scenario and seed still write the same ``summary.json``.

:func:`cost_model_block` builds it from the cost model that priced the run
(``sim.cost.profile_model.ProfileCostModel.provenance``: the hash is that of the exact bytes the cost model
parsed, the file is not read again), so ``simulate()``'s summary, and with it ``kvsim run``, sweep
points and the explorer's runs, all carry the same block; ``cost_model: profile: auto`` that falls
back to the roofline prior (the GPU's profile does not cover the model) gets :func:`roofline_block`.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sim.config import Scenario
    from sim.cost.model import CostModel

#: Hex digits of the SHA-256 kept: enough to tell calibrations apart, short enough to read.
HASH_DIGITS = 16
#: The block's keys, present in every kind (``None`` where they do not apply).
FIELDS = ("kind", "requested", "path", "name", "device", "date", "method", "source", "sha256")


def _text(value: Any) -> Any:
    """A provenance value as strict JSON holds it (a hand-written profile may hold anything there)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def roofline_block(sc: Scenario) -> dict:
    """The block of a run priced by the roofline prior (no profile: ``none``, or ``auto`` on a GPU
    or model no built-in profile covers)."""
    return {**dict.fromkeys(FIELDS), "kind": "roofline", "requested": sc.cost_model.profile}


def _unknown_block(sc: Scenario) -> dict:
    """The block of a calibrated run whose cost model says nothing of a file (a profile built in
    memory, or a summary written before the block existed): what was asked for."""
    from sim.cost.profile import list_profiles

    ref = sc.cost_model.profile
    builtin = ref == "auto" or ref in list_profiles()
    return {
        **dict.fromkeys(FIELDS),
        "kind": "builtin" if builtin else "file",
        "requested": ref,
        "path": None if builtin else ref,
    }


def profile_block(sc: Scenario, ran: dict | None) -> dict:
    """The block of a calibrated run of ``sc`` from its cost model's ``profile_provenance()`` (``ran``:
    kind, path, name, device, date, method, source, the full hex sha256, and any ``substitutions``)."""
    if not isinstance(ran, dict):
        return _unknown_block(sc)
    block = {**dict.fromkeys(FIELDS), **{k: _text(v) for k, v in ran.items() if k in FIELDS}}
    if block["kind"] is None:
        block = {**_unknown_block(sc), **{k: v for k, v in block.items() if v is not None}}
    block["requested"] = sc.cost_model.profile
    if isinstance(block["sha256"], str):
        block["sha256"] = block["sha256"][:HASH_DIGITS]
    extra = {k: v for k, v in ran.items() if k not in FIELDS}  # substitutions: as the cost model says
    return {**block, **extra}


def cost_model_block(sc: Scenario, cost: CostModel) -> dict:
    """The ``cost_model_profile`` block of a run of ``sc`` priced by ``cost`` (see the module docstring)."""
    if not cost.calibrated:
        return roofline_block(sc)
    return profile_block(sc, cost.profile_provenance())


def with_cost_profile(summary: dict, sc: Scenario) -> dict:
    """``summary`` with a complete ``cost_model_profile`` block: the one its run wrote (from the cost
    model that priced it, see :func:`cost_model_block`) as is; for an older summary, the block told
    from what it says (nothing is read again)."""
    ran = summary.get("cost_model_profile")
    if isinstance(ran, dict) and ran.get("kind") is not None and "requested" in ran:
        return summary
    if not summary.get("cost_model_calibrated"):
        return {**summary, "cost_model_profile": roofline_block(sc)}
    return {**summary, "cost_model_profile": profile_block(sc, ran)}


def describe_block(block: Any) -> str | None:
    """One line for a ``cost_model_profile`` block (``kvsim run``'s table); None for an older
    summary's block that lacks ``kind``."""
    if not isinstance(block, dict) or block.get("kind") is None:
        return None
    if block["kind"] == "roofline":
        why = " (auto: no built-in profile covers this GPU and model)" if block.get("requested") == "auto" else ""
        return f"roofline prior, no profile{why}"
    what = f"file {block.get('path')}" if block["kind"] == "file" else "built-in"
    facts = [f"{block.get('name')}" + (f" ({block['device']})" if block.get("device") else "")]
    if block.get("date"):
        facts.append(str(block["date"]))
    if block.get("sha256"):
        facts.append(f"sha256 {block['sha256']}")
    return f"{what}: {', '.join(facts)}"
