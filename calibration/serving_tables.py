"""The terminal tables of ``kvsim validate --serving-bench``: the error statistics per group, where
the TPOT error comes from (:func:`split_rows`), what sets TTFT at the lowest concurrency
(:func:`ttft_line_rows`) and what more GPUs buy (:func:`scaling_rows`), as lists of cells.
"""

from __future__ import annotations


def _pct(x) -> str:
    return "–" if x is None else f"{x:+.0%}" if abs(x) < 10 else f"{x:+.1f}x"


def table_rows(sc: dict) -> list[list[str]]:
    """Rows of the printed table: group, n, TTFT median |err| / p90 / within 10 %, 20 % / bias, the same for
    TPOT; then all rows, and all but the groups flagged as a whole where the score has that figure."""
    out = []
    totals = [("ALL", sc["overall"])]
    if "overall_unflagged" in sc:
        n = len(sc["overall_unflagged"]["set_aside"])
        totals.append((f"ALL but the {n} group{'s' if n > 1 else ''} flagged whole", sc["overall_unflagged"]))
    for name, g in [*sc["groups"].items(), *totals]:
        row = [name, str(g["rows"])]
        for m in ("ttft", "tpot"):
            s = g[m]
            if not s.get("n"):
                row += ["–"] * 4
                continue
            row += [
                f"{s['median_abs']:.1%}",
                f"{s['p90_abs']:.1%}",
                f"{s['within_10']:.0%} / {s['within_20']:.0%}",
                f"{s['bias']:+.1%}",
            ]
        out.append(row)
    return out


HEADER = [
    "group (model/GPU/engine)",
    "rows",
    "TTFT median |err|",
    "TTFT p90 |err|",
    "TTFT within 10/20 %",
    "TTFT bias",
    "TPOT median |err|",
    "TPOT p90 |err|",
    "TPOT within 10/20 %",
    "TPOT bias",
]


SPLIT_HEADER = (
    "group (model/GPU/engine)",
    "TP",
    "rows",
    "prefill share",
    "TPOT error, all decode",
    "per prefill share",
)


def split_rows(split: dict[str, dict]) -> list[list[str]]:
    """The rows of the "where the TPOT error comes from" table (:func:`tpot_error_split`): each
    group, then each of its tensor-parallel sizes."""
    out = []
    for g, whole in split.items():
        for tp, f in [("all", whole)] + list(whole["by_tp"].items()):
            lo, hi = f["prefill_share"]
            out.append(
                [
                    g if tp == "all" else "",
                    tp,
                    str(f["rows"]),
                    f"{lo:.2f}-{hi:.2f}",
                    f"{f['decode']:+.1%}",
                    f"{f['per_prefill']:+.2f}",
                ]
            )
    return out


TTFT_LINE_HEADER = (
    "group (model/GPU/engine)",
    "concurrency",
    "runs",
    "prefill (ms)",
    "measured TTFT",
    "simulated TTFT",
)


def ttft_line_rows(lines: dict[str, dict]) -> list[list[str]]:
    """The rows of the "what sets TTFT at the lowest concurrency" table (:func:`ttft_vs_prefill`)."""

    def fmt(f: dict | None) -> str:
        return "-" if f is None else f"{f['intercept_ms']:.0f} ms + {f['per_prefill']:.2f} x prefill"

    return [
        [
            g,
            str(f["concurrency"]),
            str(f["runs"]),
            "{:.0f}-{:.0f}".format(*f["prefill_ms"]),
            fmt(f["measured"]),
            fmt(f["simulated"]),
        ]
        for g, f in lines.items()
    ]


SCALING_HEADER = ("group (model/GPU/engine)", "TP", "concurrency", "runs", "measured", "simulated")


def largest_pair(pts: list[dict]) -> tuple[tuple[int, int], list[dict]]:
    """A group's largest pair of tensor-parallel sizes in :func:`tp_scaling` and its points, by concurrency."""
    top = max(tuple(p["tp"]) for p in pts)
    return (top[0], top[1]), [p for p in pts if tuple(p["tp"]) == top]


def scaling_rows(scaling: dict[str, list[dict]]) -> list[list[str]]:
    """The rows of the "what more GPUs buy" table (:func:`tp_scaling`): per group, its largest pair of
    tensor-parallel sizes, one row per concurrency (``serving_validation.json`` holds every pair)."""
    out = []
    for g, pts in scaling.items():
        top, at_top = largest_pair(pts)
        for i, p in enumerate(at_top):
            out.append(
                [
                    g if i == 0 else "",
                    f"{top[0]} -> {top[1]}",
                    str(p["concurrency"]),
                    str(p["runs"]),
                    f"{p['measured']:.2f}x",
                    f"{p['simulated']:.2f}x",
                ]
            )
    return out
