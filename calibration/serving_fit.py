"""Fit serving-engine terms to end-to-end benchmarks (``kvsim calibrate --from-serving-bench``).

Per engine a handful of terms (``sim.engine_presets.FITTED_TERMS``: host time per iteration and
per sequence, the share of it hidden behind the GPU, the per-request front end, and how much each
request's client and front-end time varies, which drifts clients that start together apart) are
chosen to minimise, over the benchmark rows::

    mean over (model, GPU, engine) groups of  mean |log(sim TPOT / meas TPOT)| + mean |log(sim TTFT / meas TTFT)|

each row simulated by kvsim with those terms (:mod:`calibration.serving_runs`). Nelder–Mead in
transformed coordinates (logarithms of times, logits of shares), from the built-in presets.
Groups, not rows, are weighted equally, so a large group does not dominate.

:func:`leave_one_group_out` fits without each group and predicts it: the honest accuracy of the
procedure on a model, GPU or engine it has not seen (with ``pooled_prior``, each fold's fit pulled
towards terms shared by all its training groups, :func:`prior_penalty`). :func:`fit_each_group` fits each group on its
own rows: the floor the terms can reach, what a user calibrating on their own server gets. No torch.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from sim.engine_presets import FITTED_TERMS, PRESETS, TERM_RANGES, TERMS_FORMAT
from sim.errors import ConfigError

from .serving_bench import BenchRow
from .serving_runs import Clients, RowResult, simulate_row

FORMAT = TERMS_FORMAT

#: Transform of each fitted quantity to the optimiser's unbounded coordinate.
#: Times are logarithms, shares logits, and the clients' and front end's coefficient of variation a
#: logarithm above a floor (a spread of 0 is a start, not a value the fit has to reach exactly)
#: and below its allowed maximum.
_SHARE = {"host_hidden", "client_spread_cycles"}
_CV_FLOOR = 0.05
_CV_MAX = TERM_RANGES["client_cv"][1]


def _to_x(name: str, v: float) -> float:
    if name == "client_cv":
        return math.log(max(v, _CV_FLOOR))
    if name in _SHARE:
        p = min(max(v, 1e-3), 1 - 1e-3)
        return math.log(p / (1 - p))
    return math.log(max(v, 1e-9))


#: Terms that start at (or near) no effect, where a third of a decade on their log scale would
#: still be none: below the first value, the first step goes to the second. ``client_cv`` from
#: (near) no spread to 0.5; ``completion_per_token_s`` from the presets' 0 (log floor 1 ns) to 5 us
#: per output token, where it first moves TTFT. Its effect comes in steps (clients leave a shared
#: iteration once their handling outlasts it), and a simplex that starts small ends on the first.
_STEP_OFF_NONE = {"client_cv": (0.2, 0.5), "completion_per_token_s": (1e-6, 5e-6)}
#: Terms a fit starts elsewhere when they are below the first value: at the second, stepping from
#: there as from any time. ``stream_per_token_s`` at 50 us per token, a ceiling of 20 k tokens/s,
#: about what the fastest runs measured so far reach: its ceiling moves TTFT smoothly, and a first
#: step from the presets' 0 (ten decades below on its log scale) would spend the fit's evaluations
#: coming back. ``eager_host_per_layer_s`` (fitted only when asked for) at half a millisecond per layer,
#: where it binds on a small model split over a few GPUs: below a layer's GPU time it changes nothing,
#: and a simplex started there never leaves.
_START_OFF_ZERO = {"stream_per_token_s": (1e-6, 50e-6), "eager_host_per_layer_s": (1e-6, 0.5e-3)}


def _step(name: str, v: float) -> float:
    """The initial simplex's step of one term in the optimiser's coordinate: 0.3 in log space for
    times (a third of a decade), and for shares a move of 0.1 in value towards the middle: a step
    of 0.3 in logit space from a share at its bound (0, as the presets start the clients' spread
    and the hidden host share) moves it by a thousandth, too little to change any simulated time,
    and the fit would never leave the bound."""
    off = _STEP_OFF_NONE.get(name)
    if off is not None and v < off[0]:
        return _to_x(name, off[1]) - _to_x(name, v)
    if name not in _SHARE:
        return 0.3
    p = min(max(v, 1e-3), 1 - 1e-3)
    q = p + 0.1 if p < 0.5 else p - 0.1
    return _to_x(name, q) - _to_x(name, p)


def _from_x(name: str, x: float) -> float:
    if name in _SHARE:
        return 1.0 / (1.0 + math.exp(-x))
    if name == "client_cv":
        return math.exp(min(x, math.log(_CV_MAX)))
    return math.exp(min(x, 50.0))


@dataclass
class EngineTerms:
    """Fitted terms per engine: ``engines[engine][term]``."""

    engines: dict[str, dict[str, float]]
    loss: float = float("nan")
    evals: int = 0
    fitted_on: str = ""
    groups: list[str] = field(default_factory=list)
    #: How firmly the rows pin each fitted term (:func:`term_sensitivity`), ``{engine: {"objective", "terms"}}``;
    #: empty unless asked for.
    sensitivity: dict[str, dict] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": 1, **asdict(self)}

    def write(self, path: Path | str) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path


#: Where leave-one-group-out starts each fold when given no terms: the presets' values before any
#: fit (round numbers from the engines' documentation; the token stream at 50 us per token, the
#: order of what one Python process spends sending a token), so that no fold starts from terms the
#: held-out group helped fit (the built-in presets were fitted on every row of the shipped file).
UNFITTED_START: dict[str, dict[str, float]] = {
    "vllm": {
        "host_s": 1.0e-3,
        "host_per_seq_s": 10e-6,
        "host_hidden": 0.0,
        "frontend_s": 5e-3,
        "client_cv": 0.5,
        "stream_per_token_s": 50e-6,
    },
    "sglang": {
        "host_s": 0.5e-3,
        "host_per_seq_s": 10e-6,
        "host_hidden": 0.0,
        "frontend_s": 5e-3,
        "client_cv": 0.5,
        "stream_per_token_s": 50e-6,
    },
    "trtllm": {
        "host_s": 1.0e-3,
        "host_per_seq_s": 10e-6,
        "host_hidden": 0.0,
        "frontend_s": 5e-3,
        "client_cv": 0.5,
        "stream_per_token_s": 50e-6,
    },
}


class FitReporter(Protocol):
    """What a fit says of its progress while it runs (:func:`reporting`): the fold it is in, the
    phase (a fit, a sensitivity probe, a prediction) and how many of its evaluations are done. It
    only watches: it is told after each evaluation and never changes what is simulated."""

    def fold(self, index: int, count: int, label: str) -> None: ...

    def phase(self, label: str, total: int | None) -> None: ...

    def evals(self, done: int) -> None: ...


# A context variable rather than an argument: the commands reach these fits through
# calibration.serving_report, whose signatures stay as they are.
FIT_REPORTER: ContextVar[FitReporter | None] = ContextVar("kvsim_serving_fit_reporter", default=None)


@contextmanager
def reporting(reporter: FitReporter | None) -> Iterator[None]:
    """Fits run inside this block tell ``reporter`` their progress (none with ``None``)."""
    token = FIT_REPORTER.set(reporter)
    try:
        yield
    finally:
        FIT_REPORTER.reset(token)


def _fold(index: int, count: int, label: str) -> None:
    rep = FIT_REPORTER.get()
    if rep is not None:
        rep.fold(index, count, label)


def _phase(label: str, total: int | None) -> None:
    rep = FIT_REPORTER.get()
    if rep is not None:
        rep.phase(label, total)


def _evals(done: int) -> None:
    rep = FIT_REPORTER.get()
    if rep is not None:
        rep.evals(done)


def _fold_label(row: BenchRow) -> str:
    """``Llama-3.1-70B / h200_sxm / trtllm``: the model without its organisation, to stay short."""
    return f"{row.model.rsplit('/', 1)[-1]} / {row.gpu} / {row.engine}"


def unfitted_terms() -> EngineTerms:
    """:data:`UNFITTED_START` as terms."""
    return EngineTerms({e: dict(t) for e, t in UNFITTED_START.items()})


def builtin_terms() -> EngineTerms:
    """The built-in presets' fitted terms, as a starting point."""
    return EngineTerms({e: {k: float(getattr(p, k)) for k in FITTED_TERMS} for e, p in PRESETS.items()})


def objective(results: list[RowResult]) -> float:
    """Mean over groups of the mean |log ratio| of TPOT plus that of TTFT (a failed row counts 3; a
    run of one output token has no time per output token, and counts its TTFT alone)."""
    by: dict[str, list[float]] = {}
    for r in results:
        if r.error is None and r.ttft_ms is not None and r.tpot_ms is None and r.row.osl < 2:
            v = abs(math.log(r.ttft_ms / r.row.ttft_ms))
        elif r.error is not None or r.ttft_ms is None or r.tpot_ms is None:
            v = 3.0
        else:
            v = abs(math.log(r.tpot_ms / r.row.tpot_ms)) + abs(math.log(r.ttft_ms / r.row.ttft_ms))
        by.setdefault(r.row.group, []).append(v)
    return float(np.mean([np.mean(v) for v in by.values()])) if by else float("nan")


def _task(args) -> RowResult:
    row, clients, engine, profile = args
    return simulate_row(row, clients, engine=engine, profile=profile)


class _Pool:
    """Simulates rows in worker processes (or inline with one worker). The workers are the sweeps'
    (:func:`sim.analysis.sweep.process_pool`): they die with this process, and a fit left by an
    exception (Ctrl-C) kills them instead of waiting for their rows."""

    def __init__(self, workers: int):
        from sim.analysis.sweep import process_pool

        self.pool = process_pool(workers) if workers > 1 else None

    def run(self, tasks: list) -> list[RowResult]:
        if self.pool is None:
            return [_task(t) for t in tasks]
        return list(self.pool.map(_task, tasks, chunksize=max(1, len(tasks) // 16)))

    def close(self, failed: bool = False) -> None:
        if self.pool is not None:
            if failed:
                self.pool.stop()
            else:
                self.pool.shutdown()

    def __enter__(self) -> _Pool:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)


def evaluate(
    rows: list[BenchRow],
    terms: EngineTerms,
    clients: Clients = Clients(),
    *,
    profile: str | None = None,
    pool: _Pool | None = None,
    workers: int = 1,
) -> list[RowResult]:
    """Every row simulated with ``terms``."""
    tasks = [(r, clients, dict(terms.engines.get(r.engine, {})), profile) for r in rows]
    if pool is not None:
        return pool.run(tasks)
    with _Pool(workers) as own:
        return own.run(tasks)


def fit(
    rows: list[BenchRow],
    start: EngineTerms | None = None,
    clients: Clients = Clients(),
    *,
    terms: tuple[str, ...] = FITTED_TERMS,
    max_evals: int = 100,
    profile: str | None = None,
    workers: int = 1,
    exclude: tuple[str, ...] = (),
    prior: EngineTerms | None = None,
    progress: Callable[[str, int, float, dict], None] | None = None,
) -> EngineTerms:
    """Terms of every engine in ``rows`` minimising :func:`objective`, not trained on the groups in
    ``exclude``. Engines share no term, so each is fitted on its own rows alone; an engine whose
    rows are all excluded keeps its starting terms. With ``prior``, an engine it holds terms for
    minimises the objective plus :func:`prior_penalty` (its reported ``loss`` includes it)."""
    if not rows:
        raise ConfigError("serving_bench", "no rows", "at least one benchmark row to fit on")
    start = start or builtin_terms()
    train_rows = [r for r in rows if r.group not in exclude]
    out = EngineTerms({}, loss=0.0, evals=0, groups=sorted({r.group for r in train_rows}))
    losses = []
    with _Pool(workers) as pool:
        for engine in sorted({r.engine for r in rows}):
            mine = [r for r in train_rows if r.engine == engine]
            if not mine:
                out.engines[engine] = _start_of(start, engine)
                continue
            pe = None if prior is None else prior.engines.get(engine)
            _phase(f"{engine} fit", max_evals)
            terms_e, loss, n = _fit_engine(
                mine, engine, start, clients, terms, max_evals, profile, pool, progress, prior=pe
            )
            out.engines[engine] = terms_e
            out.evals += n
            losses += [loss] * len({r.group for r in mine})
    out.loss = float(np.mean(losses)) if losses else float("nan")
    return out


def fit_shared(
    rows: list[BenchRow],
    engine: str,
    start: EngineTerms | None = None,
    clients: Clients = Clients(),
    *,
    terms: tuple[str, ...] = FITTED_TERMS,
    max_evals: int = 100,
    profile: str | None = None,
    workers: int = 1,
    progress: Callable[[str, int, float, dict], None] | None = None,
    phase: str | None = None,
) -> EngineTerms:
    """One set of terms for ``engine`` fitted on rows of any engine, each row simulated with its own
    engine's scheduler and kernels but these terms: the estimate for an engine the data hold no
    run of (the terms of the engines that were measured, pooled). ``phase``: what a progress display
    (:func:`reporting`) calls the fit."""
    if not rows:
        raise ConfigError("serving_bench", "no rows", "at least one benchmark row to fit on")
    start = start or builtin_terms()
    _phase(phase or f"shared fit for {engine}", max_evals)
    with _Pool(workers) as pool:
        t, loss, n = _fit_engine(
            rows,
            engine,
            start,
            clients,
            terms,
            max_evals,
            profile,
            pool,
            progress,
            shared=tuple(sorted({r.engine for r in rows})),
        )
    return EngineTerms({engine: t}, loss=loss, evals=n, groups=sorted({r.group for r in rows}))


#: A fitted time or spread is probed at this factor below and above its value by
#: :func:`term_sensitivity`; a share (``host_hidden``) at :data:`SENSITIVITY_SHARE_STEP` either side.
SENSITIVITY_FACTOR = 2.0
SENSITIVITY_SHARE_STEP = 0.25  # calibration.serving_notes.PROBED says both in words
#: A term is pinned by the rows when one of its probes raises the objective (a mean |log ratio|,
#: close to a relative error) by at least this much: half a point of error.
PINNED_RISE = 0.005
#: Weight of a fit's pull towards a prior (:func:`prior_penalty`, per squared unit of the fit's
#: coordinates): a term moved a factor of 2 from the prior costs what makes a term pinned
#: (:data:`PINNED_RISE`), so terms the rows pin follow the rows and the rest stay near the prior.
PRIOR_WEIGHT = PINNED_RISE / math.log(2.0) ** 2
#: A probe that lowers the objective by more than this says the fit stopped short of its minimum in
#: that term (more evaluations would move it).
SHORT_OF_MINIMUM = 0.002


def _probes(name: str, v: float, engine: str) -> list[float]:
    """The values :func:`term_sensitivity` tries for one term: within its allowed range, never the
    value itself. A time or spread at 0 is tried at the unfitted start's value instead (a factor of
    0 is 0)."""
    lo, hi = TERM_RANGES[name]
    if name in _SHARE:
        cand = [v - SENSITIVITY_SHARE_STEP, v + SENSITIVITY_SHARE_STEP]
    elif v > 0:
        cand = [v / SENSITIVITY_FACTOR, v * SENSITIVITY_FACTOR]
    else:
        cand = [UNFITTED_START.get(engine, {}).get(name, 0.0)]
    out = []
    for x in cand:
        x = min(max(x, lo), hi)
        if x != v and x not in out:
            out.append(x)
    return out


def term_sensitivity(
    rows: list[BenchRow],
    terms: EngineTerms,
    clients: Clients = Clients(),
    *,
    profile: str | None = None,
    workers: int = 1,
    exclude: tuple[str, ...] = (),
    prior: EngineTerms | None = None,
) -> dict[str, dict]:
    """How firmly ``rows`` pin each engine's fitted terms: the objective (:func:`objective`, on the
    engine's rows outside ``exclude``, as the fit saw them) with one term moved at a time, halved
    and doubled (a share: 0.25 down and up), the others as fitted. ``{engine: {"objective",
    "terms": {term: {"value", "probes": [{"value", "objective_change"}], "pinned",
    "short_of_minimum"}}}}``, where ``objective_change`` is the probe's objective less the fitted
    terms' (``objective``); ``pinned``: a probe raises the objective by :data:`PINNED_RISE` or more
    (the rows say what the term is; one that is not pinned could be far from its fitted value and
    fit these rows as well, and carries least to another model, GPU or load);
    ``short_of_minimum``: a probe lowers it by more than :data:`SHORT_OF_MINIMUM` (the fit stopped
    before its minimum: more evaluations would move the term). A fit pulled towards ``prior``
    minimised the objective plus the pull (:func:`prior_penalty`): each probe also says how the pull
    changes (``pull_change``), and only their sum can show the fit short of its minimum; what the
    rows pin is still the objective's alone. Costs one simulation of the rows per probe, 13 per
    engine."""
    train = [r for r in rows if r.group not in exclude]
    out: dict[str, dict] = {}
    with _Pool(workers) as pool:
        for engine in sorted({r.engine for r in train}):
            mine = [r for r in train if r.engine == engine]
            fitted = terms.engines.get(engine)
            if not mine or fitted is None:
                continue
            base = objective(evaluate(mine, EngineTerms({engine: fitted}), clients, profile=profile, pool=pool))
            pe = None if prior is None else prior.engines.get(engine)
            pull0 = 0.0 if pe is None else prior_penalty(fitted, pe)
            per: dict[str, dict] = {}
            probed = 0
            _phase(
                f"{engine} sensitivity",
                sum(len(_probes(k, float(fitted.get(k, getattr(PRESETS[engine], k))), engine)) for k in FITTED_TERMS),
            )
            for name in FITTED_TERMS:
                v = float(fitted.get(name, getattr(PRESETS[engine], name)))
                probes = []
                for x in _probes(name, v, engine):
                    moved = EngineTerms({engine: {**fitted, name: x}})
                    loss = objective(evaluate(mine, moved, clients, profile=profile, pool=pool))
                    probed += 1
                    _evals(probed)
                    probe = {"value": x, "objective_change": loss - base}
                    if pe is not None:
                        probe["pull_change"] = prior_penalty(moved.engines[engine], pe) - pull0
                    probes.append(probe)
                changes = [p["objective_change"] for p in probes]
                pulled = [p["objective_change"] + p.get("pull_change", 0.0) for p in probes]
                per[name] = {
                    "value": v,
                    "probes": probes,
                    "pinned": bool(changes) and max(changes) >= PINNED_RISE,
                    "short_of_minimum": bool(pulled) and min(pulled) < -SHORT_OF_MINIMUM,
                }
            out[engine] = {"objective": base, "terms": per}
    return out


#: The clients' spreads (request cycles) tried before the simplex starts: lock-step, a little
#: drift, a third and all of a cycle.
SPREAD_STARTS = (0.0, 0.1, 0.3, 0.95)
#: Front-end times (s) tried with each spread: the front end and the spread both move TTFT, in
#: opposite directions at high concurrency, so a fit from one front end settles on the spread that
#: suits it (servers measured so far need 5-150 ms per request outside the engine).
FRONTEND_STARTS = (5e-3, 30e-3, 100e-3)


def _start_of(start: EngineTerms, engine: str, terms: tuple[str, ...] = ()) -> dict[str, float]:
    """The starting value of each fitted term, and of ``terms`` (a fit may ask for others, such as
    the clients' start spread): ``start``'s where it has one, else the preset's."""
    keys = dict.fromkeys((*FITTED_TERMS, *terms))
    return {k: start.engines.get(engine, {}).get(k, float(getattr(PRESETS[engine], k))) for k in keys}


def _start_grid(terms: tuple[str, ...], base: dict[str, float]) -> list[dict[str, float]]:
    """Starting points tried before the simplex: every front end of :data:`FRONTEND_STARTS` and the
    starting one, with every spread of :data:`SPREAD_STARTS` where the spread is fitted too."""
    spreads = SPREAD_STARTS if "client_spread_cycles" in terms else (None,)
    fronts = sorted({base["frontend_s"], *FRONTEND_STARTS}) if "frontend_s" in terms else [None]
    grid = []
    for s in spreads:
        for fe in fronts:
            point = {k: v for k, v in (("client_spread_cycles", s), ("frontend_s", fe)) if v is not None}
            if point:
                grid.append(point)
    return grid


def _pull(x: np.ndarray, prior_x: np.ndarray) -> float:
    """:data:`PRIOR_WEIGHT` × the squared distance between two points in the fit's coordinates."""
    return PRIOR_WEIGHT * float(np.sum((np.asarray(x) - prior_x) ** 2))


def prior_penalty(terms: dict[str, float], prior: dict[str, float]) -> float:
    """:data:`PRIOR_WEIGHT` × the squared distance of ``terms`` from ``prior`` in the fit's
    coordinates (logarithms of times, logits of shares), summed over the terms both hold."""
    keys = [k for k in terms if k in prior]
    return _pull(np.array([_to_x(k, terms[k]) for k in keys]), np.array([_to_x(k, prior[k]) for k in keys]))


def _fit_engine(rows, engine, start, clients, terms, max_evals, profile, pool, progress, shared=(), prior=None):
    from scipy.optimize import minimize

    base = _start_of(start, engine, terms)
    for t in terms:
        floor, first = _START_OFF_ZERO.get(t, (0.0, 0.0))
        if base[t] < floor:
            base[t] = first
    x0 = np.array([_to_x(t, base[t]) for t in terms])
    prior_x = None if prior is None else np.array([_to_x(t, prior[t]) for t in terms])

    def unpack(x) -> dict[str, float]:
        return {**base, **{t: _from_x(t, float(xi)) for t, xi in zip(terms, x)}}

    state = {"n": 0, "best": (float("inf"), x0)}
    # Nelder-Mead's first vertex is the best spread start, already simulated: ask once per point.
    seen: dict[tuple[float, ...], float] = {}

    def f(x) -> float:
        key = tuple(float(xi) for xi in x)
        if key in seen:
            return seen[key]
        one = EngineTerms({e: unpack(x) for e in (shared or (engine,))})
        v = objective(evaluate(rows, one, clients, profile=profile, pool=pool))
        if prior_x is not None:
            v += _pull(x, prior_x)
        seen[key] = v
        state["n"] += 1
        if v < state["best"][0]:
            state["best"] = (v, np.array(x))
        if progress:
            progress(engine, state["n"], v, unpack(x))
        _evals(state["n"])
        return v

    # The front end (and, where fitted, the clients' start spread) moves TTFT in steps (clients merge
    # into or leave a shared batch), and Nelder-Mead from one value stays in its basin: try a grid
    # first and start the simplex from the best point of it.
    grid = _start_grid(terms, base)
    if len(grid) > 1 and max_evals > 2 * len(grid):
        for point in grid:
            x = np.array(x0)
            for t, v in point.items():
                x[terms.index(t)] = _to_x(t, v)
            f(x)
        x0 = np.array(state["best"][1])
    simplex = np.vstack(
        [x0] + [x0 + _step(t, _from_x(t, float(x0[i]))) * np.eye(len(x0))[i] for i, t in enumerate(terms)]
    )
    minimize(
        f,
        x0,
        method="Nelder-Mead",
        options={"maxfev": max_evals - state["n"], "initial_simplex": simplex, "xatol": 0.02, "fatol": 1e-3},
    )
    return unpack(state["best"][1]), state["best"][0], state["n"]


@dataclass
class GroupFits:
    """Each row predicted by the fit made for its group (leave-one-group-out: on the other groups;
    :func:`fit_each_group`: on the group's own rows), and each group's terms."""

    predictions: list[RowResult]
    folds: dict[str, EngineTerms]
    #: Per group, how firmly its fit's training rows pin each term (:func:`term_sensitivity`), where
    #: asked for; a fold fitted on other engines' rows (shared terms) is not probed.
    sensitivity: dict[str, dict] = field(default_factory=dict)
    #: Per group, the terms its fit was pulled towards (leave-one-group-out with ``pooled_prior``).
    priors: dict[str, EngineTerms] = field(default_factory=dict)


#: The pooled prior of :func:`leave_one_group_out` is fitted on every this-many-th run of each group.
PRIOR_THIN = 3


def _every_nth_of_each_group(rows: list[BenchRow], n: int) -> list[BenchRow]:
    """The first, (n+1)-th, (2n+1)-th ... run of each group, in ``rows``' order."""
    seen: dict[str, int] = {}
    out = []
    for r in rows:
        k = seen[r.group] = seen.get(r.group, -1) + 1
        if k % n == 0:
            out.append(r)
    return out


def leave_one_group_out(
    rows: list[BenchRow],
    *,
    start: EngineTerms | None = None,
    clients: Clients = Clients(),
    fit_clients: Clients | None = None,
    max_evals: int = 100,
    profile: str | None = None,
    workers: int = 1,
    exclude_from_training: tuple[str, ...] = (),
    sensitivity: bool = False,
    pooled_prior: bool = False,
    predict: list[BenchRow] | None = None,
    log: Callable[[str], None] | None = None,
) -> GroupFits:
    """For every group: fit its engine's terms on that engine's other groups (not on
    ``exclude_from_training``), then predict it. Where no other group of its engine is left, one set
    of terms is fitted on every other engine's training groups (:func:`fit_shared`): what a user
    gets for an engine the data hold no run of. Without ``start``: :func:`unfitted_terms`; the fits
    simulate ``fit_clients`` (without it, ``clients``, as the predictions do). ``sensitivity``: also
    probe how firmly each fold's training rows pin its terms (:attr:`GroupFits.sensitivity`).
    ``pooled_prior``: the engine's fit starts from, and is pulled towards (:func:`prior_penalty`),
    one set of terms fitted on every training group of every engine (:func:`fit_shared`), so the
    terms its own one or two groups leave free come from all the runs rather than from the fit's
    wandering. ``predict``: the rows each held-out group is predicted from, in ``rows``' order (the
    file's own runs where ``rows`` are those runs treated for what the checks flag: the treatments
    then shape the training alone); without it, ``rows``."""
    if predict is not None and len(predict) != len(rows):
        raise ValueError(f"predict: {len(predict)} rows for {len(rows)} training rows; they must line up")
    start = start or unfitted_terms()
    predict = rows if predict is None else predict
    fit_clients = fit_clients or clients
    groups = sorted({r.group for r in rows})
    preds: list[RowResult] = []
    folds: dict[str, EngineTerms] = {}
    sens: dict[str, dict] = {}
    priors: dict[str, EngineTerms] = {}
    for i, g in enumerate(groups, 1):
        t0 = time.perf_counter()
        held = [p for r, p in zip(rows, predict) if r.group == g]
        engine = held[0].engine
        _fold(i, len(groups), _fold_label(held[0]))
        train = [r for r in rows if r.engine == engine and r.group != g and r.group not in exclude_from_training]
        pooled = [r for r in rows if r.group != g and r.group not in exclude_from_training]
        if train:
            prior = None
            if pooled_prior:
                # Every third run of each group: the prior only has to place the terms the engine's
                # own runs leave free, and the pooled fit is the fold's costliest.
                thin = _every_nth_of_each_group(pooled, PRIOR_THIN)
                prior = priors[g] = fit_shared(
                    thin,
                    engine,
                    start,
                    fit_clients,
                    max_evals=max_evals,
                    profile=profile,
                    workers=workers,
                    phase="shared prior fit",
                )
            terms = fit(
                train, prior or start, fit_clients, max_evals=max_evals, profile=profile, workers=workers, prior=prior
            )
            note = f"{len(train)} training rows, loss {terms.loss:.3f}, {terms.evals} evaluations"
            if prior is not None:
                note = (
                    f"{len(train)} training rows, loss {terms.loss:.3f} with the pull towards terms shared by "
                    f"{len(thin)} of the {len(pooled)} training rows of every engine (loss {prior.loss:.3f}), "
                    f"{prior.evals} + {terms.evals} evaluations"
                )
            if sensitivity:
                sens[g] = term_sensitivity(train, terms, fit_clients, profile=profile, workers=workers, prior=prior)
        else:
            if not pooled:
                terms = EngineTerms({engine: _start_of(start, engine)})
                note = "no other group to fit on: starting terms"
            else:
                terms = fit_shared(
                    pooled,
                    engine,
                    start,
                    fit_clients,
                    max_evals=max_evals,
                    profile=profile,
                    workers=workers,
                    phase=f"shared fit (no other group of {engine})",
                )
                note = (
                    f"no other group of {engine}: terms shared by the other engines, {len(pooled)} training rows, "
                    f"loss {terms.loss:.3f}, {terms.evals} evaluations"
                )
        folds[g] = terms
        _phase("predicting the held-out group", None)
        preds += evaluate(held, terms, clients, profile=profile, workers=workers)
        if log:
            log(f"fold {g}: {note}, {time.perf_counter() - t0:.0f} s")
    return GroupFits(preds, folds, sens, priors)


def fit_each_group(
    rows: list[BenchRow],
    *,
    start: EngineTerms | None = None,
    clients: Clients = Clients(),
    max_evals: int = 100,
    profile: str | None = None,
    workers: int = 1,
    exclude_from_training: tuple[str, ...] = (),
    sensitivity: bool = False,
    log: Callable[[str], None] | None = None,
) -> GroupFits:
    """Every group's engine terms fitted on that group's rows alone, then the group simulated with
    them (in-sample): the least error the fitted terms can reach on runs like these, what
    ``kvsim calibrate --from-serving-bench`` gives a user who fits on their own server. Against
    :func:`leave_one_group_out` it separates what the model cannot express from what does not carry
    over between groups. A group in ``exclude_from_training`` is not fitted: it keeps the starting terms. Without
    ``start``: the built-in presets (where ``calibrate`` starts). ``sensitivity``: as in
    :func:`leave_one_group_out`, for each fitted group's own rows."""
    start = start or builtin_terms()
    preds: list[RowResult] = []
    folds: dict[str, EngineTerms] = {}
    sens: dict[str, dict] = {}
    groups = sorted({r.group for r in rows})
    for i, g in enumerate(groups, 1):
        t0 = time.perf_counter()
        mine = [r for r in rows if r.group == g]
        engine = mine[0].engine
        _fold(i, len(groups), _fold_label(mine[0]))
        if g in exclude_from_training:
            terms = EngineTerms({engine: _start_of(start, engine)})
            note = "excluded: starting terms"
        else:
            terms = fit(mine, start, clients, max_evals=max_evals, profile=profile, workers=workers)
            note = f"{len(mine)} rows, loss {terms.loss:.3f}, {terms.evals} evaluations"
            if sensitivity:
                sens[g] = term_sensitivity(mine, terms, clients, profile=profile, workers=workers)
        folds[g] = terms
        _phase("simulating the group", None)
        preds += evaluate(mine, terms, clients, profile=profile, workers=workers)
        if log:
            log(f"group {g}: {note}, {time.perf_counter() - t0:.0f} s")
    return GroupFits(preds, folds, sens)
