"""Which rows of a benchmark file a command simulates, and as what.

The rows a selection keeps (:func:`selected_rows`: model, GPU, engine, the file's variants), how
their servers were configured (:func:`served_by_rows`, ``--served-by``) and how their clients met
(:func:`clients_rows`, ``--clients``), the groups left out (:func:`resolve_exclusions`), the
treatments of the groups that look mis-measured (:class:`Treatments`), and :func:`check_rows`,
which runs the evidence checks (:mod:`calibration.serving_evidence`) before anything is simulated.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from sim.config import APART_SPREAD_CYCLES
from sim.engine_presets import normalize_engine
from sim.errors import ConfigError

from .served_by import aiconfigurator_run, aiconfigurator_server
from .serving_bench import TRAINING_FILE, BenchRow, none_left, read_bench, resolve_model
from .serving_evidence import (
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
    ttft_follows_completions,
)
from .serving_runs import setup_error


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
    return [aiconfigurator_server(r) if served_as_aiconfigurator(r, served_by) else r for r in rows]


def served_as_aiconfigurator(row: BenchRow, served_by: str) -> bool:
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
    return clients == "together" or (clients == "auto" and served_as_aiconfigurator(row, served_by))


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
