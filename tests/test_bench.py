"""The deterministic benchmark counter (``python -m bench opcount``) counts the same every run."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository's bench/ package

from bench.opcount import count  # noqa: E402


def test_opcount_is_deterministic_and_names_the_engine():
    a = count("bench-1m", 60)
    b = count("bench-1m", 60)
    assert a["bytecodes_per_request"] == b["bytecodes_per_request"] > 100
    assert a["top"] == b["top"]
    assert any(t["function"].startswith("replica.py:") for t in a["top"])
    assert 1 <= a["sim_events_per_request"] < 10
