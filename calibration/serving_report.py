"""``kvsim validate --serving-bench`` and ``kvsim calibrate --from-serving-bench``: run, print, write.

``validate`` simulates every benchmark row with the engine presets (or a terms file), and with
``--logo`` fits each group's engine terms without that group first (the honest accuracy on a model,
GPU or engine not fitted on). It prints per-group and overall error statistics and writes
``serving_validation.json`` (every row, every group) and ``serving_validation.html`` (predicted
against measured, plotly.js embedded so the page works offline).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from sim.config import APART_SPREAD_CYCLES
from sim.engine_presets import FITTED_TERMS, normalize_engine
from sim.errors import ConfigError
from sim.output.staging import out_dir, out_file

from .served_by import aiconfigurator_run, aiconfigurator_server
from .serving_bench import TRAINING_FILE, BenchRow, none_left, read_bench, resolve_model
from .serving_evidence import (
    BUSY_LIMIT,
    cache_flagged,
    clients_apart,
    faster_than_kernels,
    gpu_shares,
    hold_back_flagged,
    implied_gpu_busy,
    kv_capacity_evidence,
    kv_from_runs,
    least_cached_share,
    runs_faster_than_kernels,
    spread_flagged,
    tp_scaling,
    tpot_error_split,
    ttft_follows_completions,
    ttft_vs_prefill,
)
from .serving_fit import (
    PINNED_RISE,
    SHORT_OF_MINIMUM,
    EngineTerms,
    builtin_terms,
    evaluate,
    fit,
    fit_each_group,
    leave_one_group_out,
    term_sensitivity,
    unfitted_terms,
)
from .serving_runs import Clients, RowResult, score, setup_error


def _terms_from(path: str | None) -> EngineTerms:
    if path is None:
        return builtin_terms()
    from sim.engine_presets import read_terms_file

    base = builtin_terms()
    for e, t in read_terms_file(Path(path)).items():
        base.engines.setdefault(e, {}).update(t)
    return base


def selected_rows(
    path: str,
    engine: str | None,
    gpu: str | None,
    tp: int | None,
    weights: str | None = None,
    kv: str | None = None,
    problems: list[str] | None = None,
    served_by: str | None = None,
    kv_cache_tokens: int | None = None,
    *,
    model: str | None = None,
    notes: list[str] | None = None,
) -> list[BenchRow]:
    """The file's rows (``engine``: only that engine's), or a ConfigError when none is left.
    ``gpu``, ``tp``, ``weights``, ``kv`` and ``kv_cache_tokens`` describe result JSON files, which
    do not record them; ``model`` fills or replaces their ``model_id``, ``engine`` the engine their
    ``backend`` names. ``problems``: rows that cannot be read or simulated are said there, one line
    each (file, row, column, value), and the others kept; ``notes``: what was passed over without an
    error (:func:`calibration.serving_bench.read_bench`). ``served_by``: how the servers were
    configured where a row does not say (:func:`served_by_rows`)."""
    if engine:
        engine = normalize_engine(engine)
    rows = served_by_rows(
        read_bench(
            path,
            problems,
            notes,
            gpu=gpu,
            tp=tp,
            engine=engine or None,
            weights=weights,
            kv=kv,
            model=model,
            kv_cache_tokens=kv_cache_tokens,
        ),
        served_by if served_by is not None else "auto",
    )
    if engine:
        have = sorted({r.engine for r in rows})
        rows = [r for r in rows if r.engine == engine]
        if not rows:
            raise ConfigError("--engine", engine, f"an engine with rows in {path}: {', '.join(have)}")
    if problems is not None:
        # A row no terms can simulate (a model whose weights do not fit its GPUs) is said and left out
        # before any fit, which would otherwise score it as a failure at every step and dilute the rest.
        why = [setup_error(r) for r in rows]
        problems.extend(f"{r.origin or r.source}: {w}" for r, w in zip(rows, why) if w is not None)
        rows = [r for r, w in zip(rows, why) if w is None]
        if not rows:
            raise none_left(Path(path), problems)
    return rows


#: How a benchmark file's servers may have been configured (``--served-by``): ``aiconfigurator``,
#: the settings aiconfigurator-core's generator gives an aggregated deployment
#: (:func:`calibration.served_by.aiconfigurator_server`); ``defaults``, each engine's own;
#: ``auto`` (the default), per row: aiconfigurator's where the row's ``source_id`` names one of its
#: collector's runs (:func:`calibration.served_by.aiconfigurator_run`: every run of the shipped
#: file), else the engine's defaults.
SERVED_BY = ("auto", "aiconfigurator", "defaults")


def served_by_rows(rows: list[BenchRow], served_by: str) -> list[BenchRow]:
    """``rows`` with the server settings of ``served_by`` (:data:`SERVED_BY`) where a row sets none."""
    if served_by not in SERVED_BY:
        raise ConfigError("--served-by", served_by, f"one of {', '.join(SERVED_BY)}")
    return [aiconfigurator_server(r) if _served_as_aiconfigurator(r, served_by) else r for r in rows]


def _served_as_aiconfigurator(row: BenchRow, served_by: str) -> bool:
    return served_by == "aiconfigurator" or (served_by == "auto" and aiconfigurator_run(row))


#: How a benchmark file's clients met the server where a row gives no ``start_spread_cycles``
#: (``--clients``): ``together``, all started at once and in step; ``apart``, their first requests
#: spread uniformly over :data:`APART_SPREAD_CYCLES` request cycles; ``auto`` (the default), per
#: row: together for a run of aiconfigurator-core's collector (its ``source_id`` names one, or
#: ``--served-by aiconfigurator``), else apart.
CLIENT_MODES = ("auto", "together", "apart")


def clients_mode(clients: str | None) -> str:
    """``--clients`` resolved (``None``: ``auto``), or a ConfigError naming the allowed values."""
    mode = clients if clients is not None else "auto"
    if mode not in CLIENT_MODES:
        raise ConfigError("--clients", mode, f"one of {', '.join(CLIENT_MODES)}")
    return mode


def clients_rows(rows: list[BenchRow], clients: str, served_by: str) -> list[BenchRow]:
    """``rows`` with the start spread ``clients`` (:data:`CLIENT_MODES`) gives them where a row sets
    none.

    Whether a fixed-length closed loop's clients stay in step is the benchmark harness's doing, and
    no row records it. aiconfigurator-core's collector keeps them in step: its runs' prompts queue
    behind one another run after run (spreading them triples the shipped groups' TTFT error). The
    shipped file's one campaign of another kind, its Llama-3.1-70B runs, did not: at 4 clients
    their first token comes one prefill after the request. A harness kvsim has not seen gets the
    second behaviour, because the first one, at an engine's default token budget (a whole wave of prompts
    per iteration), locks kvsim's fixed-length clients into prefill waves that re-form every cycle
    and no client or front-end jitter breaks (docs/calibration.md, "Which clients meet")."""
    clients_mode(clients)
    out = []
    for r in rows:
        if r.start_spread_cycles is None:
            r = replace(r, start_spread_cycles=0.0 if _starts_together(r, clients, served_by) else APART_SPREAD_CYCLES)
        out.append(r)
    return out


def _starts_together(row: BenchRow, clients: str, served_by: str) -> bool:
    """Whether ``clients`` starts the clients of ``row`` (a row without its own spread) together."""
    return clients == "together" or (clients == "auto" and _served_as_aiconfigurator(row, served_by))


def clients_line(path: str, rows: list[BenchRow], clients: str, served_by: str) -> list[str]:
    """One line saying how many rows ``clients`` (not their own column) simulates with the clients
    apart, where any is."""
    n = sum(
        1 for r in rows if r.start_spread_cycles == APART_SPREAD_CYCLES and not _starts_together(r, clients, served_by)
    )
    if not n:
        return []
    why = (
        "--clients apart"
        if clients == "apart"
        else "no aiconfigurator-core collector run named in their source_id: a harness kvsim has not seen keep "
        "its clients in step"
    )
    return [
        f"{n} of {len(rows)} rows of {path}: clients apart, their first requests spread over a request cycle "
        f"({why}; docs/calibration.md, Which clients meet); --clients together starts them at once, in step"
    ]


def served_by_line(path: str, rows: list[BenchRow], served_by: str) -> list[str]:
    """One line saying which rows ``auto`` serves as aiconfigurator deploys them, for a file other than
    the shipped one (whose runs all are); none otherwise."""
    if served_by != "auto" or _is_training_file(path):
        return []
    n = sum(aiconfigurator_run(r) for r in rows)
    if not n:
        return []
    return [
        f"{n} of {len(rows)} rows of {path} name aiconfigurator-core collector runs in source_id "
        "(..._agg_<isl>x<osl>_c<concurrency>_tp<tp>_...): simulated with the server settings its generator "
        "gives them (docs/calibration.md, How the shipped runs were served); --served-by defaults gives "
        "each engine its own defaults"
    ]


#: How a benchmark row picks another format than the one its model's shipped config brings.
ROW_FORMAT_HINT = "where a row leaves its weights column empty; the weights and kv columns set another format"


def variant_lines(rows: list[BenchRow]) -> list[str]:
    """One line per model id of ``rows`` that no shipped config is of, naming the config whose shape
    and formats it is simulated with (:func:`sim.model_ids.variant_note`): an untagged id whose
    only shipped config is a quantised re-release takes that release's weights where the row gives
    none, which the row's own columns do not show."""
    from sim.model_ids import model_of_id, variant_note

    # Every row's model resolved when it was read (a config path made absolute), so it resolves again;
    # a tagged variant with its tags' weights, as a row that leaves them empty runs it
    # (serving_bench.checkpoint_weights).
    notes = (
        variant_note(m, model_of_id(m) or resolve_model(m), ROW_FORMAT_HINT, with_kv=False)
        for m in sorted({r.model for r in rows})
    )
    return [n for n in notes if n is not None]


def _is_training_file(path: str) -> bool:
    try:
        return Path(path).resolve() == TRAINING_FILE.resolve()
    except OSError:
        return False


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


def resolve_exclusions(
    names: tuple[str, ...] | list[str], rows: list[BenchRow], suspect: dict[str, float]
) -> tuple[str, ...]:
    """``--exclude-group`` values as group names: ``suspect`` stands for the groups of ``rows``
    whose runs are faster than their engine's kernels allow (``suspect``: what
    :func:`faster_than_kernels` found in ``rows``); any other value must be a (model/GPU/engine)
    group of ``rows``."""
    have = sorted({r.group for r in rows})
    out: list[str] = []
    for n in names:
        if n == "suspect":
            out += list(suspect)
        elif n in have:
            out.append(n)
        else:
            raise ConfigError(
                "--exclude-group", n, "'suspect' or a group of the file (model/gpu/engine): " + ", ".join(have)
            )
    return tuple(dict.fromkeys(out))


@dataclass(frozen=True)
class Treatments:
    """What ``validate`` and ``calibrate`` do with what the checks flag, in training and prediction
    alike; each off by default (the rows as the file gives them). ``hold_back``: the runs whose TTFT
    follows completions run with one request waiting (:func:`hold_back_flagged`); ``spread``: the
    groups whose clients did not start together have their starts spread (:func:`spread_flagged`);
    ``cache``: the groups faster than their kernels have the least share of their prompts cached
    that makes their runs possible (:func:`cache_flagged`); ``kv``: the deployments whose runs wait
    for KV hold the capacity the runs imply (:func:`kv_from_runs`). ``blind`` (leave-one-group-out
    only): the treatments reach the training folds alone and each held-out group is predicted from
    its runs as the file gives them, so no prediction reads its own group's measured times."""

    hold_back: bool = False
    spread: bool = False
    cache: bool = False
    kv: bool = False
    blind: bool = False


@dataclass
class CheckedRows:
    """A file's rows after the checks on the measurements themselves, and what each found: runs
    whose TTFT follows completions (``flagged``; ``held``: those held back), groups whose clients
    did not start together (``apart``; ``spread``: those spread), each row's GPU shares and
    implied busy time (``shares``, ``busy``, in row order), groups faster than their kernels
    (``fast``), the least share of their prompts cached that makes their runs possible
    (``cached_share``; ``cached``: the groups so simulated) and the groups left out of training
    (``exclude``). ``given``: the file's rows with only their clients' start spread set
    (:func:`clients_rows`), none of the treatments, in the same order as ``rows``."""

    rows: list[BenchRow]
    given: list[BenchRow]
    flagged: dict[str, list[int]]
    held: dict[str, list[int]]
    apart: dict[str, dict]
    spread: list[str]
    shares: list[tuple[float, float] | None]
    busy: list[float | None]
    fast: dict[str, float]
    cached_share: dict[str, float]
    cached: list[str]
    exclude: tuple[str, ...]
    #: What the runs say of their server's KV capacity (:func:`kv_capacity_evidence`), and the
    #: capacity given to each deployment so simulated (:func:`kv_from_runs`).
    kv: dict[str, dict] = field(default_factory=dict)
    kv_set: dict[str, int] = field(default_factory=dict)
    #: Single runs faster than their kernels in groups not flagged as a whole (:func:`runs_faster_than_kernels`).
    fast_runs: dict[str, list[dict]] = field(default_factory=dict)


def check_rows(
    rows: list[BenchRow],
    profile: str | None,
    exclude: tuple[str, ...] | list[str],
    treat: Treatments = Treatments(),
    clients: str = "auto",
    served_by: str = "auto",
) -> CheckedRows:
    """``validate`` and ``calibrate``'s checks on ``rows``, in one place, what they flag treated as
    ``treat`` says; ``exclude`` resolved (:func:`resolve_exclusions`); then the clients' start spread
    where a row still sets none (:func:`clients_rows`: ``clients``, ``served_by``)."""
    given = clients_rows(rows, clients, served_by)
    kv = kv_capacity_evidence(rows, profile)  # on the runs as the file gives them
    flagged = ttft_follows_completions(rows)
    held: dict[str, list[int]] = {}
    if treat.hold_back:
        rows, held = hold_back_flagged(rows, flagged)
    shares = gpu_shares(rows, profile)
    apart = clients_apart(rows, dict(zip(rows, shares)))
    for g, v in apart.items():
        # Apart without the treatment (their harness is not one kvsim has seen keep its clients in step).
        v["simulated_apart"] = all(r.start_spread_cycles for r in given if r.group == g)
    spread: list[str] = []
    if treat.spread:
        rows, spread = spread_flagged(rows, apart)  # same rows in the same order: ``shares`` still lines up
    busy = implied_gpu_busy(rows, shares=shares)
    fast = faster_than_kernels(rows, profile, busy)
    share = least_cached_share(rows, shares, fast)
    cached: list[str] = []
    if treat.cache:
        rows, cached = cache_flagged(rows, share)  # the same order again; ``shares`` and ``busy`` stay the file's
    kv_set: dict[str, int] = {}
    if treat.kv:
        rows, kv_set = kv_from_runs(rows, kv)
    return CheckedRows(
        clients_rows(rows, clients, served_by),  # after --spread-flagged, which sets its groups' spread itself
        given,
        flagged,
        held,
        apart,
        spread,
        shares,
        busy,
        fast,
        share,
        cached,
        resolve_exclusions(exclude, rows, fast),
        kv,
        kv_set,
        runs_faster_than_kernels(rows, busy, fast),
    )


def _pct(x) -> str:
    return "–" if x is None else f"{x:+.0%}" if abs(x) < 10 else f"{x:+.1f}x"


def table_rows(sc: dict) -> list[list[str]]:
    """Rows of the printed table: group, n, TTFT median |err| / p90 / within 10 %, 20 % / bias, the same for TPOT."""
    out = []
    for name, g in [*sc["groups"].items(), ("ALL", sc["overall"])]:
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


def validate_serving_bench(
    path: str,
    *,
    profile: str | None = None,
    engine: str | None = None,
    terms_file: str | None = None,
    logo: bool = False,
    own_fit: bool = False,
    requests_per_client: int = Clients.requests_per_client,
    warmup: int = Clients.warmup,
    max_evals: int = 100,
    workers: int = 1,
    out: Path | None = None,
    served_by: str | None = None,
    exclude: tuple[str, ...] = (),
    gpu: str | None = None,
    tp: int | None = None,
    weights: str | None = None,
    kv: str | None = None,
    kv_cache_tokens: int | None = None,
    model: str | None = None,
    treat: Treatments = Treatments(),
    sensitivity: bool = False,
    pooled_prior: bool = True,
    client_timings: bool = False,
    clients: str | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Simulate every row (``engine``: only rows of that engine); with ``logo``, leave-one-group-out;
    with ``own_fit``, each group with terms fitted on its own rows (:func:`fit_each_group`).
    ``treat``: what to do with what the checks flag (:class:`Treatments`), in training and in
    prediction. ``served_by``: :func:`served_by_rows` (default ``auto``); ``clients``:
    :func:`clients_rows` (default ``auto``).
    ``sensitivity`` (with ``logo`` or ``own_fit``): how firmly each fold's training rows pin its
    terms, under ``fold_sensitivity``. ``pooled_prior`` (with ``logo``): each fold's fit is pulled
    towards terms shared by all its training groups (:func:`leave_one_group_out`).
    ``client_timings`` (terms as given only): every row simulated again under each of
    :data:`calibration.client_timing.CLIENT_TIMINGS`, under ``client_timing``."""
    if logo and own_fit:
        raise ConfigError(
            "--own-fit", True, "either --logo (each group predicted by the others) or --own-fit (by itself), not both"
        )
    if sensitivity and not (logo or own_fit):
        raise ConfigError(
            "--sensitivity", True, "with --logo or --own-fit (it probes their fits; terms as given are not fitted)"
        )
    if client_timings and (logo or own_fit):
        raise ConfigError(
            "--client-timing",
            True,
            "with terms as given (presets or --terms), not with --logo or --own-fit (it simulates every row "
            "again under other client timings with one set of terms)",
        )
    if treat.blind and not logo:
        raise ConfigError(
            "--blind", True, "with --logo (it keeps the treatments out of the held-out groups' predictions)"
        )
    t0 = time.perf_counter()
    skipped: list[str] = []
    notes: list[str] = []
    served = served_by if served_by is not None else "auto"
    meet = clients_mode(clients)
    rows = selected_rows(path, engine, gpu, tp, weights, kv, skipped, served, kv_cache_tokens, model=model, notes=notes)
    if log is not None:
        for line in notes + skipped_lines(skipped) + served_by_line(path, rows, served) + variant_lines(rows):
            log(line)
    checked = check_rows(rows, profile, exclude, treat, meet, served)
    # Every treatment keeps the rows' order, so the file's own rows line up with the treated ones.
    as_given = checked.given
    rows, shares, busy, exclude = checked.rows, checked.shares, checked.busy, checked.exclude
    per_client = Clients(requests_per_client=requests_per_client, warmup=warmup)
    # Leave-one-group-out starts from the unfitted values unless given terms: the built-in presets
    # were fitted on the shipped file, held-out groups included.
    start = unfitted_terms() if logo and terms_file is None else _terms_from(terms_file)
    if out is not None:
        out = out_dir(out)  # a bad --out is said before the simulations, not after them
    if log is not None:
        # Said once the input is known good: bad input gets its one line alone.
        for line in clients_line(path, as_given, meet, served):
            log(line)
    folds = {}
    fold_sens: dict[str, dict] = {}
    fold_priors: dict[str, EngineTerms] = {}
    if logo or own_fit:
        how = (
            functools.partial(leave_one_group_out, pooled_prior=pooled_prior, predict=as_given if treat.blind else None)
            if logo
            else fit_each_group
        )
        res = how(
            rows,
            start=start,
            clients=per_client,
            max_evals=max_evals,
            profile=profile,
            workers=workers,
            exclude_from_training=exclude,
            sensitivity=sensitivity,
            log=log,
        )
        preds, folds, fold_sens, fold_priors = res.predictions, res.folds, res.sensitivity, res.priors
    else:
        preds = evaluate(rows, start, per_client, profile=profile, workers=workers)
    timing = None
    if client_timings:
        from .client_timing import client_timing

        if log is not None:
            log("client timing: every run simulated again under 3 other timings of its clients")
        timing = client_timing(rows, preds, start, per_client, profile=profile, workers=workers)
    sc = score(preds)
    busy_of = dict(zip(as_given, busy)) | dict(zip(rows, busy))
    shares_of = dict(zip(as_given, shares)) | dict(zip(rows, shares))
    doc = {
        "format": "kvsim-serving-validation",
        "version": 1,
        "file": str(path),
        "rows": len(rows),
        "skipped_rows": skipped,
        # What the reader passed over without an error: files that are not benchmark results, results
        # whose backend names no engine.
        "read_notes": notes,
        "protocol": (
            "leave-one-group-out: each (model, GPU, engine) group predicted by engine terms fitted on the "
            "other groups of its engine (where it has none, on the other engines' groups, shared)"
            + (
                ", each fit pulled towards terms shared by every training group (of every engine)"
                if pooled_prior
                else ""
            )
            + (
                "; the flagged runs treated in training only, each held-out group predicted from its runs as "
                "the file gives them"
                if treat.blind
                else ""
            )
            if logo
            else "own fit: each (model, GPU, engine) group simulated with engine terms fitted on its own rows "
            "(in-sample)"
            if own_fit
            else "engine terms as given (presets or terms file)"
        ),
        "excluded_from_training": list(exclude),
        "profile": profile or "auto",
        "requests_per_client": requests_per_client,
        "warmup_per_client": warmup,
        "served_by": served,
        "aiconfigurator_served_rows": sum(_served_as_aiconfigurator(r, served) for r in as_given),
        "clients": meet,
        "clients_apart_rows": sum(1 for r in as_given if r.start_spread_cycles),
        "metric": "mean TTFT and mean TPOT over each run's requests (after each client's warm-up, if any), relative error "
        "(simulated - measured) / measured",
        "terms": start.engines,
        "folds": {g: t.engines for g, t in folds.items()},
        "fold_priors": {g: t.engines for g, t in fold_priors.items()},
        "fold_sensitivity": fold_sens,
        "score": sc,
        "ttft_follows_completions": checked.flagged,
        "held_back": checked.held,
        "clients_apart": checked.apart,
        "spread": checked.spread,
        "faster_than_kernels": checked.fast,
        "fast_runs": checked.fast_runs,
        "least_cached_share": checked.cached_share,
        "cached": checked.cached,
        "kv_capacity": checked.kv,
        "kv_from_runs": checked.kv_set,
        "roofline_priced": roofline_groups(preds),
        "tpot_error_split": tpot_error_split(preds, shares_of),
        "tp_scaling": tp_scaling(preds),
        "ttft_vs_prefill": ttft_vs_prefill(preds, shares_of),
        "client_timing": timing,
        "results": [
            {
                **r.to_json(),
                "implied_gpu_busy": busy_of.get(r.row),
                "prefill_share": None if (sh := shares_of.get(r.row)) is None else sh[0],
            }
            for r in preds
        ],
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "serving_validation.json").write_text(json.dumps(doc, indent=1) + "\n")
        write_html(doc, out / "serving_validation.html")
    return doc


def write_html(doc: dict, path: Path) -> Path:
    """Predicted against measured TTFT and TPOT per group (log-log, the diagonal and ±20 % bands),
    each row's TPOT error against its prefill share of wall time with the group's line
    (``tpot_error_split``), and what the group's largest pair of GPU counts buys against
    concurrency, measured and simulated (``tp_scaling``): one colour per group across the four
    panels. With ``client_timing``, a fifth panel: each group's TTFT median |error| as simulated and
    under each other client timing."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    timing = doc.get("client_timing") or {}
    fig = make_subplots(
        rows=3 if timing else 2,
        cols=2,
        specs=[[{}, {}], [{}, {}]] + ([[{"colspan": 2}, None]] if timing else []),
        subplot_titles=(
            "mean TTFT (ms)",
            "mean TPOT (ms)",
            "TPOT error (%) against prefill share",
            "what more GPUs buy: TPOT at the smaller GPU count / at the larger",
            *(["TTFT median |error| (%) with the clients timed otherwise (--client-timing)"] if timing else []),
        ),
    )
    groups = sorted({r["group"] for r in doc["results"]})
    flagged = doc.get("ttft_follows_completions", {})
    fast = doc.get("faster_than_kernels", {})
    fast_runs = doc.get("fast_runs", {})
    split = doc.get("tpot_error_split", {})
    scaling = doc.get("tp_scaling", {})
    held = doc.get("held_back", {})
    apart = doc.get("clients_apart", {})
    spread = doc.get("spread", [])
    cached = doc.get("cached", [])
    share = doc.get("least_cached_share", {})
    roofline = doc.get("roofline_priced", {})
    kv = doc.get("kv_capacity", {})
    kv_set = doc.get("kv_from_runs", {})
    # Groups whose every run started its clients apart (--clients, or the rows' own column).
    started_apart = {
        g for g in groups if all(r.get("start_spread_cycles") for r in doc["results"] if r["group"] == g)
    } - set(spread)
    palette = qualitative.Plotly
    for i, g in enumerate(groups):
        color = palette[i % len(palette)]
        # A group that looks mis-measured says so in the legend.
        notes = (
            ([f"TTFT follows completions at c {'/'.join(map(str, flagged[g]))}"] if g in flagged else [])
            + ([f"simulated with c - 1 running at c {'/'.join(map(str, held[g]))}"] if g in held else [])
            + (["clients not started together"] if g in apart else [])
            + (["simulated with their starts spread"] if g in spread else [])
            + (["clients simulated apart"] if g in started_apart else [])
            + ([f"faster than its kernels: GPU busy {fast[g]:.2f}x"] if g in fast else [])
            + (
                [f"{len(fast_runs[g])} run{'s' if len(fast_runs[g]) > 1 else ''} faster than the kernels"]
                if g in fast_runs
                else []
            )
            + ([f"simulated with {share[g]:.0%} of each prompt cached"] if g in cached and g in share else [])
            + ([f"{roofline[g]} runs priced by the roofline prior"] if g in roofline else [])
            + [
                f"waits for KV from {v['waits_from']:,} tokens at {k[len(g) + 1 :].split()[0]}"
                + (f", simulated with {kv_set[k]:,}" if k in kv_set else "")
                for k, v in kv.items()
                if k.startswith(g + " tp")
            ]
        )
        label = g if not notes else f"{g} ({'; '.join(notes)})"
        rs = [r for r in doc["results"] if r["group"] == g and r["error"] is None]
        text = [
            f"isl {r['isl']} osl {r['osl']} c {r['concurrency']} tp {r['tp']}"
            + (f", GPU busy {r['implied_gpu_busy']:.2f}x" if r.get("implied_gpu_busy") is not None else "")
            for r in rs
        ]
        for col, m in ((1, "ttft_ms"), (2, "tpot_ms")):
            fig.add_trace(
                go.Scatter(
                    x=[r[m] for r in rs],
                    y=[r["sim_" + m] for r in rs],
                    mode="markers",
                    name=label,
                    legendgroup=g,
                    showlegend=col == 1,
                    text=text,
                    marker={"size": 6, "color": color},
                ),
                row=1,
                col=col,
            )
        if g in scaling:
            top, pts = largest_pair(scaling[g])
            for key, dash in (("measured", "solid"), ("simulated", "dash")):
                fig.add_trace(
                    go.Scatter(
                        x=[p["concurrency"] for p in pts],
                        y=[p[key] for p in pts],
                        mode="lines+markers",
                        name=f"{g}: TP {top[0]} to {top[1]}, {key}",
                        legendgroup=g,
                        showlegend=False,
                        text=[f"{p['runs']} length pairs" for p in pts],
                        line={"color": color, "dash": dash, "width": 2},
                    ),
                    row=2,
                    col=2,
                )
        shared = [
            (r, t) for r, t in zip(rs, text) if r.get("prefill_share") is not None and r["tpot_rel_err"] is not None
        ]
        fig.add_trace(
            go.Scatter(
                x=[r["prefill_share"] for r, _ in shared],
                y=[100 * r["tpot_rel_err"] for r, _ in shared],
                mode="markers",
                name=label,
                legendgroup=g,
                showlegend=False,
                text=[t for _, t in shared],
                marker={"size": 5, "color": color},
            ),
            row=2,
            col=1,
        )
        if g in split:
            f = split[g]
            lo, hi = f["prefill_share"]
            fig.add_trace(
                go.Scatter(
                    x=[lo, hi],
                    y=[100 * (f["decode"] + f["per_prefill"] * x) for x in (lo, hi)],
                    mode="lines",
                    name=f"{g}: {f['decode']:+.1%} with no prefill, {f['per_prefill']:+.2f} per prefill share",
                    legendgroup=g,
                    showlegend=False,
                    line={"color": color, "dash": "dash", "width": 2},
                ),
                row=2,
                col=1,
            )
    for col, m in ((1, "ttft_ms"), (2, "tpot_ms")):
        vals = [r[m] for r in doc["results"]] + [r["sim_" + m] for r in doc["results"] if r["sim_" + m]]
        lo, hi = min(vals) * 0.8, max(vals) * 1.25
        for f, dash in ((1.0, "solid"), (1.2, "dot"), (1 / 1.2, "dot")):
            fig.add_trace(
                go.Scatter(
                    x=[lo, hi],
                    y=[lo * f, hi * f],
                    mode="lines",
                    showlegend=False,
                    line={"color": "grey", "dash": dash, "width": 1},
                ),
                row=1,
                col=col,
            )
        fig.update_xaxes(type="log", title_text="measured", row=1, col=col)
        fig.update_yaxes(type="log", title_text="simulated", row=1, col=col)
    fig.add_hline(y=0, line={"color": "grey", "width": 1}, row=2, col=1)
    fig.update_xaxes(title_text="share of wall time in prefills (measured rate x kvsim's prefill)", row=2, col=1)
    fig.update_yaxes(title_text="(simulated - measured) / measured, %", row=2, col=1)
    fig.add_hline(y=1, line={"color": "grey", "width": 1}, row=2, col=2)
    fig.update_xaxes(type="log", title_text="concurrency (solid: measured, dashed: simulated)", row=2, col=2)
    fig.update_yaxes(title_text="TPOT gain", row=2, col=2)
    if timing:
        _timing_panel(fig, go, doc, timing, row=3)
    o = doc["score"]["overall"]
    n_skipped = len(doc.get("skipped_rows", []))
    left_out = f" ({n_skipped} rows of the file left out: skipped_rows in serving_validation.json)" if n_skipped else ""
    fig.update_layout(
        title=f"kvsim against real servers: {doc['rows']} runs{left_out}, {doc['protocol']}<br>"
        f"TTFT median |err| {o['ttft'].get('median_abs', float('nan')):.1%}, "
        f"TPOT median |err| {o['tpot'].get('median_abs', float('nan')):.1%}",
        height=1700 if timing else 1200,
        width=1500,
    )
    path.write_text(fig.to_html(include_plotlyjs=True, full_html=True))
    return path


def _timing_panel(fig, go, doc: dict, timing: dict, row: int) -> None:
    """Grouped bars: per group and over all rows, TTFT median |error| as simulated and under each
    timing of ``timing`` (:func:`calibration.client_timing.client_timing`)."""
    from .client_timing import median_pct

    groups = sorted(doc["score"]["groups"])
    columns = {"as simulated": doc["score"], **timing}
    for name, v in columns.items():
        ys = [median_pct(v["groups"][g]["ttft"]) for g in groups] + [median_pct(v["overall"]["ttft"])]
        fig.add_trace(
            go.Bar(
                x=[*groups, "all"],
                y=ys,
                name=f"clients {name}",
                legendgroup="client timing",
                text=[None if y is None else f"{y:.0f}" for y in ys],
            ),
            row=row,
            col=1,
        )
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="TTFT median |error|, %", row=row, col=1)


def calibrate_from_serving_bench(
    path: str,
    out: Path,
    *,
    profile: str | None = None,
    engine: str | None = None,
    terms_file: str | None = None,
    requests_per_client: int = Clients.requests_per_client,
    warmup: int = Clients.warmup,
    max_evals: int = 100,
    workers: int = 1,
    gpu: str | None = None,
    tp: int | None = None,
    weights: str | None = None,
    kv: str | None = None,
    kv_cache_tokens: int | None = None,
    model: str | None = None,
    exclude: tuple[str, ...] = (),
    treat: Treatments = Treatments(),
    served_by: str | None = None,
    clients: str | None = None,
    sensitivity: bool = True,
    prior: bool = False,
    progress: Callable[[str, int, float, dict], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> EngineTerms:
    """Fit every engine's terms on the file's rows (not on the groups in ``exclude``,
    :func:`resolve_exclusions`) and write them as a terms file (``engine.terms_file`` in a
    scenario uses them); ``warn`` hears :func:`completion_warnings`, :func:`apart_warnings` and
    :func:`kernel_warnings` before the fit starts. ``treat``: what to fit the flagged runs and groups
    as (:class:`Treatments`). ``served_by``: :func:`served_by_rows`; ``clients``: :func:`clients_rows`. ``sensitivity``: also probe how
    firmly the rows pin each term (:func:`term_sensitivity`, kept in the file as ``sensitivity``).
    ``prior``: each engine's fit is pulled towards its starting terms (the presets', or
    ``terms_file``'s; :func:`calibration.serving_fit.prior_penalty`)."""
    skipped: list[str] = []
    notes: list[str] = []
    served = served_by if served_by is not None else "auto"
    meet = clients_mode(clients)
    rows = selected_rows(path, engine, gpu, tp, weights, kv, skipped, served, kv_cache_tokens, model=model, notes=notes)
    checked = check_rows(rows, profile, exclude, treat, meet, served)
    out = out_file(out)  # a bad --out is said before the fit, which can take an hour, not after it
    if warn is not None:
        for line in (
            notes
            + skipped_lines(skipped)
            + served_by_line(path, rows, served)
            + clients_line(path, checked.given, meet, served)
            + variant_lines(rows)
            + completion_warnings(checked.flagged, checked.held)
            + apart_warnings(checked.apart, checked.spread)
            + kernel_warnings(checked.fast, checked.cached_share, checked.cached)
            + fast_run_warnings(checked.fast_runs)
            + kv_warnings(checked.kv, checked.kv_set)
            + few_runs_lines(checked.rows, checked.exclude, prior)
        ):
            warn(line)
    start = _terms_from(terms_file)
    pull = start if prior else None
    terms = fit(
        checked.rows,
        start,
        Clients(requests_per_client=requests_per_client, warmup=warmup),
        max_evals=max_evals,
        profile=profile,
        workers=workers,
        exclude=checked.exclude,
        prior=pull,
        progress=progress,
    )
    if sensitivity:
        terms.sensitivity = term_sensitivity(
            checked.rows,
            terms,
            Clients(requests_per_client=requests_per_client, warmup=warmup),
            profile=profile,
            workers=workers,
            exclude=checked.exclude,
            prior=pull,
        )
    terms.fitted_on = str(path)
    terms.write(out)
    return terms


__all__ = [
    "validate_serving_bench",
    "calibrate_from_serving_bench",
    "Treatments",
    "resolve_exclusions",
    "completion_warnings",
    "apart_warnings",
    "kernel_warnings",
    "kv_warnings",
    "roofline_warnings",
    "sensitivity_lines",
    "unpinned_warnings",
    "skipped_lines",
    "listed_lines",
    "few_runs_lines",
    "table_rows",
    "HEADER",
    "RowResult",
]
