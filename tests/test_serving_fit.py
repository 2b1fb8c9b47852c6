"""Fitting engine terms on benchmark rows: known terms recovered from kvsim's own runs, sensitivity,
priors, leave-one-group-out and each group on its own runs, and terms files.

Rows are tiny (a few clients, short prompts, a few requests per client) so the file runs in
seconds; the accuracy on the shipped training file is measured by ``kvsim validate --serving-bench
builtin --logo``, not here.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace

import pytest

from _serving_helpers import FIXED, TINY, measured, row, with_terms
from calibration.serving_bench import (
    BenchRow,
)
from calibration.serving_evidence import (
    hold_back_flagged,
)
from calibration.serving_fit import (
    EngineTerms,
    builtin_terms,
    evaluate,
    fit,
    fit_each_group,
    leave_one_group_out,
    objective,
    prior_penalty,
    term_sensitivity,
)
from calibration.serving_runs import Clients, RowResult
from sim.config import scenario_from_dict
from sim.engine.deployment import engine_preset
from sim.engine_presets import FITTED_TERMS, PRESETS, read_terms_file
from sim.errors import ConfigError

# --- fitting ---------------------------------------------------------------------------------

#: Rows of two engines (each fitted on its own rows): concurrency and lengths vary so host time per
#: iteration (TPOT) and the front end (TTFT) are told apart.
FIT_ROWS = [
    row(engine=e, tp=tp, isl=isl, osl=osl, concurrency=c)
    for e in ("vllm", "trtllm")
    for tp, isl, osl, c in [(1, 256, 32, 2), (1, 512, 16, 8), (2, 128, 32, 4), (1, 1024, 16, 16)]
]
KNOWN = {"vllm": {"host_s": 3e-3, "frontend_s": 20e-3}, "trtllm": {"host_s": 0.4e-3, "frontend_s": 12e-3}}


def test_fit_recovers_known_terms():
    rows = measured(FIT_ROWS, with_terms(**KNOWN))
    start = with_terms()
    start_loss = objective(evaluate(rows, start, FIXED))
    assert start_loss > 0.2  # the start is far from the terms the rows were made with
    got = fit(rows, start, FIXED, terms=("host_s", "frontend_s"), max_evals=60)
    assert got.loss < 0.01 and got.loss == pytest.approx(objective(evaluate(rows, got, FIXED)))
    assert got.groups == sorted({r.group for r in rows})
    for e, known in KNOWN.items():
        for k, v in known.items():
            assert got.engines[e][k] == pytest.approx(v, rel=0.02), (e, k)
        # Terms not fitted stay where they started.
        assert got.engines[e]["host_per_seq_s"] == start.engines[e]["host_per_seq_s"]
    for res in evaluate(rows, got, FIXED):
        assert abs(res.ttft_err) < 0.02 and abs(res.tpot_err) < 0.02, res.row


def test_term_sensitivity_tells_the_terms_the_rows_pin_from_those_they_do_not():
    rows = measured(FIT_ROWS[:4], with_terms(vllm=KNOWN["vllm"]))
    truth = with_terms(vllm=KNOWN["vllm"])
    sens = term_sensitivity(rows, truth, FIXED)
    assert set(sens) == {"vllm"} and sens["vllm"]["objective"] < 1e-6  # the rows were made with these terms
    got = sens["vllm"]["terms"]
    assert list(got) == list(FITTED_TERMS)
    # Host time sets TPOT and the front end TTFT: halving or doubling either costs points of error.
    for name in ("host_s", "frontend_s", "host_hidden"):
        assert got[name]["pinned"] and max(p["objective_change"] for p in got[name]["probes"]) > 0.02, name
    assert [p["value"] for p in got["host_s"]["probes"]] == [1.5e-3, 6e-3]
    # What the printed notes say of the probes is what they are.
    from calibration.serving_fit import SENSITIVITY_FACTOR, SENSITIVITY_SHARE_STEP
    from calibration.serving_notes import PROBED

    assert SENSITIVITY_FACTOR == 2 and PROBED == f"halved and doubled, a share by {SENSITIVITY_SHARE_STEP:g}"
    # The clients' jitter is the benchmark's (FIXED sets it), and the token stream never binds at a few
    # thousand tokens/s: these rows say nothing of either (both at 0: probed at the unfitted start).
    for name in ("client_cv", "stream_per_token_s"):
        assert not got[name]["pinned"] and len(got[name]["probes"]) == 1, name
        assert abs(got[name]["probes"][0]["objective_change"]) < 0.005, name
    assert not any(t["short_of_minimum"] for t in got.values())
    # Terms a fit left short of the minimum: a probe finds a lower objective.
    short = term_sensitivity(rows, with_terms(vllm={**KNOWN["vllm"], "host_s": 1.5e-3}), FIXED)["vllm"]["terms"]
    assert short["host_s"]["short_of_minimum"]
    assert min(p["objective_change"] for p in short["host_s"]["probes"]) < -0.02


def test_fit_leaves_a_share_term_that_starts_at_zero():
    """A share that starts at its bound (the clients' spread at 0, as the presets had it before any fit)
    must be able to leave it: a step of 0.3 in logit space from there changes nothing simulated."""
    rows = [
        row(tp=tp, isl=isl, osl=32, concurrency=c)
        for tp, isl, c in [(1, 1024, 8), (1, 512, 16), (2, 2048, 8), (1, 1024, 32)]
    ]
    # The spread the terms give (not the benchmark rows' start together), fitted from 0 when asked for.
    clients = Clients(requests_per_client=4, warmup=1, client_cv=0.0, start_spread_cycles=None)
    rows = measured(rows, with_terms(vllm={"client_spread_cycles": 0.5}), clients)
    at_zero = with_terms(vllm={"client_spread_cycles": 0.0})
    start_loss = objective(evaluate(rows, at_zero, clients))
    got = fit(rows, at_zero, clients, terms=("client_spread_cycles",), max_evals=30)
    assert start_loss > 0.3 and got.loss < 0.05
    assert got.engines["vllm"]["client_spread_cycles"] == pytest.approx(0.5, abs=0.05)


def test_fit_leaves_no_spread_of_the_front_end():
    """The front end's coefficient of variation starts at 0 in the presets; the fit must move it
    (to where the rows were made) rather than step around 0 in log space."""
    rows = [
        row(tp=tp, isl=isl, osl=16, concurrency=c)
        for tp, isl, c in [(1, 1024, 16), (1, 512, 32), (2, 2048, 16), (1, 1024, 32)]
    ]
    clients = Clients(requests_per_client=4, warmup=1, start_spread_cycles=None)  # spread and cv from the terms
    made = {"client_spread_cycles": 0.5, "frontend_s": 0.05}
    rows = measured(rows, with_terms(vllm={**made, "client_cv": 1.0}), clients)
    start = with_terms(vllm=made)
    start_loss = objective(evaluate(rows, start, clients))
    got = fit(rows, start, clients, terms=("client_cv",), max_evals=20)
    assert start_loss > 0.05 and got.loss < start_loss / 3, (start_loss, got.loss)
    assert got.engines["vllm"]["client_cv"] > 0.3


def test_fit_moves_the_per_token_completion_time_off_zero():
    """The presets hold ``completion_per_token_s`` at 0, below its log scale's floor: the fit's first
    step must still reach a value that moves TTFT, and the fit then comes near the one the rows
    were made with."""
    rows = [row(isl=isl, osl=256, concurrency=c) for isl, c in [(512, 4), (1024, 8), (256, 8)]]
    rows = measured(rows, with_terms(vllm={"completion_per_token_s": 40e-6}), FIXED)
    start = with_terms(vllm={"completion_per_token_s": 0.0})
    start_loss = objective(evaluate(rows, start, FIXED))
    got = fit(rows, start, FIXED, terms=("completion_per_token_s",), max_evals=20)
    assert start_loss > 0.05 and got.loss < start_loss / 5, (start_loss, got.loss)
    assert got.engines["vllm"]["completion_per_token_s"] == pytest.approx(40e-6, rel=0.25)


def test_fit_finds_the_token_stream_from_no_stream():
    """Rows whose engine outpaces a 1 ms-per-token stream (TTFT queued behind it, output capped
    at 1 k tokens/s), fitted from no stream: the fit starts the stream where it binds (50 us), and
    comes back to the one the rows were made with."""
    rows = [row(isl=isl, osl=64, concurrency=c) for isl, c in [(128, 16), (256, 32), (512, 24), (128, 4)]]
    rows = measured(rows, with_terms(vllm={"stream_per_token_s": 1e-3}), FIXED)
    start = with_terms()
    start_loss = objective(evaluate(rows, start, FIXED))
    got = fit(rows, start, FIXED, terms=("stream_per_token_s",), max_evals=25)
    assert start_loss > 0.2 and got.loss < 0.01, (start_loss, got.loss)
    assert got.engines["vllm"]["stream_per_token_s"] == pytest.approx(1e-3, rel=0.02)


def test_fit_finds_the_eager_launch_floor_from_none():
    """TensorRT-LLM runs every iteration with a prompt eagerly. Rows made with 1 ms per layer of
    launches (a 32-layer model's prompt iterations floored at 32 ms, above their GPU time on two
    GPUs), fitted from none: the fit starts the term where it binds and comes back to 1 ms."""
    rows = [
        row(engine="trtllm", tp=tp, isl=isl, osl=16, concurrency=c)
        for tp, isl, c in [(2, 256, 4), (2, 512, 8), (1, 128, 8), (2, 1024, 2)]
    ]
    rows = measured(rows, with_terms(trtllm={"eager_host_per_layer_s": 1e-3}), FIXED)
    start = with_terms(trtllm={"eager_host_per_layer_s": 0.0})
    start_loss = objective(evaluate(rows, start, FIXED))
    got = fit(rows, start, FIXED, terms=("eager_host_per_layer_s",), max_evals=25)
    assert start_loss > 0.1 and got.loss < 0.01, (start_loss, got.loss)
    assert got.engines["trtllm"]["eager_host_per_layer_s"] == pytest.approx(1e-3, rel=0.05)


def test_fit_starts_from_the_best_spread_and_front_end_pair():
    """A large front end with clients spread over a whole cycle and a small one with clients in
    lock-step can give similar TTFTs; from a start at lock-step and 5 ms the fit must reach the pair
    the rows were made with."""
    rows = [
        row(tp=tp, isl=isl, osl=32, concurrency=c)
        for tp, isl, c in [(1, 1024, 8), (1, 512, 16), (2, 2048, 8), (1, 1024, 32), (1, 256, 4)]
    ]
    clients = Clients(requests_per_client=4, warmup=1, client_cv=0.0, start_spread_cycles=None)
    made = {"client_spread_cycles": 0.95, "frontend_s": 0.1}
    rows = measured(rows, with_terms(vllm=made), clients)
    at_zero = with_terms(vllm={"client_spread_cycles": 0.0})
    got = fit(rows, at_zero, clients, terms=("frontend_s", "client_spread_cycles"), max_evals=30)
    assert got.loss < 0.05
    assert got.engines["vllm"]["frontend_s"] == pytest.approx(0.1, rel=0.1)


def test_fit_with_a_prior_keeps_what_the_rows_leave_free_at_the_prior():
    """Rows far below any token stream's ceiling pin the host time, not the stream: fitted with a
    prior, the host time still comes back to the one the rows were made with, and the stream, which
    the rows leave free, goes to the prior's instead of staying where the fit started."""
    rows = [row(isl=isl, osl=32, concurrency=c) for isl, c in [(256, 2), (512, 8), (128, 4)]]
    rows = measured(rows, with_terms(vllm={"host_s": 3e-3}), FIXED)
    start = with_terms(vllm={"stream_per_token_s": 30e-6})
    prior = EngineTerms({"vllm": {"host_s": 1e-3, "stream_per_token_s": 7e-6}})
    keys = ("host_s", "stream_per_token_s")
    free = fit(rows, start, FIXED, terms=keys, max_evals=40)
    pulled = fit(rows, start, FIXED, terms=keys, max_evals=40, prior=prior)
    assert free.engines["vllm"]["stream_per_token_s"] > 20e-6  # nothing moved it
    # within the simplex's tolerance (a pull of 0.04 % of error is below it)
    assert pulled.engines["vllm"]["stream_per_token_s"] == pytest.approx(7e-6, rel=0.3)
    for got in (free, pulled):
        assert got.engines["vllm"]["host_s"] == pytest.approx(3e-3, rel=0.1)
    # The reported loss holds the pull; a term a factor of 2 from the prior costs what pins a term.
    assert pulled.loss >= prior_penalty(pulled.engines["vllm"], prior.engines["vllm"])
    assert prior_penalty({"host_s": 2e-3}, {"host_s": 1e-3}) == pytest.approx(0.005)
    # Probing the pulled fit: each probe says how the pull changes, and a probe towards the rows' own
    # optimum that the pull outweighs does not count as the fit stopping short.
    sens = term_sensitivity(rows, pulled, FIXED, prior=prior)["vllm"]["terms"]
    stream = sens["stream_per_token_s"]
    assert all("pull_change" in p for p in stream["probes"]) and not stream["pinned"]
    assert max(p["pull_change"] for p in stream["probes"]) > 0.004 and not stream["short_of_minimum"]
    assert sens["host_s"]["pinned"]


def test_fit_rejects_no_rows():
    with pytest.raises(ConfigError, match="at least one benchmark row"):
        fit([])


def test_leave_one_group_out():
    # The clients' start spread is pinned at 0 here: a fitted spread is never exactly 0 (a share in
    # (0, 1)), and the smallest spread already breaks the lock-step the rows were made with.
    clients = Clients(requests_per_client=3, warmup=1, start_spread_cycles=0.0, client_cv=0.0)
    known = with_terms(vllm={"host_s": 4e-3, "frontend_s": 25e-3})
    qwen = measured(
        [row(model="Qwen/Qwen3-32B", tp=2, isl=isl, osl=16, concurrency=c) for isl, c in [(256, 2), (512, 8)]],
        known,
        clients,
    )
    llama = measured([row(isl=isl, osl=16, concurrency=c) for isl, c in [(256, 4), (128, 8)]], known, clients)
    sgl = [row(engine="sglang", isl=256, osl=16, concurrency=4)]
    rows = qwen + llama + sgl
    start = with_terms()
    res = leave_one_group_out(rows, start=start, clients=clients, fit_clients=clients, max_evals=60)
    groups = sorted({r.group for r in rows})
    assert sorted(res.folds) == groups
    assert sorted(map(repr, (p.row for p in res.predictions))) == sorted(map(repr, rows))  # each row once
    assert all(p.error is None for p in res.predictions)
    # SGLang has one group: its terms are the ones shared by the other engines' groups, fitted on
    # them (here every other row was made with the known vLLM terms, so those come back).
    sgl_fold = res.folds[sgl[0].group]
    assert set(sgl_fold.engines) == {"sglang"} and sgl_fold.groups == sorted({r.group for r in qwen + llama})
    assert sgl_fold.engines["sglang"]["host_s"] == pytest.approx(4e-3, rel=0.1)
    assert sgl_fold.engines["sglang"]["frontend_s"] == pytest.approx(25e-3, rel=0.1)
    # Each vLLM group is predicted by terms fitted on the other one alone (all five terms), which come
    # back to the ones the rows were made with.
    for held in (qwen, llama):
        other = llama if held is qwen else qwen
        fold = res.folds[held[0].group]
        assert set(fold.engines) == {"vllm"} and fold.groups == [other[0].group]
        assert fold.loss < 0.05 < 0.4 < objective(evaluate(other, start, clients))
        assert fold.engines["vllm"]["host_s"] == pytest.approx(4e-3, rel=0.1)
        assert fold.engines["vllm"]["frontend_s"] == pytest.approx(25e-3, rel=0.1)
        again = evaluate(held, fold, clients)
        mine = [p for p in res.predictions if p.row.group == held[0].group]
        assert [(p.ttft_ms, p.tpot_ms) for p in mine] == [(a.ttft_ms, a.tpot_ms) for a in again]
    # A group excluded from training leaves the other vLLM group only the other engines' groups to fit on ...
    res2 = leave_one_group_out(rows, start=start, clients=clients, max_evals=5, exclude_from_training=(qwen[0].group,))
    assert res2.folds[llama[0].group].groups == [sgl[0].group]
    # ... and nothing at all without them: the starting terms.
    res3 = leave_one_group_out(
        qwen + llama, start=start, clients=clients, max_evals=5, exclude_from_training=(qwen[0].group,)
    )
    assert res3.folds[llama[0].group].engines == {"vllm": start.engines["vllm"]}


def test_leave_one_group_out_pulls_each_fold_towards_terms_shared_by_its_training_groups(monkeypatch):
    import calibration.serving_fit as serving_fit

    clients = Clients(requests_per_client=3, warmup=1, start_spread_cycles=0.0, client_cv=0.0)
    made = {"host_s": 4e-3, "frontend_s": 25e-3}
    known = with_terms(vllm=made, sglang=made)
    qwen = measured(
        [
            row(model="Qwen/Qwen3-32B", tp=2, isl=isl, osl=16, concurrency=c)
            for isl, c in [(256, 2), (512, 8), (128, 4)]
        ],
        known,
        clients,
    )
    llama = measured([row(isl=isl, osl=16, concurrency=c) for isl, c in [(256, 4), (128, 8)]], known, clients)
    sgl = measured([row(engine="sglang", isl=isl, osl=16, concurrency=4) for isl in (256, 128, 512)], known, clients)
    rows = qwen + llama + sgl
    priors: dict[str, list[BenchRow]] = {}
    real = serving_fit.fit_shared

    def spy(train, engine, *a, **k):
        priors[engine + str(len(priors))] = train
        return real(train, engine, *a, **k)

    monkeypatch.setattr(serving_fit, "fit_shared", spy)
    res = leave_one_group_out(
        rows, start=with_terms(), clients=clients, max_evals=60, pooled_prior=True, log=lambda m: None
    )
    # Each vLLM fold's prior is fitted on every third run of each other group (its engine's and the
    # others'); SGLang, with no other group, is fitted on all of them, shared, as without the prior.
    got = sorted(sorted(map(repr, t)) for t in priors.values())
    thirds = lambda *gs: sorted(repr(r) for g in gs for r in g[::3])  # noqa: E731
    assert got == sorted([thirds(llama, sgl), thirds(qwen, sgl), sorted(map(repr, qwen + llama))])
    # Every run was made with the same terms, so pulled or not each fold fits its training group and
    # predicts the held-out one.
    for held in (qwen, llama):
        other = llama if held is qwen else qwen
        fold = res.folds[held[0].group]
        assert fold.groups == [other[0].group]
        assert objective(evaluate(other, fold, clients)) < 0.05
        assert objective([p for p in res.predictions if p.row.group == held[0].group]) < 0.1


def test_leave_one_group_out_blind_trains_on_treated_runs_and_predicts_the_files_own(monkeypatch):
    # ``predict``: each fold fits on the treated runs of the other groups and predicts the held-out
    # group from its runs as the file gives them, so no prediction reads its own measured times.
    import calibration.serving_fit as serving_fit

    raw = [row(isl=isl, concurrency=8) for isl in (256, 512)] + [
        row(model="Qwen/Qwen3-32B", tp=2, isl=isl, concurrency=8) for isl in (256, 512)
    ]
    treated, _ = hold_back_flagged(raw, {r.group: [8] for r in raw})
    assert [r.max_num_seqs for r in treated] == [7] * 4
    trained, predicted = {}, {}

    def fake_fit(train, start, *a, **k):
        trained[next(r.group for r in raw if r.group not in {t.group for t in train})] = train
        return EngineTerms(dict(start.engines), loss=0.0, evals=1)

    def fake_evaluate(rows, terms, *a, **k):
        predicted[rows[0].group] = rows
        return [RowResult(r, None, None) for r in rows]

    monkeypatch.setattr(serving_fit, "fit", fake_fit)
    monkeypatch.setattr(serving_fit, "evaluate", fake_evaluate)
    res = leave_one_group_out(treated, start=with_terms(), predict=raw)
    for g in {r.group for r in raw}:
        assert trained[g] == [t for t in treated if t.group != g]
        assert predicted[g] == [r for r in raw if r.group == g]
    assert [p.row for p in res.predictions] == sorted(raw, key=lambda r: r.group)
    leave_one_group_out(treated, start=with_terms())  # without it, the treated runs predicted
    assert all(r.max_num_seqs == 7 for rs in predicted.values() for r in rs)
    with pytest.raises(ValueError, match="line up"):
        leave_one_group_out(treated, start=with_terms(), predict=raw[:3])


def test_fit_each_group_recovers_each_groups_own_terms():
    # Two groups of one engine made with different host times: leave-one-group-out can only give
    # each the other's, each group's own fit gives it its own.
    clients = Clients(requests_per_client=3, warmup=1, start_spread_cycles=0.0, client_cv=0.0)
    qwen = measured(
        [row(model="Qwen/Qwen3-32B", tp=2, isl=isl, osl=16, concurrency=c) for isl, c in [(256, 2), (512, 8)]],
        with_terms(vllm={"host_s": 6e-3}),
        clients,
    )
    llama = measured(
        [row(isl=isl, osl=16, concurrency=c) for isl, c in [(256, 4), (128, 8)]],
        with_terms(vllm={"host_s": 2e-3}),
        clients,
    )
    start = with_terms()
    res = fit_each_group(qwen + llama, start=start, clients=clients, max_evals=60)
    assert sorted(res.folds) == sorted({qwen[0].group, llama[0].group})
    assert sorted(map(repr, (p.row for p in res.predictions))) == sorted(map(repr, qwen + llama))
    for held, host in ((qwen, 6e-3), (llama, 2e-3)):
        fold = res.folds[held[0].group]
        assert fold.groups == [held[0].group] and fold.loss < 0.05
        assert fold.engines["vllm"]["host_s"] == pytest.approx(host, rel=0.1)
        mine = [p for p in res.predictions if p.row.group == held[0].group]
        assert [(p.ttft_ms, p.tpot_ms) for p in mine] == [(a.ttft_ms, a.tpot_ms) for a in evaluate(held, fold, clients)]
    # The other group's terms miss this one: what the two protocols, side by side, tell apart.
    assert objective(evaluate(qwen, res.folds[llama[0].group], clients)) > 0.1
    # A group excluded is not fitted: it keeps the starting terms.
    kept = fit_each_group(
        qwen + llama, start=start, clients=clients, max_evals=5, exclude_from_training=(qwen[0].group,)
    )
    assert kept.folds[qwen[0].group].engines == {"vllm": start.engines["vllm"]}


def test_fit_does_not_train_on_excluded_groups():
    known = with_terms(vllm={"host_s": 3e-3})
    good = measured([row(isl=isl, osl=16, concurrency=c) for isl, c in [(256, 2), (512, 8)]], known)
    # A group of the same engine whose "measurements" are 3x slow: trained on, it would pull host_s up.
    bad = [replace(r, model="Qwen/Qwen3-32B", tp=2, tpot_ms=r.tpot_ms * 3) for r in good]
    got = fit(good + bad, with_terms(), FIXED, terms=("host_s",), max_evals=40, exclude=(bad[0].group,))
    assert got.groups == [good[0].group]
    assert got.engines["vllm"]["host_s"] == pytest.approx(3e-3, rel=0.05)
    # An engine whose every group is excluded keeps its starting terms.
    sgl = [row(engine="sglang")]
    got2 = fit(good + sgl, with_terms(), FIXED, terms=("host_s",), max_evals=5, exclude=(sgl[0].group,))
    assert got2.engines["sglang"] == with_terms().engines["sglang"]


def test_parallel_evaluation_matches_serial():
    rows = FIT_ROWS[:4]
    a = evaluate(rows, builtin_terms(), TINY)
    b = evaluate(rows, builtin_terms(), TINY, workers=2)
    assert all(r.error is None for r in a)
    assert [(r.ttft_ms, r.tpot_ms) for r in a] == [(r.ttft_ms, r.tpot_ms) for r in b]


# --- terms files -----------------------------------------------------------------------------


def test_terms_file_round_trip_and_errors(tmp_path):
    t = with_terms(vllm={"host_s": 2.5e-3})
    p = t.write(tmp_path / "t.json")
    terms = read_terms_file(p)
    assert set(terms) == set(PRESETS) and terms["vllm"]["host_s"] == 2.5e-3
    assert set(terms["vllm"]) == set(FITTED_TERMS)
    sc = scenario_from_dict({"engine": {"kind": "vllm", "terms_file": str(p)}})
    assert engine_preset(sc).host_s == 2.5e-3
    # engine.* keys win over the file.
    sc = scenario_from_dict({"engine": {"kind": "vllm", "terms_file": str(p), "host_s": 1e-4}})
    assert engine_preset(sc).host_s == 1e-4
    bad = tmp_path / "bad.json"
    for doc, where in [
        ({"format": "other", "engines": {}}, "engine.terms_file"),
        ({"format": "kvsim-engine-terms", "engines": {"tgi": {}}}, "engines.tgi"),
        ({"format": "kvsim-engine-terms", "engines": {"vllm": {"host_s": -1}}}, "engines.vllm.host_s"),
        ({"format": "kvsim-engine-terms", "engines": {"vllm": {"warp": 1}}}, "engines.vllm.warp"),
    ]:
        bad.write_text(json.dumps(doc))
        with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
            read_terms_file(bad)


def test_a_terms_file_is_validated_once_per_content(tmp_path):
    """A deployment asks for the terms more than once (its preset, its engine defaults, the
    unused-terms check): the file is parsed once, and an edit is read, never a stale copy."""
    from sim.engine.deployment import Deployment, with_engine_defaults
    from sim.engine_presets import _parse_terms

    p = with_terms(vllm={"host_s": 2.5e-3}).write(tmp_path / "t.json")
    sc = with_engine_defaults(scenario_from_dict({"engine": {"kind": "vllm", "terms_file": str(p)}}))
    _parse_terms.cache_clear()
    Deployment.from_scenario(sc)
    info = _parse_terms.cache_info()
    assert info.misses == 1 and info.hits >= 1, info
    with_terms(vllm={"host_s": 3.5e-3}).write(p)
    assert engine_preset(sc).host_s == 3.5e-3
    # Callers get their own dicts: changing one does not change the next read.
    read_terms_file(p)["vllm"]["host_s"] = 1.0
    assert read_terms_file(p)["vllm"]["host_s"] == 3.5e-3


def test_terms_file_refuses_a_key_given_twice(tmp_path):
    p = tmp_path / "t.json"
    p.write_text('{"format": "kvsim-engine-terms", "engines": {"vllm": {"host_s": 0.001, "host_s": 0.002}}}')
    with pytest.raises(ConfigError) as e:
        read_terms_file(p)
    msg = str(e.value)
    assert msg.startswith("engine.terms_file: ") and "'host_s' is given twice" in msg and "\n" not in msg, msg


def test_a_terms_file_without_the_running_engine_says_so(tmp_path, caplog):
    from sim.engine.deployment import Deployment

    p = tmp_path / "t.json"
    p.write_text(json.dumps({"format": "kvsim-engine-terms", "engines": {"sglang": {"host_s": 0.002}}}))

    def warnings(engine: dict) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="kvsim"):
            Deployment.from_scenario(scenario_from_dict({"engine": {**engine, "terms_file": str(p)}}))
        return [r.getMessage() for r in caplog.records]

    (line,) = warnings({"kind": "vllm"})
    assert str(p) in line and "sglang" in line and "vllm" in line and "\n" not in line, line
    (line,) = warnings({"kind": "reference"})
    assert str(p) in line and "sglang" in line and "reference" in line, line
    assert warnings({"kind": "sglang"}) == []


def test_a_run_of_one_output_token_is_fitted_on_its_ttft():
    one = row(osl=1, ttft_ms=20.0, tpot_ms=7.0)
    assert objective([RowResult(one, 22.0, None)]) == pytest.approx(abs(math.log(22.0 / 20.0)))
    # Any other run without a simulated TPOT failed.
    assert objective([RowResult(row(), 22.0, None)]) == 3.0
