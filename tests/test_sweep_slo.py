"""A sweep's ``slo`` block: each point's SLO attainment in the dataset, the printed table and the report."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from sim.analysis.report import report
from sim.analysis.slo import SLO, parse_slos, slo_from_mapping
from sim.analysis.sweep import load_sweep, read_dataset, result_rows, run_sweep
from sim.config import scenario_from_dict
from sim.engine.cluster import simulate
from sim.errors import ConfigError

SWEEP = """\
name: slo
base: chat-api
set:
  workload.num_requests: 120
grid:
  workload.arrival.rate: [4, 40]
"""
SLO_BLOCK = """\
slo:
  ttft_p90_s: 0.3
  tpot_p90_s: 0.03
"""


def _write(tmp_path, body: str, name: str = "s.yaml"):
    f = tmp_path / name
    f.write_text(textwrap.dedent(body))
    return f


def _by_hand(requests, ttft_s: float, tpot_s: float, long_tokens: int | None = None, long_ttft_s=None):
    """Requests meeting the bounds, counted from the raw columns (not through sim.analysis.slo)."""
    rows = requests.to_pylist()
    met = []
    for r in rows:
        ttft_bound = long_ttft_s if long_tokens is not None and r["prompt_tokens"] >= long_tokens else ttft_s
        ok = r["status"] == "completed" and not r["truncated"]
        if ok:
            ok = r["first_token_s"] - r["arrival_s"] <= ttft_bound
            if r["generated_tokens"] > 1:
                ok = ok and (r["finish_s"] - r["first_token_s"]) / (r["generated_tokens"] - 1) <= tpot_s
        met.append(ok)
    return rows, np.array(met)


def test_the_mapping_reads_as_the_flags_do():
    m = slo_from_mapping({"ttft_p95_s": 0.5, "tpot_p95_s": 0.05, "long_prompt_tokens": 8192, "long": {"ttft_p95_s": 5}})
    flags = parse_slos(["ttft_p95_s=0.5", "tpot_p95_s=0.05", "long:ttft_p95_s=5"], long_prompt_tokens=8192)
    assert m == flags and m.attainment == 0.95
    assert slo_from_mapping({"ttft_s": 1, "attainment": 0.5}) == SLO(ttft_s=1.0, attainment=0.5)


@pytest.mark.parametrize(
    "data, starts",
    [
        ([1], "slo: got [1]; a mapping of latency bounds"),
        ({"ttft_p90": 1}, "slo.ttft_p90: got 1; a bound named ttft_s, tpot_s, e2e_s"),
        ({"ttft_s": "fast"}, "slo.ttft_s: got 'fast'; a finite latency bound"),
        ({"ttft_s": True}, "slo.ttft_s: got True; a finite latency bound"),
        ({"ttft_s": -1}, "slo.ttft_s: got -1; a finite latency bound"),
        (
            {"long": {"ttft_s": 2}, "ttft_s": 1},
            "slo: got 'slo.long.ttft'; bounds for long prompts with slo.long_prompt_tokens,",
        ),
        (
            {"ttft_s": 1, "long_prompt_tokens": 100},
            "slo.long_prompt_tokens: got 100; given with at least one bound for long prompts, e.g. slo.long: {ttft_p90_s: 5}",
        ),
        (
            {"ttft_s": 1, "long_prompt_tokens": 1.5, "long": {"ttft_s": 2}},
            "slo.long_prompt_tokens: got 1.5; an integer",
        ),
        (
            {"ttft_s": 1, "long_prompt_tokens": 10, "long": {"bad": 2}},
            "slo.long.bad: got 2; a bound named ttft_s, tpot_s, e2e_s, optionally",
        ),
        ({"ttft_s": 1, "long_prompt_tokens": 10, "long": 3}, "slo.long: got 3; a mapping of bounds"),
        (
            {"ttft_p90_s": 1, "tpot_p99_s": 1},
            "slo: got 'slo.ttft_p90_s, slo.tpot_p99_s'; one percentile for all bounds",
        ),
        ({"ttft_s": 1, "ttft_p90_s": 2}, "slo: got 'slo.ttft_p90_s: 2'; one bound per metric"),
        ({"ttft_s": 1, "attainment": 1.5}, "slo.attainment: got 1.5; a fraction of requests in (0, 1]"),
        ({"ttft_s": 1, "attainment": "most"}, "slo.attainment: got 'most'; a fraction"),
        ({"attainment": 0.9}, "slo: got None; at least one bound, e.g. slo: {ttft_p90_s: 0.5, tpot_p90_s: 0.05}"),
    ],
)
def test_a_bad_slo_block_is_one_line_naming_the_key(data, starts):
    with pytest.raises(ConfigError) as e:
        slo_from_mapping(data)
    assert str(e.value).startswith(starts), str(e.value)
    assert "\n" not in str(e.value)


def test_a_bad_slo_block_fails_the_sweep_before_any_point_runs(tmp_path):
    f = _write(tmp_path, SWEEP + "slo: {ttft_p90_s: 0}\n")
    with pytest.raises(ConfigError, match=r"^slo.ttft_p90_s: got 0"):
        run_sweep(f, workers=1, out=tmp_path / "ds", progress=False)
    assert not (tmp_path / "ds").exists() or not list((tmp_path / "ds").glob("part-*"))


def test_each_point_carries_its_attainment_counted_from_its_requests(tmp_path):
    f = _write(tmp_path, SWEEP + SLO_BLOCK)
    res = run_sweep(f, workers=1, out=tmp_path / "ds", progress=False)
    assert res.ok and res.slo_text == "90% of requests with TTFT ≤ 0.3 s and TPOT ≤ 0.03 s"
    t = read_dataset(tmp_path / "ds")
    seen = set()
    for point, row in zip(load_sweep(f).points(), t.to_pylist()):
        assert row["point_id"] == point.point_id
        requests = simulate(scenario_from_dict(point.scenario, base_dir=point.base_dir)).requests
        rows, met = _by_hand(requests, 0.3, 0.03)
        assert row["slo.attainment"] == pytest.approx(met.mean())
        assert row["slo.met"] == (met.mean() >= 0.9)
        missed_ttft = sum(
            r["status"] == "completed" and not r["truncated"] and r["first_token_s"] - r["arrival_s"] > 0.3
            for r in rows
        )
        assert row["slo.miss.ttft"] == pytest.approx(missed_ttft / len(rows))
        seen.add(row["slo.met"])
    assert seen == {True, False}, "the two rates should fall on either side of the SLO"
    head, cells = result_rows(t, res.axes)
    assert head[-1] == "SLO attained"
    assert {c[-1].split()[-1] for c in cells} == {"met", "missed"}
    page = report(tmp_path / "ds").read_text()
    assert "SLO: 90% of requests with TTFT ≤ 0.3 s and TPOT ≤ 0.03 s" in page


def test_two_classes_give_each_class_its_share(tmp_path):
    f = _write(
        tmp_path,
        """\
        name: classes
        base: worst-case-outliers
        set:
          workload.num_requests: 200
          workload.lengths.outlier_fraction: 0.1
        grid:
          workload.arrival.rate: [2, 8]
        slo:
          ttft_p90_s: 0.2
          tpot_p90_s: 0.05
          long_prompt_tokens: 4096
          long: {ttft_p90_s: 2}
        """,
    )
    run_sweep(f, workers=1, out=tmp_path / "ds", progress=False)
    t = read_dataset(tmp_path / "ds")
    for point, row in zip(load_sweep(f).points(), t.to_pylist()):
        requests = simulate(scenario_from_dict(point.scenario, base_dir=point.base_dir)).requests
        rows, met = _by_hand(requests, 0.2, 0.05, 4096, 2.0)
        long = np.array([r["prompt_tokens"] >= 4096 for r in rows])
        assert 0 < long.sum() < len(rows)
        assert row["slo.attainment"] == pytest.approx(met.mean())
        assert row["slo.attainment.long"] == pytest.approx(met[long].mean())
        assert row["slo.attainment.short"] == pytest.approx(met[~long].mean())
    _, cells = result_rows(t, ["workload.arrival.rate"])
    assert all("(long " in c[-1] for c in cells)


def test_the_slo_is_part_of_the_point_so_another_runs_it_again(tmp_path):
    plain = _write(tmp_path, SWEEP, "plain.yaml")
    judged = _write(tmp_path, SWEEP + SLO_BLOCK, "judged.yaml")
    other = _write(tmp_path, SWEEP + SLO_BLOCK.replace("0.3", "0.4"), "other.yaml")
    ids = [{p.point_id for p in load_sweep(f).points()} for f in (plain, judged, other)]
    assert not (ids[0] & ids[1]) and not (ids[1] & ids[2]) and not (ids[0] & ids[2])
    out = tmp_path / "ds"
    first = run_sweep(judged, workers=1, out=out, progress=False)
    assert first.ran == 2
    again = run_sweep(judged, workers=1, out=out, progress=False)
    assert again.ran == 0 and again.skipped == 2
    changed = run_sweep(other, workers=1, out=out, progress=False)
    assert changed.ran == 2 and changed.kept_apart == 2
    rows = read_dataset(out).to_pylist()
    # A looser TTFT bound: no point attains less.
    before = {
        r["workload.arrival.rate"]: r["slo.attainment"]
        for r in read_dataset(out, all_points=True).to_pylist()
        if r["point_id"] in ids[1]
    }
    for r in rows:
        assert r["slo.attainment"] >= before[r["workload.arrival.rate"]]
    # Without the block, the dataset has no SLO columns.
    run_sweep(plain, workers=1, out=tmp_path / "plain", progress=False)
    assert not [c for c in read_dataset(tmp_path / "plain").column_names if c.startswith("slo")]


_junk = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10, 10**7), st.floats(allow_nan=True), st.text(max_size=6)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=12), inner, max_size=3)),
    max_leaves=8,
)
_keys = st.sampled_from(
    ["ttft_s", "tpot_p90_s", "e2e_p99_s", "attainment", "long_prompt_tokens", "long", "ttft_p0_s", "x"]
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_junk, st.dictionaries(_keys, _junk, max_size=4)))
def test_any_slo_block_is_an_slo_or_one_line_naming_it(data):
    try:
        slo = slo_from_mapping(data)
    except ConfigError as exc:
        assert str(exc).startswith("slo") and "\n" not in str(exc), str(exc)
    else:
        assert 0 < slo.attainment <= 1 and (slo.ttft_s or slo.tpot_s or slo.e2e_s or slo.long_prompt_tokens)


def test_a_failed_point_keeps_the_table_square(tmp_path):
    f = _write(tmp_path, SWEEP.replace("[4, 40]", "[4, -1]") + SLO_BLOCK)
    res = run_sweep(f, workers=1, out=tmp_path / "ds", progress=False)
    assert len(res.failures) == 1
    head, rows = result_rows(read_dataset(tmp_path / "ds"), res.axes)
    assert all(len(r) == len(head) for r in rows)
    assert any(c.startswith("failed: ConfigError: workload.arrival.rate") for r in rows for c in r)
