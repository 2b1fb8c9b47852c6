"""Rebuild the built-in profiles in ``sim/profiles/`` from the vendored tables.

    python -m calibration.build_builtin            # every system (h100_sxm h200_sxm a100_sxm b200_sxm l40s)
    python -m calibration.build_builtin h100_sxm   # one
    python -m calibration.build_builtin cpu        # cpu-reference: times kernels on THIS machine (torch, ~3 min)

Deterministic apart from the ``provenance.date`` field: same tables and library
versions give the same curves.
"""

from __future__ import annotations

import sys

from sim.cost.profile import PROFILE_DIR

from .profile_builder import SYSTEM_PROFILE, build_profile, default_models, engine_kernels
from .tables import DEFAULT_TABLES_DIR, load_kernel_tables

BACKEND = "trtllm"
#: Decode attention comes from SGLang's tables: they cover the same KV-head counts (1-64) and are
#: much smoother than TensorRT-LLM's (held-out p95 11-12 % vs 22-30 %; docs/calibration.md).
GENERATION_BACKEND = "sglang"
#: Systems whose decode attention comes from another backend. B200: SGLang's table mixes two
#: regimes at 1-2 KV heads that the fitted form cannot follow (held-out median 5.8 %, p95 52 %),
#: TensorRT-LLM's fits like the Hopper tables do (median 2.1 %, p95 20 %).
GENERATION_BACKEND_FOR = {"b200_sxm": "trtllm"}
#: Systems whose profiles also carry each serving engine's own kernels (vLLM, SGLang, TensorRT-LLM):
#: every GPU whose tables hold them.
ENGINE_SYSTEMS = ("h100_sxm", "h200_sxm", "a100_sxm", "b200_sxm", "l40s")


def builtin_tables(system: str):
    """The tables a built-in profile is fitted from (the held-out tests score exactly these)."""
    return load_kernel_tables(
        DEFAULT_TABLES_DIR, system, BACKEND, GENERATION_BACKEND_FOR.get(system, GENERATION_BACKEND)
    )


def build_cpu_reference() -> str:
    """``cpu-reference``: route 1 (torch kernel timing) on this machine for tiny-llama, full grids, 1 thread."""
    from sim.catalog import get_model

    from .kernels import calibrate_device, write_outputs

    model = get_model("tiny-llama")
    result = calibrate_device("cpu", model, quick=False, name="cpu-reference")
    files = write_outputs(result, PROFILE_DIR / "cpu-reference.json", model, report=False)
    print(f"cpu-reference: {files['profile']} ({result.elapsed_s:.0f} s), raw timings {files['measurements']}")
    return str(files["profile"])


def build(systems: list[str] | None = None) -> list[str]:
    written = []
    if systems and "cpu" in systems:
        written.append(build_cpu_reference())
        systems = [s for s in systems if s != "cpu"]
        if not systems:
            return written
    for system in systems or sorted(SYSTEM_PROFILE):
        kt = builtin_tables(system)
        engines = engine_kernels(DEFAULT_TABLES_DIR, system, kt.system) if system in ENGINE_SYSTEMS else None
        profile = build_profile(kt, models=default_models(), engines=engines)
        path = profile.write(PROFILE_DIR / f"{profile.name}.json")
        written.append(str(path))
        print(f"{profile.name}: {path} ({path.stat().st_size / 1e3:.0f} kB)")
    return written


if __name__ == "__main__":
    build(sys.argv[1:] or None)
