"""The decision guide as markdown (``docs/decision-guide.md``), and the extra per-variant columns.

:func:`render` writes, from the situations' results: the claims at a glance, then per situation
its question, scenario facts, a table per variant (:data:`TABLE_COLUMNS`), the situation's extra
columns (``columns:`` in its YAML, computed by a function of :data:`COLUMNS`), the planner's
recommendation with its reasons, and the article's claims with verdicts and findings.
"""

from __future__ import annotations

from collections.abc import Callable

from sim.analysis.guide.claims import SKIPPED, long_threshold
from sim.analysis.guide.runs import GIB, Run, SituationResult, fmt_g, fmt_pct
from sim.config import load_scenario

#: Column name (``value:`` in a situation's ``columns:``) → function of (run, situation result,
#: the column's other keys) → the cell's text.
COLUMNS: dict[str, Callable[..., str]] = {}


def column(fn: Callable[..., str]) -> Callable[..., str]:
    """Register ``fn`` under its name; parameters after (run, result) are the column's keys in YAML."""
    COLUMNS[fn.__name__] = fn
    return fn


@column
def mean_running(run: Run, r: SituationResult, format: str = ".1f") -> str:
    return f"{run.mean_running():{format}}"


@column
def peak_running(run: Run, r: SituationResult) -> str:
    return str(run.peak_running())


@column
def kv_at_gate_gib(run: Run, r: SituationResult) -> str:
    return f"{run.gate_reserved_gib():.1f}"


@column
def alloc_ms_per_iteration(run: Run, r: SituationResult) -> str:
    return f"{run.alloc_ms_per_iteration():.3f}"


@column
def copied_gib(run: Run, r: SituationResult) -> str:
    return f"{run.s['copy_bytes'] / GIB:.0f}"


@column
def stranded_refusals(run: Run, r: SituationResult) -> str:
    return str(run.s["stranded_refusals"])


@column
def decode_jitter(run: Run, r: SituationResult) -> str:
    return fmt_g(run.measure.get("decode_jitter"))


@column
def compactions_and_pause_s(run: Run, r: SituationResult) -> str:
    return f"{run.s['compactions']} / {run.s['compaction_time_s']:.2f}"


@column
def prefix_hit_rate(run: Run, r: SituationResult) -> str:
    return fmt_pct(run.s.get("prefix_hit_rate"), 1)


@column
def admissions_paused_s(run: Run, r: SituationResult) -> str:
    return f"{run.s['admissions_paused_s']:.2f}"


@column
def swaps_out(run: Run, r: SituationResult) -> str:
    return f"{run.s['swaps_out']}"


@column
def reserve_tokens(run: Run, r: SituationResult) -> str:
    return str(run.s.get("reserve_tokens") or "-")


@column
def long_request_e2e_p99(run: Run, r: SituationResult, reference: str) -> str:
    """e2e p99 (s) and count of requests longer than the p90 length of variant ``reference``'s run."""
    _, e2e, n = run.long_request_p99(long_threshold(r.runs[reference]))
    return f"{fmt_g(e2e)} ({n})"


#: The table every variant gets.
TABLE_COLUMNS = [
    "variant",
    "TTFT p50 / p99 s",
    "TPOT p50 / p99 ms",
    "tok/s per GPU",
    "SLO attain.",
    "goodput at load req/s/GPU",
    "KV waste",
    "KV mem util",
    "ext. frag",
    "preempt",
    "rejected / trunc.",
]


def _row(run: Run) -> list[str]:
    s = run.summary
    rej = s["rejected"]
    return [
        f"`{run.variant.name}`"
        + (" (contrast)" if run.variant.contrast else "")
        + (" (upper bound: oracle lengths)" if run.upper_bound else ""),
        f"{fmt_g(s['ttft_s']['p50'])} / {fmt_g(s['ttft_s']['p99'])}",
        f"{fmt_g((s['tpot_s']['p50'] or 0) * 1e3)} / {fmt_g((s['tpot_s']['p99'] or 0) * 1e3)}",
        f"{s['throughput_tokens_per_s'] / run.gpus:.0f}",
        fmt_pct(run.attainment, 1),
        fmt_g(run.goodput_per_gpu),
        fmt_pct(run.waste(), 1),
        fmt_pct(s["kv_memory_utilization"], 1),
        fmt_pct(s["kv_external_fragmentation"], 1),
        str(s["preemptions"]),
        f"{rej} / {s['truncated']}",
    ]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return out


def scenario_facts(scenario: str, num_requests: int | None) -> str:
    """One line on a situation's scenario: model, GPUs, arrivals, size, limits."""
    over = {"workload.num_requests": num_requests} if num_requests else {}
    sc = load_scenario(scenario, over)
    a = sc.workload.arrival
    arr = {
        "poisson": lambda: f"Poisson {a.rate:g} req/s",
        "gamma": lambda: f"gamma {a.rate:g} req/s, cv {a.cv:g}",
        "trace": lambda: f"trace replay (time_scale {a.time_scale:g})",
        "closed_loop": lambda: f"closed loop, {a.concurrency} clients",
    }[a.kind]()
    return (
        f"`scenarios/{scenario}.yaml` — {sc.model.name} on {sc.gpu.replicas} × {sc.gpu.name} "
        f"(TP{sc.gpu.tensor_parallel}, gpu_memory_utilization {sc.gpu.gpu_memory_utilization:g}), {arr}, "
        f"{sc.workload.num_requests} requests, max_model_len {sc.workload.max_model_len:,}, max_num_seqs "
        f"{sc.scheduler.max_num_seqs}"
    )


def render(results: list[SituationResult], num_requests: int | None = None) -> str:
    L: list[str] = []
    L += [
        "# Decision guide: static vs dynamic KV-cache allocation, situation by situation",
        "",
        "Generated by `kvsim guide` (`sim/analysis/guide/`) from fresh simulations of the scenarios in `scenarios/`; do "
        "not edit by hand. Each section is one situation of the seed article *When KV Cache Management Becomes the "
        "Bottleneck: Choosing Between Static and Dynamic Allocation* (its situations, variants and quoted claims: "
        "`scenarios/guide/`): the scenario, a table per allocator "
        "variant, the recommendation of the goodput planner's rules (`sim.analysis.recommend.recommend`) with its reasons, and "
        "the article's claims checked against the simulation, with the numbers.",
        "",
    ]
    engines = sorted({str(run.s.get("engine")) for r in results for run in r.runs.values()})
    if engines:
        L += [
            f"**Engine.** Every run prices the serving engine its scenario names ({', '.join(engines)}; "
            "`engine.kind: auto` is vLLM's preset: its kernels, host time, front end and, for scheduler keys a "
            'scenario leaves unset, its server defaults; docs/calibration.md, "Serving engines").',
            "",
        ]
    if num_requests:
        L += [f"**Reduced size:** every scenario ran with `workload.num_requests={num_requests}`.", ""]
    L += [
        "**Columns.** TTFT/TPOT percentiles over completed requests. *tok/s per GPU*: prompt + output tokens per "
        "second ÷ GPUs. *SLO attain.*: requests meeting the situation's SLO ÷ all requests (rejected and truncated "
        "ones miss), at the scenario's own load. *Goodput at load*: SLO-meeting requests ÷ makespan ÷ GPUs — not "
        "the planner's goodput search (highest rate that meets the SLO: `kvsim plan`), which would cost ~10 "
        "simulations per row and is undefined for closed-loop and trace arrivals; in the recommendation's reasons "
        "'goodput' means this at-load figure. *KV waste*: 1 − used ÷ reserved KV, time-weighted (reserved memory that "
        "holds no token). *KV mem util*: used ÷ capacity over the makespan. *Ext. frag*: 1 − largest free extent ÷ "
        "free, time-weighted (free memory no single new sequence can take). *Jitter*: p99 ÷ p50 of decode-only step "
        "times (timeseries `first_step_s`). Contrast rows are context (another load or workload), not candidates. "
        "*Upper bound* rows route requests by their true output length (`allocator.length_predictor: oracle`), which "
        "no server knows: they bound what a length-routed strategy could reach and are never recommended; the "
        "other hybrid_tail rows predict from the prompt (`prompt`, the default, or `quantile`).",
        "",
        "**Verdicts.** *reproduced*: the simulation finds the article's direction and magnitude; *partly*: the "
        "direction but not the magnitude, or only for some of the strategies; *did not reproduce*: no effect or the "
        "opposite; *skipped*: the situation needs a model the catalog lacks (its row says which). The simulator "
        "was not tuned to agree: each scenario's load puts it in the article's situation (its header says how) and "
        "runs with its defaults, seed 1.",
        "",
    ]
    L += ["## Claims at a glance", ""]
    rows = []
    for r in results:
        if r.skipped:
            rows.append([r.situation.number, r.situation.title, "-", SKIPPED, r.skipped])
            continue
        for c, cr in r.claims:
            rows.append([r.situation.number, r.situation.title, c.id, cr.verdict, cr.finding])
    L += _table(["#", "situation", "claim", "verdict", "finding"], rows) + [""]
    counts: dict[str, int] = {}
    for r in results:
        for _, cr in r.claims:
            counts[cr.verdict] = counts.get(cr.verdict, 0) + 1
    L += ["Totals: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), ""]
    for r in results:
        sit = r.situation
        L += [
            f"## {sit.number}. {sit.title}",
            "",
            f"**Question.** {sit.question}",
            "",
            scenario_facts(sit.scenario, num_requests),
            "",
        ]
        if r.skipped:
            L += [f"**Skipped:** {r.skipped}.", ""]
            continue
        cms = sorted(
            {
                f"`{run.summary['cost_model']}`"
                + ("" if run.summary["cost_model_calibrated"] else " (uncalibrated roofline prior)")
                for run in r.runs.values()
            }
        )
        L += [f"SLO: {sit.slo.describe()}. Cost model (summary `cost_model`): {', '.join(cms)}.", ""]
        L += _table(TABLE_COLUMNS, [_row(run) for run in r.runs.values()]) + [""]
        if sit.columns:
            hdr = ["variant"] + [c.header for c in sit.columns]
            L += _table(
                hdr,
                [
                    [f"`{run.variant.name}`"] + [COLUMNS[c.value](run, r, **c.args) for c in sit.columns]
                    for run in r.runs.values()
                ],
            )
            L += [""]
        rec = r.recommendation or {}
        L += [f"**Recommendation (planner rules, at the scenario's load).** {rec.get('text', '-')}", ""]
        L += [f"- {x}" for x in rec.get("reasons", [])] + [""]
        L += ["**The article's claims here.**", ""]
        L += _table(
            ["claim", "the article", "verdict", "what the simulation finds"],
            [[c.id, c.article, f"**{cr.verdict}**", cr.finding] for c, cr in r.claims],
        ) + [""]
    L += [
        "## Reproducing",
        "",
        "```bash",
        ".venv/bin/kvsim guide                      # all situations, scenario defaults",
        ".venv/bin/kvsim guide --num-requests 200    # quicker, noisier",
        "```",
        "",
        "Each situation's scenario runs alone too (`kvsim run scenarios/<name>.yaml`; its header comment lists the "
        "`--set` overrides of every variant). `tests/test_claims.py` asserts the direction of every finding above.",
        "",
    ]
    return "\n".join(L)
