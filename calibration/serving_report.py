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
from pathlib import Path

from sim.errors import ConfigError
from sim.output.staging import out_dir, out_file

from .serving_evidence import (
    tp_scaling,
    tpot_error_split,
    ttft_vs_prefill,
)
from .serving_fit import (
    EngineTerms,
    builtin_terms,
    evaluate,
    fit,
    fit_each_group,
    leave_one_group_out,
    term_sensitivity,
    unfitted_terms,
)
from .serving_html import write_html
from .serving_notes import (
    apart_warnings,
    completion_warnings,
    fast_run_warnings,
    few_runs_lines,
    kernel_warnings,
    kv_warnings,
    roofline_groups,
    skipped_lines,
)
from .serving_runs import Clients, score
from .serving_selection import (
    Treatments,
    check_rows,
    clients_line,
    clients_mode,
    selected_rows,
    served_as_aiconfigurator,
    served_by_line,
    variant_lines,
)


def _terms_from(path: str | None) -> EngineTerms:
    if path is None:
        return builtin_terms()
    from sim.engine_presets import read_terms_file

    base = builtin_terms()
    for e, t in read_terms_file(Path(path)).items():
        base.engines.setdefault(e, {}).update(t)
    return base


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
    # The groups flagged as a whole: their rows stay in the table and in the overall figure, and
    # a second overall figure leaves them out (the targets judged on consistent runs).
    sc = score(preds, set_aside=[*checked.fast, *checked.apart])
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
        "aiconfigurator_served_rows": sum(served_as_aiconfigurator(r, served) for r in as_given),
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


__all__ = ["validate_serving_bench", "calibrate_from_serving_bench"]
