"""Rebuild the built-in profiles in ``sim/profiles/`` from the vendored tables.

    python -m calibration.build_builtin            # all three devices
    python -m calibration.build_builtin h100_sxm   # one

Deterministic apart from the ``provenance.date`` field: same tables and library
versions give the same curves.
"""

from __future__ import annotations

import sys

from sim.profile import PROFILE_DIR

from .profile_builder import SYSTEM_PROFILE, build_profile, default_models
from .tables import DEFAULT_TABLES_DIR, load_kernel_tables

BACKEND = "trtllm"


def build(systems: list[str] | None = None) -> list[str]:
    written = []
    for system in systems or sorted(SYSTEM_PROFILE):
        kt = load_kernel_tables(DEFAULT_TABLES_DIR, system, BACKEND)
        profile = build_profile(kt, models=default_models())
        path = profile.write(PROFILE_DIR / f"{profile.name}.json")
        written.append(str(path))
        print(f"{profile.name}: {path} ({path.stat().st_size / 1e3:.0f} kB)")
    return written


if __name__ == "__main__":
    build(sys.argv[1:] or None)
