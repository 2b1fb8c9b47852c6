"""The notes and warnings ``kvsim validate --serving-bench`` and ``kvsim calibrate --from-serving-bench``
print about a file's rows: each flagged group and its evidence, the terms a fit did not pin, the
rows skipped, the runs faster than their kernels, KV capacity, rows priced on the roofline. Plain
text, a list of lines per check, which both commands print.
"""

from __future__ import annotations

from sim.engine_presets import FITTED_TERMS

from .serving_bench import BenchRow
from .serving_evidence import (
    BUSY_LIMIT,
)
from .serving_fit import (
    PINNED_RISE,
    SHORT_OF_MINIMUM,
)
from .serving_runs import RowResult


def completion_warnings(flagged: dict[str, list[int]], held: dict[str, list[int]] | None = None) -> list[str]:
    """One line per group whose TTFT follows the time between completions (``flagged``: what
    :func:`ttft_follows_completions` found; ``held``: what :func:`hold_back_flagged` treated), for
    ``calibrate`` and ``validate`` alike."""
    held = held or {}
    return [
        f"{g}: at concurrency {', '.join(map(str, cs))} its TTFT grows with the output length, close to the time "
        "between two completions (request cycle / concurrency): requests seem to wait for another one to finish, "
        "a limit of the benchmark or server that the rows do not record"
        + (
            "; simulated with concurrency - 1 requests running (--hold-back-flagged)"
            if g in held
            else "; no server model fits that TTFT (--hold-back-flagged simulates one request waiting)"
        )
        + " (docs/calibration.md, groups that look mis-measured)"
        for g, cs in flagged.items()
    ]


def apart_warnings(apart: dict[str, dict], spread: list[str] | None = None) -> list[str]:
    """One line per group whose clients did not start together (``apart``: what
    :func:`clients_apart` found; ``spread``: what :func:`spread_flagged` treated)."""
    spread = spread or []
    return [
        f"{g}: at concurrency {v['concurrency']} its TTFT grows by {v['per_prefill']:.2f} prefills per prefill, where "
        "clients starting together wait for one another's prompts, in the first wave at least: its clients were "
        "spread, which the rows do not record"
        + (
            "; simulated with their starts spread over a request cycle (--spread-flagged)"
            if g in spread
            else "; simulated with their starts spread over a request cycle (--clients)"
            if v.get("simulated_apart")
            else "; simulated as starting together (--spread-flagged spreads them)"
        )
        + " (docs/calibration.md, groups that look mis-measured)"
        for g, v in apart.items()
    ]


#: Rows that could not be read named one by one on the console, at most (all are in the JSON).
SKIPPED_SHOWN = 5


#: How :func:`term_sensitivity` moves each term, as the texts below say it.
PROBED = "halved and doubled, a share by 0.25"


def sensitivity_lines(sens: dict[str, dict]) -> list[str]:
    """The terms' sensitivity (:func:`term_sensitivity`) as ``calibrate`` prints it: per engine, what
    moving each term alone adds to the objective and whether the rows pin it."""
    out: list[str] = []
    for e, d in sorted(sens.items()):
        out.append(
            f"  {e}: objective {d['objective']:.4f} (mean |log error|); moving one term alone ({PROBED}) adds, "
            f"pinned at +{PINNED_RISE:g} or more:"
        )
        for name, t in d["terms"].items():
            probes = ", ".join(f"{p['value']:.4g}: {p['objective_change']:+.4f}" for p in t["probes"]) or "none"
            tag = "pinned" if t["pinned"] else "NOT pinned by these runs"
            if t["short_of_minimum"]:
                tag += (
                    f"; a probe lowers it by more than {SHORT_OF_MINIMUM:g}: the fit stopped short (raise --max-evals)"
                )
            out.append(f"    {name} {t['value']:.4g} -> {probes} ({tag})")
    return out


def unpinned_warnings(fold_sensitivity: dict[str, dict], logo: bool) -> list[str]:
    """One line per fold whose training rows leave terms unpinned or whose fit stopped short of its
    minimum (:func:`term_sensitivity`; ``logo``: the folds of leave-one-group-out, else each group's
    own fit)."""
    out: list[str] = []
    for g, engines in fold_sensitivity.items():
        loose = [t for d in engines.values() for t, v in d["terms"].items() if not v["pinned"]]
        short = [t for d in engines.values() for t, v in d["terms"].items() if v["short_of_minimum"]]
        whose = f"the runs {g}'s terms were fitted on" if logo else f"{g}'s own runs"
        if loose:
            out.append(
                f"{whose} do not pin {', '.join(loose)} (moved alone, {PROBED}, each adds under "
                f"{PINNED_RISE:g} to the objective): other values fit them as well"
                + (f", so those terms say least about {g}" if logo else "")
            )
        if short:
            fit_of = f"the fit behind {g}'s terms" if logo else f"{g}'s own fit"
            out.append(
                f"{fit_of} stopped short of its minimum in {', '.join(short)} (a probe lowers the "
                f"objective by more than {SHORT_OF_MINIMUM:g}; raise --max-evals)"
            )
    return out


def listed_lines(lines: list[str], what: str, more: str = "") -> list[str]:
    """``N rows {what}:``, the first :data:`SKIPPED_SHOWN` of ``lines`` indented, and how many
    more (``more`` says where the rest are)."""
    if not lines:
        return []
    n = len(lines)
    rest = [f"... and {n - SKIPPED_SHOWN} more{more}"] if n > SKIPPED_SHOWN else []
    return [f"{n} row{'s' if n > 1 else ''} {what}:", *(f"  {m}" for m in lines[:SKIPPED_SHOWN]), *rest]


def skipped_lines(skipped: list[str]) -> list[str]:
    """What to say of the rows :func:`read_bench` could not read or simulate: how many, and the
    first :data:`SKIPPED_SHOWN` of them (file, row, column, value, what is allowed)."""
    return listed_lines(skipped, "left out, not simulated")


def few_runs_lines(rows: list[BenchRow], exclude: tuple[str, ...], prior: bool) -> list[str]:
    """One line per engine whose training runs are fewer than the terms a fit gives it
    (:data:`sim.engine_presets.FITTED_TERMS`): a run's two means cannot say several terms that
    trade against each other, and the sensitivity probes move one term at a time, so they would not
    show it."""
    out = []
    k = len(FITTED_TERMS)
    for engine in sorted({r.engine for r in rows}):
        n = sum(1 for r in rows if r.engine == engine and r.group not in exclude)
        if 0 < n < k:
            keep = (
                "the pull towards the preset (--prior) keeps the terms they leave free near it"
                if prior
                else "--prior keeps the terms they leave free near the preset's"
            )
            out.append(
                f"{engine}: {n} run{'s' if n > 1 else ''} ({2 * n} measured means) for {k} terms: too few to say "
                f"them all, and the probes below move one term at a time, so they cannot show two that trade "
                f"against each other; fit on {k} runs or more, at several concurrencies and lengths; {keep}"
            )
    return out


def kernel_warnings(
    flagged: dict[str, float], share: dict[str, float] | None = None, cached: list[str] | None = None
) -> list[str]:
    """One line per group whose runs are faster than its engine's kernels allow (``flagged``: what
    :func:`faster_than_kernels` found; ``share``: :func:`least_cached_share`; ``cached``: the groups
    :func:`cache_flagged` treated), for ``calibrate`` and ``validate`` alike."""
    share, cached = share or {}, cached or []

    def cache(g: str) -> str:
        if g not in share:
            return ""
        if share[g] >= 1.0:
            # The share is clamped at 1: their decoding alone needs more GPU time than they took.
            return "; not even every prompt from the prefix cache makes them possible: their decoding alone " + (
                "needs more (simulated with all but one prompt token cached, --cache-flagged)"
                if g in cached
                else "needs more"
            )
        least = f"at least {share[g]:.0%} of every prompt from the prefix cache makes them possible"
        return f"; {least}" + (
            ", simulated so (--cache-flagged)" if g in cached else " (--cache-flagged simulates that)"
        )

    return [
        f"{g}: its measured throughput needs the GPU computing {busy:.3g}x the wall time at its engine's own "
        f"kernel prices (median over its runs; at most 1 is possible, above {BUSY_LIMIT} is flagged): cached "
        "prefixes, prompts shorter than isl or speculative decoding would do this"
        + cache(g)
        + "; its errors say more about the file than about kvsim (--exclude-group suspect keeps it out of training)"
        for g, busy in flagged.items()
    ]


def fast_run_warnings(runs: dict[str, list[dict]]) -> list[str]:
    """One line per group with single runs faster than its engine's kernels allow (``runs``: what
    :func:`runs_faster_than_kernels` found), for ``calibrate`` and ``validate`` alike."""

    def run(x: dict) -> str:
        return f"{x['isl']}/{x['osl']} c{x['concurrency']} tp{x['tp']} {x['implied_gpu_busy']:.3f}x"

    return [
        f"{g}: {len(xs)} of its runs {'needs' if len(xs) == 1 else 'need'} the GPU computing more than "
        f"{BUSY_LIMIT}x the wall time at its engine's own kernel prices ({', '.join(map(run, xs))}), where at "
        "most 1 is possible: cached prefixes, prompts shorter than isl or speculative decoding would do this; "
        "their errors say more about those runs than about kvsim (fast_runs in serving_validation.json)"
        for g, xs in runs.items()
    ]


def kv_warnings(evidence: dict[str, dict], kv_set: dict[str, int] | None = None) -> list[str]:
    """One line per group and GPU count whose runs say their server held a KV capacity other than the
    one kvsim derives (``evidence``: what :func:`kv_capacity_evidence` found; ``kv_set``: the
    capacities :func:`kv_from_runs` gave), for ``calibrate`` and ``validate`` alike."""
    kv_set = kv_set or {}
    out = []
    for key, v in evidence.items():
        lo, hi, derived = v["holds_up_to"], v["waits_from"], v["derived"]
        if derived is None or (derived <= hi and (lo is None or derived > lo)):
            continue
        if key in kv_set:
            treated = f"; simulated with {kv_set[key]:,} tokens (--kv-from-runs)"
        elif lo is None:
            treated = "; no lower bound, so --kv-from-runs leaves it"
        else:
            treated = f"; --kv-from-runs simulates {(lo + hi) // 2:,}"
        held = f"between {lo:,} and {hi:,}" if lo is not None else f"fewer than {hi:,}"
        off = derived / hi - 1 if derived > hi else derived / lo - 1
        out.append(
            f"{key}: runs whose TTFT grows with the output length at the same prompt and concurrency "
            f"({', '.join(v['waiting_runs'][:3])}) wait for KV: the server held {held} tokens "
            f"(concurrency x (isl + osl)) where kvsim derives {derived:,} ({off:+.0%}){treated}; the rows' "
            "kv_cache_tokens column (gpu.kv_cache_tokens in a scenario) sets what the server logged "
            "(docs/calibration.md, KV capacity)"
        )
    return out


def roofline_groups(results: list[RowResult]) -> dict[str, int]:
    """Per group, how many of its simulated runs no calibrated kernel profile priced (the GPU, weights
    or KV dtype has none: the roofline prior priced them)."""
    out: dict[str, int] = {}
    for r in results:
        if r.error is None and not r.calibrated:
            out[r.row.group] = out.get(r.row.group, 0) + 1
    return out


def roofline_warnings(groups: dict[str, int]) -> list[str]:
    """One line per group of :func:`roofline_groups`."""
    return [
        f"{g}: {n} run{'s' if n > 1 else ''} priced by the roofline prior, not a calibrated kernel profile "
        "(kvsim profile list: no profile has this GPU, weight or KV dtype); their errors say little about "
        "the engine terms"
        for g, n in groups.items()
    ]
