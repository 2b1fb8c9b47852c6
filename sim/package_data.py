"""Where the data shipped with kvsim lives: the built-in scenarios, traces and model configs are the
package ``sim.scenarios`` (the repository's ``scenarios/``, mapped by ``pyproject.toml``), found
through the package so that a wheel finds them outside a checkout."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _scenario_dir() -> Path:
    try:
        return Path(str(importlib.resources.files("sim.scenarios")))
    except ModuleNotFoundError:
        # A checkout used without installing (PYTHONPATH=.): the folder next to sim/.
        return REPO_ROOT / "scenarios"


SCENARIO_DIR = _scenario_dir()
