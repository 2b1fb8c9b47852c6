"""Which cost profile priced a run: the ``cost_model_profile`` block of ``summary.json`` (and ``plan.json``).

The block tells a built-in profile from a profile file, and two calibrations apart even when they
carry the same ``name``: ``kind`` (``builtin``, ``file`` or ``roofline``), ``requested`` (the
``cost_model.profile`` value as given), ``path`` (a file's path as given), the profile's ``name`` and
``device``, its provenance ``date``, ``method`` and ``source``, and ``sha256`` (the first 16 hex
digits of the SHA-256 of the file's bytes). Nothing in it depends on when or where the run ran, so
the same scenario and seed still write the same ``summary.json``.

:func:`profile_source` reads the file (before a run, so the hash is that of the bytes the run loads);
:func:`cost_profile_block` turns it into the block once the run says whether a profile priced it
(``cost_model: profile: auto`` falls back to the roofline prior where the GPU's profile does not
cover the model).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.errors import ConfigError

if TYPE_CHECKING:
    from sim.config import Scenario

#: The scenario key the block describes (errors reading the file are the run's to report).
KEY = "cost_model.profile"
#: Hex digits of the SHA-256 kept: enough to tell calibrations apart, short enough to read.
HASH_DIGITS = 16
#: The block's keys, present in every kind (``None`` where they do not apply).
FIELDS = ("kind", "requested", "path", "name", "device", "date", "method", "source", "sha256")


def _requested(sc: Scenario) -> str | None:
    ref = sc.cost_model.profile
    return None if ref in (None, "none") else ref


def _resolve(sc: Scenario) -> tuple[str, Path, str | None] | None:
    """``(kind, file, path as given)`` of the profile ``sc`` asks for, resolved as the run resolves it
    (``sim.engine.deployment.Deployment.make_cost_model`` and ``sim.cost.profile``: an existing file
    first, else a built-in name; ``auto``: the GPU's built-in profile); None for none."""
    from sim.cost.profile import PROFILE_DIR
    from sim.inputs import is_file

    ref = _requested(sc)
    if ref is None:
        return None
    if ref == "auto":
        from sim.catalog import BUILTIN_PROFILE_FOR_GPU

        # ``gpu.name`` holds the catalog name (or ``custom``, which no built-in profile covers).
        name = BUILTIN_PROFILE_FOR_GPU.get(sc.gpu.name)
        return None if name is None else ("builtin", PROFILE_DIR / f"{name}.json", None)
    if is_file(ref):
        return "file", Path(ref), ref
    builtin = PROFILE_DIR / f"{ref}.json"
    return ("builtin", builtin, None) if is_file(builtin) else None


def _text(value: Any) -> Any:
    """A provenance value as strict JSON holds it (a hand-written profile may hold anything there)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def profile_source(sc: Scenario) -> dict | None:
    """The profile file ``sc`` asks for, read now: the block's fields but ``kind`` is the file's
    (``builtin`` or ``file``) whether or not the run ends up using it. None when the scenario asks
    for no profile, or the file cannot be read (the run reports why)."""
    from sim.inputs import decode, load_json, read_bytes

    try:
        found = _resolve(sc)
        if found is None:
            return None
        kind, path, given = found
        data = read_bytes(path, KEY, "profile JSON file")
        doc = load_json(decode(data, str(path), KEY, "profile JSON file"), KEY, str(path))
    except ConfigError:
        return None
    if not isinstance(doc, dict):
        doc = {}
    raw = doc.get("provenance")
    prov: dict = raw if isinstance(raw, dict) else {}
    device = doc.get("device")
    device_name = device.get("name") if isinstance(device, dict) else None
    return {
        "kind": kind,
        "requested": sc.cost_model.profile,
        "path": given,
        "name": _text(doc.get("name")),
        "device": _text(device_name if device_name is not None else prov.get("device")),
        "date": _text(prov.get("date")),
        "method": _text(prov.get("method")),
        "source": _text(prov.get("source")),
        "sha256": hashlib.sha256(data).hexdigest()[:HASH_DIGITS],
    }


def roofline_block(sc: Scenario) -> dict:
    """The block of a run priced by the roofline prior (no profile: ``none``, or ``auto`` on a GPU
    or model no built-in profile covers)."""
    return {**dict.fromkeys(FIELDS), "kind": "roofline", "requested": sc.cost_model.profile}


def cost_profile_block(sc: Scenario, calibrated: bool, source: dict | None = None) -> dict:
    """The ``cost_model_profile`` block of a run of ``sc``; ``calibrated``: whether a profile priced
    it (``summary["cost_model_calibrated"]``); ``source``: :func:`profile_source` taken before the
    run (read now when None)."""
    if not calibrated:
        return roofline_block(sc)
    if source is None:
        source = profile_source(sc)
    if source is None:
        # The file went away (or became unreadable) since the run read it: say what was asked for.
        from sim.cost.profile import list_profiles

        ref = sc.cost_model.profile
        builtin = ref == "auto" or ref in list_profiles()
        return {
            **dict.fromkeys(FIELDS),
            "kind": "builtin" if builtin else "file",
            "requested": ref,
            "path": None if builtin else ref,
        }
    return dict(source)


def with_cost_profile(summary: dict, sc: Scenario, source: dict | None = None) -> dict:
    """``summary`` with its ``cost_model_profile`` block filled in (see the module docstring); what the
    run itself put there (``name``, ``date``, ``source`` of the profile it loaded) is kept where the
    file no longer says."""
    block = cost_profile_block(sc, bool(summary.get("cost_model_calibrated")), source)
    ran = summary.get("cost_model_profile")
    if isinstance(ran, dict):
        block = {**block, **{k: v for k, v in ran.items() if block.get(k) is None}}
    return {**summary, "cost_model_profile": block}


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
