"""The accuracy a plan states (``sim/analysis/accuracy.py``) is the one docs/calibration.md tables,
and it names the group a scenario serves when that group was measured."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sim.analysis.accuracy import ALL_ROWS, LEAVE_ONE_GROUP_OUT, accuracy_line
from sim.catalog import GPUS, MODELS

DOC = Path(__file__).resolve().parent.parent / "docs" / "calibration.md"


def _doc_rows() -> dict[str, tuple[int, float, float]]:
    """Rows of the leave-one-group-out table: label → (rows, TTFT, TPOT median |error|)."""
    text = DOC.read_text().split("### Accuracy against real servers", 1)[1]
    out = {}
    for line in text.splitlines():
        m = re.match(r"\| ([^|]+?) \| (\d+) \| ([\d.]+) % \| [^|]+ \| ([\d.]+) % \|", line)
        if m:
            out.setdefault(m.group(1), (int(m.group(2)), float(m.group(3)) / 100, float(m.group(4)) / 100))
    return out


def test_the_figures_are_the_documented_ones():
    rows = _doc_rows()
    for g in LEAVE_ONE_GROUP_OUT:
        assert rows[g.label] == (g.rows, pytest.approx(g.ttft), pytest.approx(g.tpot)), g.label
        assert g.model in MODELS and g.gpu in GPUS
    overall = next(v for k, v in rows.items() if k.startswith("all (rows within"))
    assert overall == (sum(g.rows for g in LEAVE_ONE_GROUP_OUT), pytest.approx(ALL_ROWS[0]), pytest.approx(ALL_ROWS[1]))


def test_a_measured_group_is_named_with_its_figures():
    line = accuracy_line("qwen3-32b", "bf16", "H100-SXM-80GB", "trtllm", True, None)
    assert "trtllm serving qwen3-32b on H100-SXM-80GB is one of those groups: 9.7 % / 7.2 %" in line
    assert "17.7 %" in line and "6.5 %" in line


def test_an_unmeasured_group_gets_its_engines_groups_and_the_overall_figure():
    line = accuracy_line("llama-3.1-8b", "bf16", "H200-SXM-141GB", "vllm", True, None)
    assert "is not one of those groups" in line and "expect the overall figures or worse" in line
    # vLLM's two groups, the flagged one marked as such.
    assert "qwen3-32b on H100-SXM-80GB: 8.4 % / 9.3 %" in line
    assert "llama-3.1-8b fp8 on H200-SXM-141GB: 133.9 % / 109.9 % (looks mis-measured" in line
    # The fp8 checkpoint is its own group: bf16 weights on the same GPU are not it.
    assert "is one of those groups" in accuracy_line("llama-3.1-8b", "fp8", "H200-SXM-141GB", "vllm", True, None)


def test_uncalibrated_reference_and_own_terms_say_so():
    assert "roofline prior" in accuracy_line("llama-3.1-8b", "bf16", "A10G-24GB", "vllm", False, None)
    assert "kvsim validate" in accuracy_line("tiny-llama", "bf16", "cpu", "reference", True, None)
    own = accuracy_line("llama-3.1-8b", "bf16", "H100-SXM-80GB", "vllm", True, "runs/terms.json")
    assert "runs/terms.json" in own and "is one of those groups" not in own
