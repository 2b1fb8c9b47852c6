"""The guide's situations are data (scenarios/guide/*.yaml): they load, and a mistake in one
fails on load with the file, the key, the value and what is allowed."""

from __future__ import annotations

import shutil

import pytest

from sim.analysis.guide.claims import CHECKS
from sim.analysis.guide.render import COLUMNS
from sim.analysis.guide.situations import GUIDE_DIR, load_situations, read_situation
from sim.errors import ConfigError


def test_builtin_situations_load_in_guide_order():
    sits = load_situations()
    assert [s.number for s in sits][:3] == ["1", "2", "3"] and [s.number for s in sits][-2:] == ["12a", "12b"]
    assert all(s.key == s.scenario for s in sits)
    used_checks = {c.check_name for s in sits for c in s.claims}
    used_columns = {c.value for s in sits for c in s.columns}
    assert used_checks == set(CHECKS), f"checks no claim uses: {set(CHECKS) - used_checks}"
    assert used_columns == set(COLUMNS), f"columns no situation uses: {set(COLUMNS) - used_columns}"


def _broken(tmp_path, old: str, new: str, name: str = "long-context.yaml"):
    d = tmp_path / "guide"
    d.mkdir()
    text = (GUIDE_DIR / name).read_text()
    assert old in text, old
    (d / name).write_text(text.replace(old, new, 1))
    return d / name


@pytest.mark.parametrize(
    "old, new, key, allowed",
    [
        ("check: long_gate", "check: long_gat", "claims.0.check", "one of"),
        (
            "{static: static, dynamic: dynamic-chunk}",
            "{static: static, dynamic: dynamic-chunks}",
            "claims.0.variants.dynamic",
            "a variant of this situation",
        ),
        ("{static: static, dynamic: dynamic-chunk}", "{static: static}", "claims.0.variants", "exactly the arguments"),
        (
            "others: [dynamic-token, dynamic-chunk, paged]",
            "others: paged",
            "claims.1.variants.others",
            "a list of variant names",
        ),
        ("value: kv_at_gate_gib", "value: kv_at_gate", "columns.0.value", "one of"),
        ("- name: paged-zero", "- name: paged", "variants.4.name", "no other variant"),
        ("slo: {ttft_s: 15.0", "slo: {ttft_s: -1", "slo.ttft_s", "greater than 0"),
        ("scenario: long-context", "scenario: long-contex", "scenario", "scenarios/"),
        ("title:", "titel:", "titel", "unknown key"),
    ],
)
def test_a_mistake_names_file_key_value_and_what_is_allowed(tmp_path, old, new, key, allowed):
    path = _broken(tmp_path, old, new)
    with pytest.raises(ConfigError) as e:
        read_situation(path)
    assert e.value.key == f"long-context.yaml: {key}", str(e.value)
    assert allowed in e.value.allowed, str(e.value)


def test_a_column_argument_is_checked(tmp_path):
    path = _broken(
        tmp_path,
        "value: long_request_e2e_p99, reference: paged}",
        "value: long_request_e2e_p99, referenc: paged}",
        "worst-case-outliers.yaml",
    )
    with pytest.raises(ConfigError, match="worst-case-outliers.yaml: columns.0.referenc"):
        read_situation(path)


def test_duplicate_numbers_are_refused(tmp_path):
    d = tmp_path / "guide"
    d.mkdir()
    shutil.copy(GUIDE_DIR / "small-batch.yaml", d)
    (d / "other.yaml").write_text((GUIDE_DIR / "small-batch.yaml").read_text())
    with pytest.raises(ConfigError, match="number"):
        load_situations(d)


def test_recommendation_quotes_goodput_per_gpu_and_attainment_as_the_table_does():
    """The reasons' goodputs are per GPU, as the headline and the table's column: on a
    four-replica situation a deployment figure would read 4× the table's."""
    import re

    from sim.analysis.guide import recommendation, run_situation

    r = run_situation("shared-prefix", num_requests=60)
    assert {run.gpus for run in r.runs.values()} == {4}
    rec = recommendation(r)
    quoted = [
        (name, float(g))
        for reason in rec["reasons"]
        for g, name in re.findall(r"goodput ([\d.]+) req/s vs (\S+) [\d.]+ req/s", reason)
    ]
    others = re.findall(r"vs (\S+) ([\d.]+) req/s", " ".join(rec["reasons"]))
    assert quoted and others
    best = r.runs[rec["candidate"]]
    for _, g in quoted:
        assert g == pytest.approx(best.goodput_per_gpu, rel=5e-3)
    for name, g in others:
        if name in r.runs:
            assert float(g) == pytest.approx(r.runs[name].goodput_per_gpu, rel=5e-3)
    assert f"{best.attainment * 100:.1f}% of requests meet the SLO" in rec["text"]
