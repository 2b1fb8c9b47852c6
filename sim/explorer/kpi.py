"""A run's headline numbers (:data:`KPI_SPEC`: label, format and which way is better) and the SLO they
are judged against, read from the page's SLO widgets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

#: Widget defaults for the SLO (not a scenario key: the SLO judges a run, it does not change it).
DEFAULT_SLO = {"slo.ttft_s": 0.5, "slo.tpot_s": 0.05, "slo.attainment": 0.9}


#: (key, label, format, better) — better: "low", "high" or "" (no ranking).
KPI_SPEC: list[tuple[str, str, str, str]] = [
    ("ttft_p50_s", "TTFT p50 (s)", "{:.3f}", "low"),
    ("ttft_p99_s", "TTFT p99 (s)", "{:.3f}", "low"),
    ("tpot_p50_s", "TPOT p50 (s)", "{:.4f}", "low"),
    ("tpot_p99_s", "TPOT p99 (s)", "{:.4f}", "low"),
    ("e2e_p50_s", "e2e p50 (s)", "{:.2f}", "low"),
    ("e2e_p99_s", "e2e p99 (s)", "{:.2f}", "low"),
    ("throughput_tokens_per_s", "throughput (tok/s)", "{:,.0f}", "high"),
    ("throughput_requests_per_s", "throughput (req/s)", "{:.2f}", "high"),
    ("slo_attainment", "SLO attainment", "{:.1%}", "high"),
    ("kv_waste", "KV waste", "{:.1%}", "low"),
    ("preemptions", "preemptions", "{:,}", "low"),
    ("rejected", "rejections", "{:,}", "low"),
]
#: The client's wait for a free slot (``summary.json`` ``client_wait_s``), only in runs whose
#: scenario sets ``workload.arrival.max_concurrency``: apart from :data:`KPI_SPEC` so that a run
#: without a cap, where no client waits, shows no client-wait KPI (or Compare row).
CLIENT_WAIT_KPI_SPEC: list[tuple[str, str, str, str]] = [
    ("client_wait_p90_s", "client wait p90 (s)", "{:.3f}", "low"),
    ("client_wait_mean_s", "client wait mean (s)", "{:.3f}", "low"),
]
#: Every KPI's (label, format, which way is better), by key.
_SPECS = {k: (label, fmt, better) for k, label, fmt, better in KPI_SPEC + CLIENT_WAIT_KPI_SPEC}
KPI_LABELS = {k: label for k, (label, _, _) in _SPECS.items()}


def slo_from_knobs(knobs: Mapping[str, Any]):
    """:class:`sim.analysis.slo.SLO` from the page's SLO widgets (a bound of 0 or empty = no bound)."""
    from sim.analysis.slo import SLO

    def bound(k):
        v = knobs.get(k, DEFAULT_SLO[k])
        return float(v) if v not in (None, "") and float(v) > 0 else None

    return SLO(
        ttft_s=bound("slo.ttft_s"),
        tpot_s=bound("slo.tpot_s"),
        attainment=float(knobs.get("slo.attainment", DEFAULT_SLO["slo.attainment"])),
    )


def kpis(summary: dict, requests: pa.Table | None = None, slo=None) -> dict[str, Any]:
    """Headline numbers of a run. KV waste = 1 − kv_token_utilization (reserved but unused). With a
    client cap (``client_wait_s`` in the summary) also the client wait's p90 and mean."""
    util = summary.get("kv_token_utilization")
    out = {
        "ttft_p50_s": summary["ttft_s"]["p50"],
        "ttft_p99_s": summary["ttft_s"]["p99"],
        "tpot_p50_s": summary["tpot_s"]["p50"],
        "tpot_p99_s": summary["tpot_s"]["p99"],
        "e2e_p50_s": summary["e2e_s"]["p50"],
        "e2e_p99_s": summary["e2e_s"]["p99"],
        "throughput_tokens_per_s": summary.get("throughput_tokens_per_s"),
        "throughput_requests_per_s": summary.get("throughput_requests_per_s"),
        "slo_attainment": None,
        "kv_waste": None if util is None else 1.0 - util,
        "preemptions": summary.get("preemptions"),
        "rejected": summary.get("rejected"),
    }
    if requests is not None and slo is not None and (slo.ttft_s or slo.tpot_s or slo.e2e_s):
        from sim.analysis.slo import attainment

        out["slo_attainment"] = attainment(requests, slo)
    wait = summary.get("client_wait_s")
    if isinstance(wait, dict):
        out["client_wait_p90_s"] = wait.get("p90")
        out["client_wait_mean_s"] = wait.get("mean")
    return out


def format_kpi(key: str, value: Any) -> str:
    if value is None:
        return "–"
    fmt = _SPECS[key][1]
    return fmt.format(value)


def kpi_delta(key: str, value: Any, previous: Any) -> tuple[str | None, str]:
    """(delta text, Streamlit delta_color) of a KPI against the previous run."""
    if value is None or previous is None or value == previous:
        return None, "off"
    better = _SPECS[key][2]
    d = value - previous
    text = format_kpi(key, abs(d)) if key not in ("slo_attainment", "kv_waste") else f"{abs(d) * 100:.1f} pp"
    text = ("+" if d > 0 else "-") + text  # an ASCII sign: Streamlit picks the arrow from it
    return text, ("inverse" if better == "low" else "normal") if better else "off"
