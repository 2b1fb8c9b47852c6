"""Self-contained HTML reports (plotly.js inlined: the file opens offline) for runs and sweeps.

``kvsim report RUN_DIR`` — latency CDFs, KV reserved/used/free over time, fragmentation over
time, queue length, iteration latency. ``kvsim report SWEEP_DIR`` — throughput–latency
curves, metric-vs-axis curves and heatmaps over two axes (``--x``, ``--y``; a panel per
combination of the other axes, so that only seeds are averaged). ``--png`` also
writes one PNG per figure through kaleido (needs Chromium or Chrome on the machine).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sim.errors import ConfigError
from sim.output.results import replace_file
from sim.output.staging import out_dir

#: Heatmap metrics when ``--z`` is not given.
DEFAULT_Z = ("ttft_s.p90", "tpot_s.p90", "throughput_tokens_per_s", "kv_token_utilization", "slo.attainment")
_STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:.9em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}.fig{margin:1.5em 0}"""


def write_html(
    path: str | Path,
    title: str,
    figs: Sequence,
    intro_html: str = "",
    table: tuple[list[str], list[list[str]]] | None = None,
) -> Path:
    """One HTML page: a title, optional intro and table, then the figures. plotly.js is
    inlined once, with the first figure, so the page needs no network."""
    path = Path(path)
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
        intro_html,
    ]
    if table is not None:
        head, rows = table
        parts.append(
            "<table><tr>"
            + "".join(f"<th>{html.escape(h)}</th>" for h in head)
            + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
            + "</table>"
        )
    for i, fig in enumerate(figs):
        parts.append(
            "<div class='fig'>"
            + fig.to_html(full_html=False, include_plotlyjs=(i == 0), config={"displaylogo": False})
            + "</div>"
        )
    parts.append("</body></html>")
    text = "\n".join(parts)
    replace_file(path, lambda p: p.write_text(text, encoding="utf-8"))
    return path


def write_pngs(figs: Sequence, names: Sequence[str], out: Path, width: int = 1100, height: int = 500) -> list[Path]:
    """PNG of each figure via kaleido (Chromium/Chrome must be installed); ``height`` unless the
    figure sets its own (a heatmap of several panels)."""
    import plotly.io as pio

    paths = [out / f"{n}.png" for n in names]
    heights = [getattr(getattr(f, "layout", None), "height", None) or height for f in figs]
    try:
        if hasattr(pio, "write_images"):  # plotly ≥ 6.1: one browser for all figures
            pio.write_images(list(figs), paths, width=width, height=heights)
        else:  # pragma: no cover - older plotly
            for f, p, h in zip(figs, paths, heights):
                f.write_image(p, width=width, height=h)
        # The batch export can return with some figures unwritten when the browser is slow to
        # answer (seen on a loaded 2-core host): those are exported once more, one at a time.
        for f, p, h in zip(figs, paths, heights):
            if not p.is_file():
                f.write_image(p, width=width, height=h)
        missing = [p.name for p in paths if not p.is_file()]
        if missing:
            raise RuntimeError(f"no image written for {', '.join(missing)}")
    except Exception as exc:
        raise PngExportError(exc) from None
    return paths


class PngExportError(ConfigError):
    """``--png`` wrote no image: the message names the option and what is missing (the kaleido
    package, or the Chromium/Chrome it drives), then the exporter's own words where it gave any."""

    def __init__(self, exc: Exception):
        import importlib.util

        if importlib.util.find_spec("kaleido") is None:
            missing = "the kaleido package is not installed (pip install 'kvsim[report]')"
        else:
            missing = "kaleido needs Chromium or Chrome installed on this machine"
        # Kaleido's message starts with blank lines and spans several: one line, bounded.
        detail = " ".join(str(exc).split())
        if len(detail) > 300:
            detail = detail[:299] + "…"
        self.key, self.value, self.allowed = "--png", True, missing
        ValueError.__init__(
            self, f"--png: no PNG written: {missing}" + (f" ({type(exc).__name__}: {detail})" if detail else "")
        )


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


# --- runs -----------------------------------------------------------------------------


def is_run_dir(d: Path) -> bool:
    return (d / "requests.parquet").is_file() and (d / "timeseries.parquet").is_file()


def is_sweep_dir(d: Path) -> bool:
    from sim.analysis.sweep import META_FILE

    return (d / META_FILE).is_file() or any(d.glob("part-*.parquet"))


def run_figures(requests: pa.Table, timeseries: pa.Table) -> dict[str, object]:
    from sim.analysis import plots

    return {
        "latency_cdf": plots.latency_cdf(requests),
        "kv_memory": plots.kv_memory(timeseries),
        "fragmentation": plots.fragmentation(timeseries),
        "queue_length": plots.queue_length(timeseries),
        "step_latency": plots.step_latency(timeseries),
    }


def _json_file(path: Path, what: str) -> dict:
    """A JSON object from a folder the user names, bounded (size, UTF-8, nesting: sim/inputs.py)."""
    from sim.inputs import load_json, read_text

    doc = load_json(read_text(path, str(path), what), str(path), str(path))
    if not isinstance(doc, dict):
        raise ConfigError(str(path), type(doc).__name__, f"a JSON object ({what} as kvsim writes it)")
    return doc


def report_run(run_dir: str | Path, png: bool = False, out: str | Path | None = None) -> Path:
    d = Path(run_dir)
    summary = _json_file(d / "summary.json", "run summary.json") if (d / "summary.json").is_file() else {}
    figs = run_figures(pq.read_table(d / "requests.parquet"), pq.read_table(d / "timeseries.parquet"))
    if isinstance(summary.get("step_time_breakdown"), dict):  # kvsim run --step-breakdown
        from sim.analysis.plots import step_breakdown

        figs["step_breakdown"] = step_breakdown(summary["step_time_breakdown"])
    rows = []
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        if key in summary:
            rows.append([key, *(_fmt(summary[key].get(c)) for c in ("p50", "p90", "p99", "mean"))])
    facts = [
        (k, summary.get(k))
        for k in (
            "completed",
            "rejected",
            "truncated",
            "preemptions",
            "throughput_tokens_per_s",
            "throughput_requests_per_s",
            "kv_token_utilization",
            "kv_memory_utilization",
            "busy_fraction",
            "cost_model",
        )
        # Truncated requests count as completed (SLO misses): named where there are any.
        if k in summary and (k != "truncated" or summary[k])
    ]
    intro = ""
    if summary:
        cal = "" if summary.get("cost_model_calibrated") else " (UNCALIBRATED roofline prior)"
        intro = (
            f"<p>scenario <b>{html.escape(str(summary.get('scenario')))}</b>, allocator "
            f"<b>{html.escape(str(summary.get('allocator')))}</b>, cost model "
            f"{html.escape(str(summary.get('cost_model')))}{cal}</p><p>"
            + ", ".join(f"{html.escape(k)}: {html.escape(_fmt(v))}" for k, v in facts)
            + "</p>"
        )
    out = out_dir(out) if out else d
    path = write_html(
        out / "report.html",
        f"kvsim run: {summary.get('scenario', d.name)}",
        list(figs.values()),
        intro,
        (["latency", "p50", "p90", "p99", "mean"], rows) if rows else None,
    )
    if png:
        write_pngs(list(figs.values()), list(figs), out)
    return path


# --- sweeps ---------------------------------------------------------------------------


def _varying_axes(table: pa.Table, axes: list[str]) -> list[str]:
    return [a for a in axes if a in table.column_names and len(set(table.column(a).to_pylist())) > 1]


def _numeric(table: pa.Table, col: str) -> bool:
    return pa.types.is_integer(table.schema.field(col).type) or pa.types.is_floating(table.schema.field(col).type)


def metric_columns(table: pa.Table, axes: Sequence[str]) -> list[str]:
    """The numeric columns of a sweep dataset a heatmap can show (``--z``): not the axes, nor the
    point's index and seed."""
    return [c for c in table.column_names if c not in {"point", "seed", *axes} and _numeric(table, c)]


def _column_list(cols: Sequence[str]) -> str:
    """Column names for an error line, percentile families folded (``ttft_s.{p50,p90,p99,mean}``)
    so that every name fits in it."""
    groups: dict[str, list[str]] = {}
    for c in cols:
        head, _, tail = c.rpartition(".")
        if head and tail in ("p50", "p90", "p99", "mean"):
            groups.setdefault(head + ".", []).append(tail)
        else:
            groups.setdefault(c, [])
    return ", ".join(f"{h}{{{','.join(t)}}}" if t else h for h, t in groups.items()) or "-"


def _with_series(table: pa.Table, axes: list[str]) -> tuple[pa.Table, str | None, list | None]:
    """Add a ``series`` column naming the combination of ``axes`` (None when there are none), and
    the order to draw the series in (each axis's values in order, numbers as numbers)."""
    from sim.analysis.plots import sort_key

    if not axes:
        return table, None, None
    cols = [table.column(a).to_pylist() for a in axes]
    combos = sorted(set(zip(*cols)), key=lambda c: tuple(sort_key(v) for v in c))
    if len(axes) == 1:
        return table, axes[0], [c[0] for c in combos]

    def label(vals: tuple) -> str:
        return ", ".join(f"{a.split('.')[-1]}={v}" for a, v in zip(axes, vals))

    labels = [label(vals) for vals in zip(*cols)]
    return table.append_column("series", pa.array(labels, pa.string())), "series", [label(c) for c in combos]


def _partners(zips: Sequence[Sequence[str]], col: str | None, vary: Sequence[str]) -> list[str]:
    """The varying axes paired with ``col`` in a ``zip`` group of the sweep."""
    return [a for g in zips if col in g for a in g if a != col and a in vary]


def sweep_figures(
    table: pa.Table,
    axes: list[str],
    x: str | None = None,
    y: str | None = None,
    z: Sequence[str] | None = None,
    zips: Sequence[Sequence[str]] = (),
) -> dict[str, object]:
    """Throughput–latency curves, metric-vs-``x`` curves and heatmaps over (``x``, ``y``).

    Only points that differ in nothing but their seed are averaged: a curve per combination of the
    varying axes other than ``x``, a heatmap panel per combination of those other than ``x`` and
    ``y``. ``zips``: the sweep's ``zip`` groups (axis names); an axis paired with ``x`` (``y``)
    goes along with it, named on hover and in its labels, instead of making series or panels of its own.
    """
    from sim.analysis import plots

    for name, col in (("--x", x), ("--y", y)):
        if col is not None and col not in table.column_names:
            raise ConfigError(name, col, f"a column of the sweep dataset; axes: {', '.join(axes) or '-'}")
    # Checked before any figure: a text column (rejected_by_reason is JSON) fails deep in plotting,
    # where the error could only say the dataset was unreadable.
    metrics = metric_columns(table, axes)
    for metric in z or ():
        if metric not in metrics:
            raise ConfigError("--z", metric, f"a numeric column of the sweep dataset ({_column_list(metrics)})")
    vary = _varying_axes(table, axes)
    if x is None:
        num = [a for a in vary if _numeric(table, a)]
        x = (
            "workload.arrival.rate"
            if "workload.arrival.rate" in vary
            else (num[0] if num else (vary[0] if vary else None))
        )
    with_x = _partners(zips, x, vary)
    if y is None:
        rest = [a for a in vary if a != x and a not in with_x]
        y = rest[0] if rest else None
    figs: dict[str, object] = {}
    ok = table
    if "status" in table.column_names:
        import pyarrow.compute as pc

        ok = table.filter(pc.equal(table.column("status"), "ok"))
    if ok.num_rows == 0 or "ttft_s.p90" not in ok.column_names:
        return figs
    # Curves: one line per combination of the axes other than x (and x's zip partners), seeds
    # averaged: a throughput–latency point is the mean throughput and mean latency of the seeds of
    # one x (the swept axis), drawn in x order, as the metric-vs-x curves average them.
    t_series, color, order = _with_series(ok, [a for a in vary if a != x and a not in with_x])
    for metric, name in (("ttft_s.p90", "throughput_ttft"), ("tpot_s.p90", "throughput_tpot")):
        figs[name] = plots.sweep_curves(
            t_series, "throughput_tokens_per_s", metric, color, by=x or "", with_by=with_x, order=order
        )
    if x is not None:
        for metric in ("ttft_s.p90", "tpot_s.p90", "throughput_tokens_per_s", *_slo_metrics(ok)):
            figs[f"{metric}_vs_{x}"] = plots.sweep_curves(t_series, x, metric, color, with_by=with_x, order=order)
    if any(c.startswith("step_share.") for c in ok.column_names):
        figs["step_shares"] = plots.step_shares(ok, vary)
    if x is not None and y is not None:
        shown = {x, y, *with_x, *_partners(zips, y, vary)}
        facets = [a for a in vary if a not in shown]
        for metric in z or [m for m in DEFAULT_Z if m in ok.column_names]:
            try:
                figs[f"heatmap_{metric}"] = plots.heatmap(
                    ok, x, y, metric, facets=facets, x_with=with_x, mean_of="seeds", max_panels=plots.MAX_PANELS
                )
            except plots.TooManyValues as exc:
                # Said once, where the heatmaps would be: or read the dataset and draw the rows you want.
                figs["heatmaps"] = (
                    plots.graph_objects()
                    .Figure()
                    .update_layout(
                        title=f"{exc} (kvsim report --x, --y; or read_dataset and plots.heatmap of the rows you want)"
                    )
                )
                break
    return figs


def _slo_metrics(table: pa.Table) -> list[str]:
    """The SLO attainment columns of a sweep run with an ``slo`` (none without): all requests', then
    each prompt class's."""
    return [c for c in ("slo.attainment", "slo.attainment.short", "slo.attainment.long") if c in table.column_names]


def _slo_text(data: object) -> str | None:
    """:meth:`SLO.describe` of the SLO a sweep's ``_sweep.json`` records (``None``: none, or not one kvsim wrote)."""
    from sim.analysis.slo import SLO

    try:
        return SLO(**data).describe() if isinstance(data, dict) else None
    except (TypeError, ValueError):
        return None


def _zip_groups(meta: dict, where: str) -> list[list[str]]:
    """The ``zip`` groups a sweep's ``_sweep.json`` records (none in one written before kvsim recorded them)."""
    zips = meta.get("zip", [])
    if not isinstance(zips, list) or not all(isinstance(g, list) and all(isinstance(k, str) for k in g) for g in zips):
        raise ConfigError(f"{where} zip", zips, "a list of lists of axis names (as kvsim writes it)")
    return zips


def report_sweep(
    sweep_dir: str | Path,
    x: str | None = None,
    y: str | None = None,
    z: Sequence[str] | None = None,
    png: bool = False,
    out: str | Path | None = None,
) -> Path:
    from sim.analysis.sweep import META_FILE, read_dataset

    d = Path(sweep_dir)
    meta = _json_file(d / META_FILE, "sweep metadata") if (d / META_FILE).is_file() else {}
    zips = _zip_groups(meta, str(d / META_FILE))
    table = read_dataset(d)
    axes = meta.get("axes") or [
        c
        for c in table.column_names
        if "." in c
        and c.split(".")[0] in ("model", "gpu", "workload", "scheduler", "allocator", "cost_model", "engine")
    ]
    figs = sweep_figures(table, axes, x, y, z, zips)
    status = table.column("status").to_pylist() if table.num_rows else []
    failed = [r for r in table.to_pylist() if r.get("status") != "ok"]
    paired = "".join(f"; zip: {' with '.join(g)} (paired values go along together)" for g in zips if len(g) > 1)
    intro = (
        f"<p>{len(status)} points ({status.count('ok')} ok, {len(failed)} failed); axes: "
        f"{html.escape(', '.join(axes) or '-')}{html.escape(paired)}. Only points that differ in nothing "
        "but their seed are averaged: a curve per combination of the other axes, a heatmap panel per "
        "combination of the axes other than its x and y.</p>"
    )
    slo = _slo_text(meta.get("slo"))
    if slo:
        intro += (
            f"<p>SLO: {html.escape(slo)}. slo.attainment is the share of all requests that met it; "
            "slo.attainment.long and .short, where the SLO has two classes, the share of each class.</p>"
        )
    tab = None
    if failed:
        tab = (
            ["point", *axes, "error"],
            [[r["point_id"], *(_fmt(r.get(a)) for a in axes), r.get("error") or ""] for r in failed],
        )
    out = out_dir(out) if out else d
    path = write_html(out / "report.html", f"kvsim sweep: {meta.get('name', d.name)}", list(figs.values()), intro, tab)
    if png:
        write_pngs(list(figs.values()), [n.replace(".", "_") for n in figs], out)
    return path


def report(
    path: str | Path,
    png: bool = False,
    x: str | None = None,
    y: str | None = None,
    z: Sequence[str] | None = None,
    out: str | Path | None = None,
) -> Path:
    """Report on a run or a sweep directory (detected by its files)."""
    d = Path(path)
    if not d.is_dir():
        raise ConfigError(
            "report", str(path), "a run directory (kvsim run --out) or a sweep dataset (kvsim sweep --out)"
        )
    if is_run_dir(d):  # before --out is made: a run report has no axes to choose
        for option, value in (("--x", x), ("--y", y), ("--z", list(z) if z else None)):
            if value is not None:
                raise ConfigError(
                    option,
                    value,
                    f"only for a sweep dataset (kvsim sweep --out); {path} is a run directory (kvsim run --out)",
                )
    if out is not None:
        out = out_dir(out)
    try:
        if is_run_dir(d):
            return report_run(d, png, out)
        if is_sweep_dir(d):
            return report_sweep(d, x, y, z, png, out)
    except ConfigError:
        raise
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
        # A damaged or unreadable run or dataset (corrupt Parquet, a summary.json that is not JSON).
        reason = getattr(exc, "strerror", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ConfigError(
            "report", str(path), f"a readable run or sweep ({type(exc).__name__}: {reason[:160]})"
        ) from None
    raise ConfigError(
        "report",
        str(path),
        "a run directory (requests.parquet, timeseries.parquet) or a sweep dataset (part-*.parquet)",
    )
