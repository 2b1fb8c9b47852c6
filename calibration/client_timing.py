"""How far a benchmark run's TTFT depends on how its clients are timed.

A closed-loop benchmark with fixed lengths sets its TTFT by how the clients' requests meet at the
server: started together, they queue behind each other's prefills and, with nothing to drift them
apart, keep doing so; spread out, a prompt rarely waits for another one. kvsim starts a benchmark's
clients together or apart as its harness ran them (``--clients``) and jitters each request's client
and front-end time by the engine's ``client_cv``. :func:`client_timing` simulates a file's runs again under other timings, with the
same engine terms, so a user sees which of their predictions hinge on it
(``kvsim validate --serving-bench FILE --client-timing``; docs/calibration.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from sim.config import APART_SPREAD_CYCLES

from .serving_bench import BenchRow
from .serving_fit import EngineTerms, evaluate
from .serving_runs import Clients, RowResult, score


@dataclass(frozen=True)
class ClientTiming:
    """One way to time a benchmark's clients: their first requests spread uniformly over
    ``start_spread_cycles`` request cycles (0: all at once), each request's client and front-end
    time drawn with coefficient of variation ``client_cv`` (``None``: the engine's)."""

    name: str
    start_spread_cycles: float
    client_cv: float | None


#: The timings ``--client-timing`` compares with the one the rows are simulated under: in step with
#: no jitter at all, in step with as much jitter as an exponential (cv 1), and clients that never
#: meet (their starts spread over a whole request cycle, the engine's jitter).
CLIENT_TIMINGS: tuple[ClientTiming, ...] = (
    ClientTiming("together, no jitter", 0.0, 0.0),
    ClientTiming("together, jitter cv 1", 0.0, 1.0),
    ClientTiming("spread over a cycle", APART_SPREAD_CYCLES, None),
)


def _move(variant: RowResult, base: RowResult) -> float | None:
    """A row's simulated TTFT under a timing relative to its TTFT as simulated (``None``: either failed)."""
    v, b = variant.ttft_ms, base.ttft_ms
    return v / b - 1.0 if v is not None and b is not None and b > 0 and math.isfinite(v) else None


def _with_moves(stats: dict, moved: list[float]) -> dict:
    """``stats`` (a group's or the file's errors under a timing, :func:`score`) with how far the
    simulated TTFT of its rows moved (``moved``)."""
    return {
        "ttft": stats["ttft"],
        "tpot": stats["tpot"],
        "ttft_moved_median": float(np.median(moved)) if moved else None,
        "ttft_moved_p90_abs": float(np.percentile(np.abs(moved), 90)) if moved else None,
        "failed": stats["failed"],
    }


def median_pct(stats: dict | None) -> float | None:
    """The TTFT or TPOT median |error| of :func:`calibration.serving_runs.error_stats` in percent
    (``None`` without rows)."""
    return None if not stats or not stats.get("n") else 100 * stats["median_abs"]


def client_timing(
    rows: list[BenchRow],
    base: list[RowResult],
    terms: EngineTerms,
    clients: Clients,
    *,
    profile: str | None = None,
    workers: int = 1,
    timings: tuple[ClientTiming, ...] = CLIENT_TIMINGS,
) -> dict:
    """Every row simulated again under each of ``timings`` (a row's own ``start_spread_cycles``
    replaced), with ``terms`` and ``clients``' request counts; ``base``: the rows as simulated, in
    ``rows``' order. Per timing, overall and per (model, GPU, engine) group: TTFT and TPOT error
    statistics (:func:`calibration.serving_runs.error_stats`) and how far the simulated TTFT moved
    from ``base`` (median of sim under the timing ÷ sim as simulated − 1, and the 90th percentile of
    its size)."""
    out: dict = {}
    for t in timings:
        cl = replace(clients, start_spread_cycles=t.start_spread_cycles, client_cv=t.client_cv)
        preds = evaluate(
            [replace(r, start_spread_cycles=None) for r in rows], terms, cl, profile=profile, workers=workers
        )
        moves = [(b.row.group, m) for p, b in zip(preds, base) if (m := _move(p, b)) is not None]
        sc = score(preds)
        overall = _with_moves(sc["overall"], [m for _, m in moves])
        per_group = {g: _with_moves(st, [m for h, m in moves if h == g]) for g, st in sc["groups"].items()}
        out[t.name] = {
            "start_spread_cycles": t.start_spread_cycles,
            "client_cv": t.client_cv,
            "overall": overall,
            "groups": per_group,
        }
    return out


def timing_header(doc: dict) -> list[str]:
    """Header of :func:`timing_rows`: the group, then TTFT median |error| as simulated and under
    each timing of ``doc``."""
    return ["group", "as simulated", *doc]


def timing_rows(doc: dict, as_simulated: dict) -> list[list[str]]:
    """Table rows: per group and over all rows, TTFT median |error| as simulated (``as_simulated``:
    the run's score) and under each timing of ``doc`` (:func:`client_timing`), with the median move
    of the simulated TTFT and the 90th percentile of its size in brackets."""

    def err(stats: dict | None) -> str:
        pct = median_pct(stats)
        return "–" if pct is None else f"{pct:.1f}%"

    def cell(s: dict) -> str:
        m, p90 = s["ttft_moved_median"], s["ttft_moved_p90_abs"]
        return err(s["ttft"]) + ("" if m is None else f" ({100 * m:+.0f}% / {100 * p90:.0f}%)")

    rows = []
    for g, sc in sorted(as_simulated["groups"].items()):
        rows.append([g, err(sc["ttft"]), *(cell(v["groups"][g]) for v in doc.values())])
    rows.append(["all", err(as_simulated["overall"]["ttft"]), *(cell(v["overall"]) for v in doc.values())])
    return rows
