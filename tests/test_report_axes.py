"""``kvsim report``: which points a sweep figure puts together, and options that do not apply.

Regression tests for defects a tester reproduced:

* a heatmap cell averaged every point with its (x, y), whatever the other axes: with two workloads
  swept, a cell showed the mean of a short and a long workload's TTFT p90, a value no configuration
  had, while the page said that only seeds were averaged;
* with ``--x`` in a ``zip`` group, its partners became series: every "curve" was one point;
* ``kvsim report RUN_DIR --x nope`` ignored the sweep-only options and exited 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("plotly")

from sim.analysis import report as R  # noqa: E402
from sim.analysis.report import report, report_sweep, sweep_figures  # noqa: E402
from sim.analysis.sweep import META_FILE, run_sweep  # noqa: E402
from sim.errors import ConfigError  # noqa: E402

RATE, KIND, LENS, SEQS = "workload.arrival.rate", "allocator.kind", "workload.lengths", "scheduler.max_num_seqs"
METRICS = ("ttft_s.p90", "tpot_s.p90", "throughput_tokens_per_s")


def _table(rows: list[dict]) -> pa.Table:
    cols = ["point", "point_id", "status", "seed", *rows[0].keys(), *METRICS]
    out: dict[str, list] = {c: [] for c in dict.fromkeys(cols)}
    for i, r in enumerate(rows):
        vals = {"point": i, "point_id": f"p{i:02d}", "status": "ok", "seed": r.get("seed", 1), **r}
        ttft = vals.get("ttft_s.p90", 0.01 * (i + 1))
        vals.setdefault("ttft_s.p90", ttft)
        vals.setdefault("tpot_s.p90", ttft / 10)
        vals.setdefault("throughput_tokens_per_s", 1000.0 + 10 * i)
        for c in out:
            out[c].append(vals[c])
    return pa.table(out)


def _cells(trace) -> list[float]:
    return [v for row in trace.z for v in row if v is not None]


# --- heatmaps: one panel per combination of the other axes -----------------------------------------


def _three_axes(seeds: int = 1) -> tuple[pa.Table, dict]:
    """kind × rate × lengths (short, long), ``seeds`` each: a distinct TTFT p90 per point."""
    rows, want = [], {}
    for kind in ("static", "paged"):
        for rate in (4.0, 16.0):
            for lens, base in (("short", 0.02), ("long", 0.34)):
                vals = [base + 0.001 * rate + (0.1 if kind == "static" else 0.0) + 0.0001 * s for s in range(seeds)]
                want[(lens, kind, rate)] = sum(vals) / seeds
                for s, v in enumerate(vals):
                    rows.append({KIND: kind, RATE: rate, LENS: lens, "seed": s + 1, "ttft_s.p90": v})
    return _table(rows), want


@pytest.mark.parametrize("seeds", [1, 2])
def test_a_heatmap_cell_holds_one_configuration(seeds):
    t, want = _three_axes(seeds)
    fig = sweep_figures(t, [KIND, RATE, LENS], x=RATE, y=KIND, z=["ttft_s.p90"])["heatmap_ttft_s.p90"]
    # One panel per workload, not their mean (0.181 s where short gave 0.022 s and long 0.340 s).
    panels = {tr.name: tr for tr in fig.data}
    assert set(panels) == {f"{LENS}=short", f"{LENS}=long"}, list(panels)
    for lens in ("short", "long"):
        tr = panels[f"{LENS}={lens}"]
        got = {(y, x): v for y, row in zip(tr.y, tr.z) for x, v in zip(tr.x, row)}
        assert got == pytest.approx({(k, str(r)): v for (ln, k, r), v in want.items() if ln == lens}), lens
    # One colour scale for every panel, and the title says what was averaged.
    assert {tr.coloraxis for tr in fig.data} == {"coloraxis"}
    title = fig.layout.title.text
    assert "one panel per workload.lengths" in title, title
    assert ("mean of 2 seeds" in title) == (seeds == 2), title


def test_a_heatmap_with_nothing_else_swept_is_one_panel():
    t, _ = _three_axes()
    t = t.filter(pa.compute.equal(t.column(LENS), "long"))
    fig = sweep_figures(t, [KIND, RATE, LENS], x=RATE, y=KIND, z=["ttft_s.p90"])["heatmap_ttft_s.p90"]
    (tr,) = fig.data
    assert len(_cells(tr)) == 4 and fig.layout.title.text == f"ttft_s.p90 over {RATE} × {KIND}"


def test_too_many_panels_are_refused_on_the_figure():
    rows = [{KIND: k, RATE: r, "scheduler.max_num_seqs": n} for k in ("a", "b") for r in (1.0, 2.0) for n in range(40)]
    t = _table(rows)
    figs = sweep_figures(t, [KIND, RATE, "scheduler.max_num_seqs"], x=RATE, y=KIND)
    assert not [n for n in figs if n.startswith("heatmap_")]
    note = figs["heatmaps"].layout.title.text
    assert "40 combinations of scheduler.max_num_seqs" in note and "--x" in note and "--y" in note, note


def test_the_app_heatmap_says_when_a_cell_averages_points():
    # plots.heatmap without facets (the explorer's call) still averages what shares (x, y), and says so.
    from sim.analysis import plots

    t, _ = _three_axes()
    fig = plots.heatmap(t, RATE, KIND, "ttft_s.p90")
    assert "mean of 2 points" in fig.layout.title.text
    assert "points: %{customdata}" in fig.data[0].hovertemplate


# --- zip partners of x go with x -------------------------------------------------------------------


def _zip_rows() -> list[dict]:
    # kind × zip(rate, max_num_seqs), 2 seeds.
    rows = []
    for kind in ("static", "paged"):
        for rate, seqs in ((4.0, 64), (8.0, 128), (16.0, 256)):
            for s in (1, 2):
                ttft = rate / 100 + (0.5 if kind == "static" else 0.0) + s / 1000
                rows.append({KIND: kind, RATE: rate, SEQS: seqs, "seed": s, "ttft_s.p90": ttft})
    return rows


def _dataset(folder: Path, rows: list[dict], meta: dict) -> Path:
    folder.mkdir()
    t = _table(rows)
    pq.write_table(t, folder / "part-all.parquet")
    doc = {"name": "zip", "axes": [KIND, RATE, SEQS], "seeds": 2, "point_ids": t.column("point_id").to_pylist()}
    (folder / META_FILE).write_text(json.dumps({**doc, **meta}))
    return folder


def _report_figs(monkeypatch, folder: Path, **kw) -> dict[str, object]:
    seen: dict[str, object] = {}
    real = R.sweep_figures

    def spy(*a, **k):
        seen.update(real(*a, **k))
        return seen

    monkeypatch.setattr(R, "sweep_figures", spy)
    report_sweep(folder, **kw)
    return seen


def test_the_zip_partner_of_x_goes_with_x(tmp_path, monkeypatch):
    d = _dataset(tmp_path / "ds", _zip_rows(), {"zip": [[RATE, SEQS]]})
    figs = _report_figs(monkeypatch, d)
    for name in (f"ttft_s.p90_vs_{RATE}", "throughput_ttft", "throughput_tpot"):
        traces = figs[name].data
        assert sorted(tr.name for tr in traces) == [f"{KIND}=paged", f"{KIND}=static"], name
        for tr in traces:
            assert len(tr.x) == 3, (name, tr.name)  # a curve of 3 rates, seeds averaged
            assert [s.split(f"{SEQS}=")[1].split(",")[0] for s in tr.text] == ["64", "128", "256"], tr.text
    (tr,) = [t for t in figs[f"ttft_s.p90_vs_{RATE}"].data if t.name == f"{KIND}=static"]
    assert list(tr.x) == [4.0, 8.0, 16.0]
    assert list(tr.y) == pytest.approx([0.5415, 0.5815, 0.6615])
    # The heatmap's rows are the other axis, not the partner; its columns name the partner.
    (heat,) = figs["heatmap_ttft_s.p90"].data
    assert list(heat.y) == ["paged", "static"]
    assert list(heat.x) == ["4.0 (max_num_seqs=64)", "8.0 (max_num_seqs=128)", "16.0 (max_num_seqs=256)"]


def test_an_older_sweep_json_without_zip_groups_still_reports(tmp_path, monkeypatch):
    d = _dataset(tmp_path / "ds", _zip_rows(), {})
    figs = _report_figs(monkeypatch, d)
    assert len(figs[f"ttft_s.p90_vs_{RATE}"].data) == 6  # not known to be paired: a series each
    assert (d / "report.html").is_file()


def test_a_damaged_zip_record_is_one_line(tmp_path):
    d = _dataset(tmp_path / "ds", _zip_rows(), {"zip": "rate"})
    with pytest.raises(ConfigError, match="zip"):
        report_sweep(d)


def test_sweep_json_records_the_zip_groups(tmp_path):
    f = tmp_path / "sw.yaml"
    f.write_text(
        textwrap.dedent(f"""
        base: chat-api
        set: {{workload.num_requests: 10}}
        grid:
          {KIND}: [static, paged]
        zip:
          {RATE}: [4, 8]
          {SEQS}: [64, 128]
    """)
    )
    out = tmp_path / "ds"
    assert run_sweep(f, workers=1, out=out, progress=False).ok
    meta = json.loads((out / META_FILE).read_text())
    assert meta["axes"] == [KIND, RATE, SEQS]
    assert meta["zip"] == [[RATE, SEQS]]


# --- sweep options on a run -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from sim.config import load_scenario
    from sim.engine.cluster import simulate
    from sim.output.results import write_run

    d = tmp_path_factory.mktemp("run")
    write_run(simulate(load_scenario("chat-api", {"workload.num_requests": 20})), d)
    return d


@pytest.mark.parametrize("kw, option", [({"x": "nope"}, "--x"), ({"y": RATE}, "--y"), ({"z": ["ttft_s.p90"]}, "--z")])
def test_sweep_options_on_a_run_are_refused(run_dir, tmp_path, kw, option):
    with pytest.raises(ConfigError) as info:
        report(run_dir, out=tmp_path / "rep", **kw)
    assert str(info.value).startswith(f"{option}: got "), info.value
    assert "only for a sweep dataset" in str(info.value) and str(run_dir) in str(info.value)
    assert not (tmp_path / "rep").exists()


def test_sweep_options_on_a_run_are_one_line_exit_2(run_dir, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "sim.cli.report", str(run_dir), "--x", "nope", "--z", "nothing", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --x: got 'nope'; only for a sweep dataset"), r.stderr
    assert not (tmp_path / "report.html").exists()
