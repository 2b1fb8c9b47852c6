"""``kvsim report``: seeds averaged on the throughput–latency curves, and the ``--png`` error line.

Regression tests for defects a tester reproduced: a sweep with ``seeds: 2`` drew its TTFT-vs-throughput
trace through every seed's point, joined in throughput order, while the rate curves averaged them;
``--png`` without Chromium said "--png: got 'runs/chat'; … (RuntimeError: )", naming the run folder
and cutting kaleido's message (which starts with blank lines) to nothing.
"""

import pyarrow as pa
import pytest

pytest.importorskip("plotly")

from sim.analysis.report import sweep_figures, write_pngs  # noqa: E402
from sim.errors import ConfigError  # noqa: E402

RATE = "workload.arrival.rate"


def _sweep(rows: list[tuple]) -> pa.Table:
    cols = ["point", "status", "seed", RATE, "allocator.kind", "throughput_tokens_per_s", "ttft_s.p90", "tpot_s.p90"]
    return pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)})


def test_throughput_latency_curves_average_seeds_per_point():
    # Rates 4 and 8, two seeds each: seed 2 at rate 4 has more throughput than seed 1 at rate 8,
    # so points joined in throughput order zigzag between the rates.
    t = _sweep(
        [
            (0, "ok", 1, 4, "paged", 4600.0, 0.10, 0.010),
            (1, "ok", 2, 4, "paged", 6500.0, 0.07, 0.011),
            (2, "ok", 1, 8, "paged", 6400.0, 0.11, 0.012),
            (3, "ok", 2, 8, "paged", 8000.0, 0.08, 0.014),
        ]
    )
    figs = sweep_figures(t, [RATE])
    for name, metric in (("throughput_ttft", [0.085, 0.095]), ("throughput_tpot", [0.0105, 0.013])):
        (trace,) = figs[name].data
        assert list(trace.x) == pytest.approx([5550.0, 7200.0]), name  # mean throughput per rate, rate order
        assert list(trace.y) == pytest.approx(metric), name  # mean latency of the same seeds
    # The same means as the rate curves.
    (rate_curve,) = figs[f"ttft_s.p90_vs_{RATE}"].data
    assert list(rate_curve.y) == pytest.approx(list(figs["throughput_ttft"].data[0].y))


def test_throughput_latency_curves_average_seeds_per_series():
    t = _sweep(
        [
            (0, "ok", 1, 4, "paged", 4000.0, 0.1, 0.01),
            (1, "ok", 2, 4, "paged", 5000.0, 0.3, 0.01),
            (2, "ok", 1, 4, "static", 3000.0, 0.2, 0.02),
            (3, "ok", 2, 4, "static", 2000.0, 0.4, 0.02),
            (4, "ok", 1, 8, "paged", 7000.0, 0.5, 0.03),
            (5, "ok", 2, 8, "paged", 9000.0, 0.7, 0.03),
            (6, "failed", 1, 8, "static", None, None, None),
            (7, "ok", 2, 8, "static", 3500.0, 0.9, 0.04),
        ]
    )
    figs = sweep_figures(t, [RATE, "allocator.kind"])
    by = {tr.name: tr for tr in figs["throughput_ttft"].data}
    assert list(by["allocator.kind=paged"].x) == pytest.approx([4500.0, 8000.0])
    assert list(by["allocator.kind=paged"].y) == pytest.approx([0.2, 0.6])
    assert list(by["allocator.kind=static"].x) == pytest.approx([2500.0, 3500.0])
    assert list(by["allocator.kind=static"].y) == pytest.approx([0.3, 0.9])


def test_sweep_without_a_varying_axis_is_one_averaged_point():
    t = _sweep([(0, "ok", 1, 4, "paged", 4000.0, 0.1, 0.01), (1, "ok", 2, 4, "paged", 6000.0, 0.3, 0.03)])
    (trace,) = sweep_figures(t, [RATE])["throughput_ttft"].data
    assert list(trace.x) == pytest.approx([5000.0]) and list(trace.y) == pytest.approx([0.2])


def _failing_export(monkeypatch, exc: Exception) -> None:
    import plotly.graph_objects as go
    import plotly.io as pio

    def boom(*a, **k):
        raise exc

    monkeypatch.setattr(pio, "write_images", boom, raising=False)
    monkeypatch.setattr(go.Figure, "write_image", boom)


@pytest.mark.parametrize(
    "exc, detail",
    [
        (
            RuntimeError(
                "\n\nKaleido requires Google Chrome to be installed.\n\nEither download and install Chrome "
                "yourself,\nor install it from your terminal by running:\n\n    $ plotly_get_chrome\n\n"
            ),
            " (RuntimeError: Kaleido requires Google Chrome to be installed. Either download and install "
            "Chrome yourself, or install it from your terminal by running: $ plotly_get_chrome)",
        ),
        (RuntimeError(), ""),
    ],
)
def test_png_error_names_the_option_and_what_is_missing(monkeypatch, tmp_path, exc, detail):
    import plotly.graph_objects as go

    _failing_export(monkeypatch, exc)
    out = tmp_path / "runs-chat"
    out.mkdir()
    with pytest.raises(ConfigError) as info:
        write_pngs([go.Figure()], ["fig"], out)
    msg = str(info.value)
    assert msg == f"--png: no PNG written: kaleido needs Chromium or Chrome installed on this machine{detail}"
    assert str(out) not in msg and "got" not in msg and "()" not in msg and "RuntimeError: )" not in msg
