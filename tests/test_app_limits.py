"""The explorer page declines charts a dataset would make too large (AppTest, headless)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")
from streamlit.testing.v1 import AppTest  # noqa: E402

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def test_sweeps_page_declines_a_heatmap_of_many_distinct_values(monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("KVSIM_APP_PREWARM", "0")
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.radio(key="page").set_value("Sweeps & plan").run()
    n = 300  # 90,000 heatmap cells; distinct colours past the cap too
    t = pa.table({"workload.a": range(n), "workload.b": range(n), "ttft_s.p99": [1.0] * n})
    buf = io.BytesIO()
    pq.write_table(t, buf)
    at.file_uploader(key="sweep_upload").upload("h.parquet", buf.getvalue(), "application/octet-stream")
    at.run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    notes = " ".join(i.value for i in at.info)
    assert "Heatmap not drawn" in notes and "300 distinct values" in notes and "bin" in notes
    # The default colour is the other axis: 300 lines, declined too.
    assert "Curves not drawn" in notes and len(at.get("plotly_chart")) == 0
    at.selectbox(key="sw_color").set_value("(none)").run()
    assert len(at.get("plotly_chart")) == 1  # the curves (one line), still no heatmap


def test_sweeps_page_heatmap_has_a_panel_per_other_axis_instead_of_averaging_over_it(monkeypatch):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("KVSIM_APP_PREWARM", "0")
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.radio(key="page").set_value("Sweeps & plan").run()
    rows = [(k, r, lens) for k in ("paged", "static") for r in (5.0, 10.0) for lens in ("short", "long")]
    t = pa.table(
        {
            "status": ["ok"] * len(rows),
            "allocator.kind": [k for k, _, _ in rows],
            "workload.arrival.rate": [r for _, r, _ in rows],
            "workload.lengths.kind": [lens for _, _, lens in rows],
            # short and long prompts differ tenfold: a cell averaging them would show neither.
            "ttft_s.p99": [r * (10.0 if lens == "long" else 1.0) for _, r, lens in rows],
        }
    )
    buf = io.BytesIO()
    pq.write_table(t, buf)
    at.file_uploader(key="sweep_upload").upload("h.parquet", buf.getvalue(), "application/octet-stream")
    at.run()
    at.selectbox(key="sw_hx").set_value("workload.arrival.rate").run()
    at.selectbox(key="sw_hy").set_value("allocator.kind").run()
    at.selectbox(key="sw_hz").set_value("ttft_s.p99").run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    heat = json.loads(at.get("plotly_chart")[-1].proto.spec)
    assert "one panel per workload.lengths.kind" in heat["layout"]["title"]["text"]
    cells = sorted(v for tr in heat["data"] for row in tr["z"] for v in row)
    assert cells == sorted(t.column("ttft_s.p99").to_pylist())  # every point its own cell, none averaged
