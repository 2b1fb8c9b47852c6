"""``kvsim app``: ``streamlit run app.py`` (:func:`app_command`)."""

from __future__ import annotations

import subprocess
import sys

from sim.explorer.uploads import MAX_SWEEP_BYTES
from sim.package_data import REPO_ROOT

APP_PATH = REPO_ROOT / "app.py"


def app_command(extra_args: list[str] | None = None) -> int:
    """``kvsim app``: run ``streamlit run <repo>/app.py`` and return its exit status."""
    try:
        import streamlit  # noqa: F401
    except ImportError:
        sys.stderr.write("error: the explorer needs streamlit and plotly: pip install 'kvsim[app]'\n")
        return 2
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP_PATH),
        "--server.maxUploadSize",
        str(max(1, MAX_SWEEP_BYTES // (1024 * 1024))),
        *(extra_args or []),
    ]
    try:
        return subprocess.call(cmd, cwd=str(REPO_ROOT))
    except KeyboardInterrupt:
        return 0
