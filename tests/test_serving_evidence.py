"""What the runs say about their benchmark and server: TTFT that follows completions, clients that
did not start together, runs faster than their kernels, where the TPOT error comes from, what sets
TTFT at the lowest concurrency, what more GPUs buy, and the treatments of flagged groups.

Rows are tiny (a few clients, short prompts, a few requests per client) so the file runs in
seconds; the accuracy on the shipped training file is measured by ``kvsim validate --serving-bench
builtin --logo``, not here.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from _serving_helpers import FIXED, LLAMA, TINY, apart_runs, kv_bound_runs, measured, row, with_terms
from calibration.served_by import aiconfigurator_server
from calibration.serving_bench import (
    TRAINING_FILE,
    BenchRow,
    read_bench,
)
from calibration.serving_evidence import (
    APART_MAX_PER_PREFILL,
    BUSY_LIMIT,
    CACHE_BLOCK_TOKENS,
    SPLIT_MIN_ROWS,
    SPLIT_MIN_SPREAD,
    TTFT_LINE_MIN_ROWS,
    cache_flagged,
    clients_apart,
    completion_gap_ratios,
    faster_than_kernels,
    gpu_shares,
    hold_back_flagged,
    implied_gpu_busy,
    kv_capacity_evidence,
    least_cached_share,
    prompt_costs,
    runs_faster_than_kernels,
    spread_flagged,
    tp_scaling,
    tpot_error_split,
    ttft_follows_completions,
    ttft_vs_prefill,
)
from calibration.serving_fit import (
    builtin_terms,
    evaluate,
)
from calibration.serving_notes import fast_run_warnings, kv_warnings
from calibration.serving_runs import RowResult, score
from calibration.serving_selection import (
    check_rows,
    served_by_rows,
)
from sim.config import APART_SPREAD_CYCLES


def test_completion_gap_ratio_halves_with_the_output_unless_requests_wait_for_a_completion():
    # A TTFT set by prefill and queueing does not depend on the output: TTFT / (cycle / c) = 1 at
    # every output length only if each request waits for another to finish.
    a = row(ttft_ms=100.0, tpot_ms=10.0, osl=101, concurrency=10)  # cycle 1100 ms: 110 ms between completions
    b = replace(a, osl=201, ttft_ms=100.0)
    c = replace(a, osl=201, ttft_ms=210.0, concurrency=64)  # above max_concurrency: left out
    got = completion_gap_ratios([a, b, c])
    assert got == {(a.group, 10, 101): pytest.approx(100 / 110), (a.group, 10, 201): pytest.approx(100 / 210)}
    # The shipped file: Llama-3.1-8B / TensorRT-LLM at c = 8 stays above 1 at every output length, while
    # Qwen3-32B on the same engine version falls as the output doubles (docs/calibration.md).
    r = completion_gap_ratios(read_bench(TRAINING_FILE))
    llama = [r[("meta-llama/Llama-3.1-8B-Instruct/h100_sxm/trtllm", 8, osl)] for osl in (128, 256, 512)]
    qwen = [r[("Qwen/Qwen3-32B/h100_sxm/trtllm", 8, osl)] for osl in (128, 256, 512)]
    assert min(llama) > 1.1 and llama[2] > 0.65 * llama[0]
    assert qwen[1] < 0.7 * qwen[0] and qwen[2] < 0.7 * qwen[1]
    # Flagged: that group alone, at the concurrencies where it happens.
    assert ttft_follows_completions(read_bench(TRAINING_FILE)) == {
        "meta-llama/Llama-3.1-8B-Instruct/h100_sxm/trtllm": [8, 16, 32]
    }


def test_ttft_that_waits_for_a_completion_is_flagged_and_kvsim_own_runs_are_not():
    def waiting(osl: int, c: int = 8) -> BenchRow:
        # TTFT = one completion gap: solve ttft = (ttft + (osl - 1) * tpot) / c.
        tpot = 5.0
        return row(osl=osl, concurrency=c, tpot_ms=tpot, ttft_ms=(osl - 1) * tpot / (c - 1))

    assert ttft_follows_completions([waiting(128), waiting(512)]) == {waiting(128).group: [8]}
    assert ttft_follows_completions([waiting(128), waiting(200)]) == {}  # outputs too close to tell
    assert ttft_follows_completions([waiting(128, c=64), waiting(512, c=64)]) == {}  # above 32 clients
    # A server's own TTFT (prefill and queueing, here kvsim's) does not grow with the output.
    sims = measured([row(osl=osl, concurrency=8, isl=512) for osl in (16, 64)], builtin_terms())
    assert ttft_follows_completions(sims) == {}


def test_one_request_held_back_gives_the_ttft_that_follows_completions():
    # kvsim's own runs with one request fewer running than clients: each request waits for another
    # to finish, so TTFT follows the completion gap and the runs are flagged (without the cap they
    # are not: test above); hold_back_flagged gives exactly such runs that cap.
    rows = [row(osl=osl, concurrency=8, isl=512, max_num_seqs=7) for osl in (32, 128)]
    sims = measured(rows, builtin_terms())
    free = measured([replace(r, max_num_seqs=None) for r in rows], builtin_terms())
    assert sims[1].ttft_ms > 2 * free[1].ttft_ms
    assert 0.9 < completion_gap_ratios(sims)[(rows[0].group, 8, 128)] < 1.3
    assert ttft_follows_completions(sims) == {rows[0].group: [8]}
    assert ttft_follows_completions(free) == {}
    unmarked = [replace(s, max_num_seqs=None) for s in sims]
    other = row(engine="sglang", osl=16, concurrency=8)  # not flagged: left alone
    kept = replace(unmarked[0], osl=64, max_num_seqs=3)  # sets its own cap: kept
    got, held = hold_back_flagged([*unmarked, other, kept])
    assert [r.max_num_seqs for r in got] == [7, 7, None, 3]
    assert held == {rows[0].group: [8]}
    assert [replace(r, max_num_seqs=None) for r in got[:2]] == unmarked


def test_clients_that_did_not_start_together_are_flagged_and_spread_on_request():
    # Clients starting together wait for one another's prompts: TTFT grows by about 2 prefills per
    # prefill at 4 clients; spread a request cycle apart, by about one. Only the second is flagged.
    together, apart = apart_runs(None), apart_runs(1.0)
    assert clients_apart(together, dict(zip(together, gpu_shares(together)))) == {}
    ((g, found),) = clients_apart(apart, dict(zip(apart, gpu_shares(apart)))).items()
    assert g == apart[0].group and found["concurrency"] == 4 and 0.8 < found["per_prefill"] < APART_MAX_PER_PREFILL
    other = row(engine="sglang")  # not flagged: left alone
    own = replace(apart[0], isl=256, start_spread_cycles=0.3)  # gives its own spread: kept
    got, spread = spread_flagged([*apart, other, own], {g: found})
    assert [r.start_spread_cycles for r in got] == [APART_SPREAD_CYCLES] * 4 + [None, 0.3]
    assert spread == [g]
    # Simulated spread, the flagged runs come back to what they measured (the spread they were made
    # with): their longer prompts no longer wait for one another.
    plain, spread_sims = evaluate(apart, builtin_terms(), TINY), evaluate(got[:4], builtin_terms(), TINY)
    assert all(s.ttft_ms < 0.9 * p.ttft_ms for s, p in zip(spread_sims[2:], plain[2:]))
    err = lambda res: sum(abs(x.ttft_err) for x in res)  # noqa: E731
    assert err(spread_sims) < 0.5 * err(plain)


def test_runs_faster_than_their_kernels_are_flagged_and_kvsim_own_runs_are_not():
    # kvsim's own runs (host time included) keep the GPU busy at most all the time.
    rows = [row(isl=isl, osl=osl, concurrency=c) for isl, osl, c in [(512, 32, 8), (1024, 64, 16), (256, 16, 2)]]
    sims = measured(rows, builtin_terms())
    busy = implied_gpu_busy(sims)
    assert all(0 < b <= 1.0 for b in busy), busy
    assert faster_than_kernels(sims) == {}
    # Twice the measured throughput (both times halved) needs about twice the GPU.
    fast = [replace(r, ttft_ms=r.ttft_ms / 2, tpot_ms=r.tpot_ms / 2) for r in sims]
    assert implied_gpu_busy(fast) == pytest.approx([2 * b for b in busy], rel=1e-9)
    flagged = faster_than_kernels(fast + [replace(r, engine="sglang") for r in sims])
    assert list(flagged) == [fast[0].group] and flagged[fast[0].group] > 1.25
    # A row the profile cannot price has no figure, and no group.
    assert implied_gpu_busy([row(tp=16)]) == [None]
    # The shipped file: only Llama-3.1-8B-FP8 / H200 / vLLM, at about twice what its kernels allow.
    shipped = faster_than_kernels(read_bench(TRAINING_FILE))
    assert (
        list(shipped) == ["nvidia/Llama-3.1-8B-Instruct-FP8/h200_sxm/vllm"]
        and 1.6 < shipped["nvidia/Llama-3.1-8B-Instruct-FP8/h200_sxm/vllm"] < 2.2
    )


def test_single_runs_faster_than_their_kernels_are_named_where_their_group_is_not_flagged():
    rows = [row(isl=isl, osl=osl, concurrency=c) for isl, osl, c in [(512, 32, 8), (1024, 64, 16), (256, 16, 2)]]
    sims = measured(rows, builtin_terms())
    # One run of three at a third of its times: the group's median stays possible, that run is not.
    odd = replace(sims[1], ttft_ms=sims[1].ttft_ms / 3, tpot_ms=sims[1].tpot_ms / 3)
    file = [sims[0], odd, sims[2]]
    busy = implied_gpu_busy(file)
    assert busy[1] > BUSY_LIMIT and max(busy[0], busy[2]) <= 1.0
    fast = faster_than_kernels(file, busy=busy)
    assert fast == {}
    runs = runs_faster_than_kernels(file, busy, fast)
    assert runs == {
        odd.group: [{"isl": 1024, "osl": 64, "concurrency": 16, "tp": 1, "implied_gpu_busy": round(busy[1], 3)}]
    }
    # A group flagged as a whole is said once, as a group, not run by run.
    assert runs_faster_than_kernels(file, busy, {odd.group: 2.0}) == {}
    (line,) = fast_run_warnings(runs)
    assert line.startswith(f"{odd.group}: 1 of its runs needs the GPU computing more than {BUSY_LIMIT}x")
    assert f"1024/64 c16 tp1 {busy[1]:.3f}x" in line
    assert "2 of its runs need the GPU" in fast_run_warnings({odd.group: runs[odd.group] * 2})[0]


def test_the_shipped_file_names_its_4000_token_runs_of_newer_engines_as_faster_than_their_kernels():
    checked = check_rows(served_by_rows(read_bench(TRAINING_FILE), "auto"), None, ())
    named = {(g, x["isl"], x["osl"], x["tp"]) for g, xs in checked.fast_runs.items() for x in xs}
    qwen = "Qwen/Qwen3-32B/h100_sxm"
    # TensorRT-LLM 1.2 and vLLM 0.12 runs of 4000-token prompts, 1.3 to 2.4 times what the GPUs can
    # compute; the other runs of their groups (TensorRT-LLM 1.0) are possible.
    assert {(f"{qwen}/trtllm", 4000, 1000, tp) for tp in (1, 2, 4, 8)} | {
        (f"{qwen}/vllm", 4000, 1000, tp) for tp in (1, 2)
    } <= named
    assert len(named) <= 8 and all(g.startswith(qwen) for g, *_ in named)
    # The group faster than its kernels as a whole is named once, as a group.
    assert list(checked.fast) == ["nvidia/Llama-3.1-8B-Instruct-FP8/h200_sxm/vllm"]
    assert not any("FP8" in g for g in checked.fast_runs)


def test_gpu_shares_split_the_busy_time_and_prefills_take_more_of_it_with_shorter_outputs():
    rows = measured([row(isl=512, osl=osl, concurrency=8) for osl in (8, 64)], builtin_terms())
    shares = gpu_shares(rows)
    assert [p + d for p, d in shares] == pytest.approx(implied_gpu_busy(rows), rel=1e-12)
    assert implied_gpu_busy(rows, shares=shares) == implied_gpu_busy(rows)
    (p8, d8), (p64, d64) = shares
    assert p8 > p64 > 0 and d64 > d8 > 0
    assert gpu_shares([row(tp=16)]) == [None]


def test_a_prompt_is_priced_as_its_engine_batches_it():
    """vLLM and TensorRT-LLM run a prompt beside the other clients' decodes: it costs what it adds
    to their iteration. SGLang runs it apart: its own iteration. Both when the row leaves the
    batching to the engine's defaults."""
    rows = [row(engine=e, isl=1024, concurrency=8) for e in ("vllm", "trtllm", "sglang")]
    alone = [row(engine=e, isl=1024, concurrency=1) for e in ("vllm", "trtllm", "sglang")]
    assert all(r.mixed_batches is None for r in rows)
    priced = [c[1] for c in prompt_costs(rows)]
    priced_alone = [c[1] for c in prompt_costs(alone)]
    assert priced[0] < priced_alone[0] and priced[1] < priced_alone[1]
    assert priced[2] == pytest.approx(priced_alone[2], rel=1e-9)
    # gpu_shares prices the prompt the same way (without the host): its prefill share over the
    # row's prompt rate is that price.
    (share, _), (share_alone, _) = gpu_shares([rows[1], alone[1]])
    assert share / (8 / (rows[1].cycle_ms / 1e3)) < share_alone / (1 / (alone[1].cycle_ms / 1e3))


def test_rows_of_one_deployment_are_priced_with_their_own_server_settings():
    """Rows that differ only in their CUDA-graph sizes or batching are priced each with its own: a
    128-sequence decode replays a graph where the server captures 128 and runs eagerly where it
    captures 8, and prompts mix with decodes only where the row says so."""
    few = row(engine="trtllm", isl=512, concurrency=8, cuda_graph_max_batch=8)
    many = replace(few, concurrency=128, cuda_graph_max_batch=128)
    assert gpu_shares([few, many])[1] == gpu_shares([many])[0]
    assert prompt_costs([few, many])[1] == prompt_costs([many])[0]
    apart = row(engine="sglang", isl=512, concurrency=8)
    mixed = replace(apart, mixed_batches=True)
    assert gpu_shares([apart, mixed])[1] == gpu_shares([mixed])[0] != gpu_shares([apart])[0]


def test_prompt_costs_show_a_floor_on_iterations_with_a_prompt():
    """kvsim's own runs with every eager iteration floored at 1 ms per layer, one prompt per
    iteration (a token budget of one prompt beside the decodes): a short prompt's measured cost
    rises well above its price, a long one's (above the floor anyway) hardly moves."""
    rows = [
        row(engine="trtllm", tp=2, isl=isl, osl=64, concurrency=c, max_num_batched_tokens=isl + c)
        for isl, c in [(1024, 8), (8192, 4)]
    ]
    floored = prompt_costs(measured(rows, with_terms(trtllm={"eager_host_per_layer_s": 1e-3})))
    plain = prompt_costs(measured(rows, with_terms()))
    (short_f, short_price), (long_f, long_price) = floored
    (short_p, _), (long_p, _) = plain
    assert [p for _, p in plain] == [short_price, long_price]  # the price is the preset's, not the run's
    assert short_f > short_p + 0.01 and short_f > 2 * short_price
    assert long_f == pytest.approx(long_p, rel=0.1) and long_price > 32 * 1e-3


def split_case(a: float, b: float, tp: int, n: int, lo: float = 0.0, hi: float = 0.8):
    """``n`` results of one TP whose TPOT errors lie on ``a + b × prefill share``, shares from lo to hi."""
    out, shares = [], {}
    for i in range(n):
        r = row(tp=tp, isl=128 + i, concurrency=2 + i)
        x = lo + (hi - lo) * i / max(n - 1, 1)
        shares[r] = (x, 1.0 - x)
        out.append(RowResult(r, ttft_ms=r.ttft_ms, tpot_ms=r.tpot_ms * (1.0 + a + b * x)))
    return out, shares


def test_tpot_error_split_recovers_the_decode_error_and_the_prefill_slope():
    res, shares = [], {}
    for a, b, tp, n in [(0.10, -0.5, 1, 8), (-0.12, 0.0, 8, 8), (0.3, 1.0, 4, SPLIT_MIN_ROWS - 1)]:
        r, s = split_case(a, b, tp, n)
        res += r
        shares.update(s)
    # A row the profile could not price, and one that did not simulate, are left out.
    res.append(RowResult(row(tp=2, isl=999), 20.0, 7.0))
    res.append(RowResult(row(tp=1, isl=998), None, None, error="no"))
    shares[res[-1].row] = (0.5, 0.5)
    split = tpot_error_split(res, shares)
    ((g, fit_all),) = split.items()
    assert g == row().group
    by = fit_all["by_tp"]
    assert list(by) == ["1", "8"]  # TP4 has too few rows
    assert by["1"]["decode"] == pytest.approx(0.10, abs=1e-4) and by["1"]["per_prefill"] == pytest.approx(
        -0.5, abs=1e-4
    )
    assert by["8"]["decode"] == pytest.approx(-0.12, abs=1e-4) and by["8"]["per_prefill"] == pytest.approx(0, abs=1e-4)
    assert by["1"]["rows"] == 8 and by["1"]["prefill_share"] == [0.0, 0.8]
    assert fit_all["rows"] == 8 + 8 + SPLIT_MIN_ROWS - 1
    # Shares that barely differ tell nothing about prefills: no line.
    narrow, sh = split_case(0.0, 1.0, 1, 10, lo=0.3, hi=0.3 + SPLIT_MIN_SPREAD / 2)
    assert tpot_error_split(narrow, sh) == {}


def test_tpot_error_split_table_lists_each_group_then_its_gpu_counts():
    from calibration.serving_tables import SPLIT_HEADER, split_rows

    res, shares = split_case(0.10, -0.5, 1, 8)
    r8, s8 = split_case(-0.12, 0.25, 8, 8)
    rows = split_rows(tpot_error_split(res + r8, {**shares, **s8}))
    assert [len(r) for r in rows] == [len(SPLIT_HEADER)] * 3
    assert rows[0][:2] == [row().group, "all"] and rows[0][2] == "16"
    assert rows[1] == ["", "1", "8", "0.00-0.80", "+10.0%", "-0.50"]
    assert rows[2] == ["", "8", "8", "0.00-0.80", "-12.0%", "+0.25"]


def test_host_time_the_simulator_lacks_shows_as_a_decode_error_that_prefills_dilute(tmp_path):
    # "Measured": kvsim with 4 ms of host time per iteration; predicted with 1 ms (START). Every
    # iteration is short by the same 3 ms, a larger part of a decode iteration than of a prefill's.
    rows = measured(
        [
            row(isl=isl, osl=osl, concurrency=c)
            for isl, osl, c in [(512, 8, 8), (512, 64, 8), (256, 16, 4), (1024, 128, 16), (1024, 8, 16), (128, 256, 2)]
        ],
        with_terms(vllm={"host_s": 4e-3}),
    )
    preds = evaluate(rows, with_terms(), FIXED)
    split = tpot_error_split(preds, dict(zip(rows, gpu_shares(rows))))
    fit_all = split[rows[0].group]
    assert fit_all["rows"] == 6 and fit_all["prefill_share"][1] - fit_all["prefill_share"][0] > SPLIT_MIN_SPREAD
    assert fit_all["decode"] < -0.2 and fit_all["per_prefill"] > 0.1, fit_all
    # The HTML report plots each row's error against its share, with the group's line.
    from calibration.serving_html import write_html

    shares = dict(zip(rows, gpu_shares(rows)))
    doc = {
        "rows": len(rows),
        "protocol": "test",
        "score": score(preds),
        "tpot_error_split": split,
        "results": [{**p.to_json(), "prefill_share": shares[p.row][0]} for p in preds],
    }
    html = write_html(doc, tmp_path / "v.html").read_text()
    assert "TPOT error (%) against prefill share" in html
    line = f"{fit_all['decode']:+.1%} with no prefill, {fit_all['per_prefill']:+.2f} per prefill share"
    assert line in html and html.count("with no prefill") == 1  # one group, one line
    # With the host time it was measured with, nothing is left to split.
    same = tpot_error_split(evaluate(rows, with_terms(vllm={"host_s": 4e-3}), FIXED), dict(zip(rows, gpu_shares(rows))))
    assert abs(same[rows[0].group]["decode"]) < 1e-6 and abs(same[rows[0].group]["per_prefill"]) < 1e-6


def ttft_case(points: list[tuple[float, float, float | None]], concurrency: int = 8, **kw):
    """Results at one concurrency: per point, one prompt's prefill (ms, through its share), the
    measured TTFT and the simulated one (``None``: the row did not simulate)."""
    out, shares = [], {}
    for i, (prefill, ttft, sim) in enumerate(points):
        r = row(isl=128 + i, concurrency=concurrency, ttft_ms=ttft, **kw)
        shares[r] = (prefill * concurrency / r.cycle_ms, 0.5)
        out.append(RowResult(r, ttft_ms=sim, tpot_ms=None if sim is None else r.tpot_ms))
    return out, shares


def test_ttft_vs_prefill_fits_the_lowest_concurrency_measured_and_simulated():
    # Measured: no front end, 4 prefills' wait; simulated: a 100 ms front end and one prefill.
    xs = [20.0, 40.0, 80.0, 160.0, 240.0]
    res, shares = ttft_case([(x, 4.0 * x, 100.0 + x) for x in xs])
    # Runs at a higher concurrency do not count, nor does the row the profile could not price.
    hi, sh_hi = ttft_case([(x, 50 * x, 50 * x) for x in xs], concurrency=32)
    lost = RowResult(row(isl=999, concurrency=8, ttft_ms=1e6), 1e6, 7.0)
    lines = ttft_vs_prefill(res + hi + [lost], {**shares, **sh_hi, lost.row: None})
    ((g, f),) = lines.items()
    assert g == row().group and f["concurrency"] == 8 and f["runs"] == 5 and f["prefill_ms"] == [20.0, 240.0]
    assert f["measured"]["intercept_ms"] == pytest.approx(0.0, abs=0.05) and f["measured"]["per_prefill"] == 4.0
    assert f["simulated"]["intercept_ms"] == pytest.approx(100.0, abs=0.05) and f["simulated"]["per_prefill"] == 1.0
    # Too few simulated runs: no simulated line, the measured one stays.
    part, sh = ttft_case([(x, 4.0 * x, None if x > 40 else x) for x in xs])
    assert ttft_vs_prefill(part, sh)[g]["simulated"] is None
    # Too few runs, or prefills too alike to tell a slope from an intercept: no line.
    few, sh = ttft_case([(x, 4.0 * x, x) for x in xs[: TTFT_LINE_MIN_ROWS - 1]])
    assert ttft_vs_prefill(few, sh) == {}
    alike, sh = ttft_case([(100.0 + i, 400.0 + i, 100.0) for i in range(6)])
    assert ttft_vs_prefill(alike, sh) == {}


def test_ttft_vs_prefill_table_row():
    from calibration.serving_tables import TTFT_LINE_HEADER, ttft_line_rows

    res, shares = ttft_case([(x, 110.0 + 5.0 * x, 150.0 + 1.5 * x) for x in (10.0, 20.0, 50.0, 100.0)])
    rows = ttft_line_rows(ttft_vs_prefill(res, shares))
    assert rows == [[row().group, "8", "4", "10-100", "110 ms + 5.00 x prefill", "150 ms + 1.50 x prefill"]]
    assert len(rows[0]) == len(TTFT_LINE_HEADER)


def scaling_case(tpot_by_tp: dict[int, float], sim_by_tp: dict[int, float | None], **kw) -> list[RowResult]:
    """One run per tensor-parallel size: measured TPOT ``tpot_by_tp[tp]``, simulated ``sim_by_tp[tp]``."""
    return [
        RowResult(row(tp=tp, tpot_ms=m, **kw), ttft_ms=20.0 if sim_by_tp[tp] else None, tpot_ms=sim_by_tp[tp])
        for tp, m in tpot_by_tp.items()
    ]


def test_tp_scaling_pairs_each_gpu_count_with_the_next_and_takes_medians_over_lengths():
    res = []
    # Three prompt lengths at c = 8 on 1, 2 and 4 GPUs: measured gains 1 -> 2 of 1.5, 1.8, 2.0.
    for isl, m2 in [(128, 10 / 1.5), (256, 10 / 1.8), (512, 10 / 2.0)]:
        res += scaling_case({1: 10.0, 2: m2, 4: m2 / 1.2}, {1: 9.0, 2: 6.0, 4: 4.0}, isl=isl, concurrency=8)
    # Run on 1 and 4 GPUs only: nothing to compare with the next size (2), so no pair.
    res += scaling_case({1: 10.0, 4: 2.0}, {1: 9.0, 4: 1.0}, isl=1024, concurrency=8)
    # At c = 16 the 4-GPU run failed to simulate: only 1 -> 2.
    res += scaling_case({1: 12.0, 2: 8.0, 4: 5.0}, {1: 12.0, 2: 6.0, 4: None}, concurrency=16)
    ((g, pts),) = tp_scaling(res).items()
    assert g == row().group
    assert pts == [
        {"tp": [1, 2], "concurrency": 8, "runs": 3, "measured": 1.8, "simulated": 1.5},
        {"tp": [1, 2], "concurrency": 16, "runs": 1, "measured": 1.5, "simulated": 2.0},
        {"tp": [2, 4], "concurrency": 8, "runs": 3, "measured": 1.2, "simulated": 1.5},
    ]
    # Groups are kept apart: another engine's runs make a group of their own.
    other = scaling_case({4: 8.0, 8: 8.0}, {4: 8.0, 8: 5.0}, engine="trtllm")
    both = tp_scaling(res + other)
    assert both[row(engine="trtllm").group] == [
        {"tp": [4, 8], "concurrency": 2, "runs": 1, "measured": 1.0, "simulated": 1.6}
    ]
    assert both[g] == pts
    # A size whose runs all failed to simulate still sits between its neighbours: no 1 -> 4 pair.
    gap = scaling_case({1: 10.0, 2: 6.0, 4: 4.0}, {1: 9.0, 2: None, 4: 4.0}, engine="sglang")
    assert row(engine="sglang").group not in tp_scaling(gap)


def test_tp_scaling_table_shows_each_groups_largest_pair_of_gpu_counts():
    from calibration.serving_tables import SCALING_HEADER, scaling_rows

    res = scaling_case({1: 10.0, 2: 5.0, 4: 4.0}, {1: 10.0, 2: 6.0, 4: 4.0}, concurrency=8)
    res += scaling_case({1: 12.0, 2: 8.0, 4: 8.0}, {1: 12.0, 2: 6.0, 4: 4.0}, concurrency=32)
    rows = scaling_rows(tp_scaling(res))
    assert [len(r) for r in rows] == [len(SCALING_HEADER)] * 2
    assert rows == [[row().group, "2 -> 4", "8", "1", "1.25x", "1.50x"], ["", "2 -> 4", "32", "1", "1.00x", "1.50x"]]


def test_runs_faster_than_their_kernels_get_the_least_cached_share_that_makes_them_possible():
    # A benchmark whose prompts share their first three quarters, served from the prefix cache, and a
    # file that does not say so: its runs need more GPU than the wall time at full prefills.
    rows = [row(isl=isl, osl=32, concurrency=8) for isl in (1024, 2048)]
    plain = evaluate(rows, builtin_terms(), FIXED)
    truth = measured([replace(r, cached_prompt_tokens=3 * r.isl // 4) for r in rows], builtin_terms())
    assert all(t.ttft_ms < 0.6 * p.ttft_ms for t, p in zip(truth, plain))
    file = [replace(r, cached_prompt_tokens=None) for r in truth]
    shares = gpu_shares(file)
    fast = faster_than_kernels(file)
    assert list(fast) == [file[0].group]
    share = least_cached_share(file, shares, fast)
    # A lower bound: the server is not computing all the time.
    assert list(share) == [file[0].group] and 0.3 < share[file[0].group] <= 0.75
    assert least_cached_share(file, shares, {}) == {}
    other = row(engine="sglang")  # not flagged: left alone
    own = replace(file[0], isl=4096, cached_prompt_tokens=100)  # says its own: kept
    got, cached = cache_flagged([*file, other, own], share)
    assert cached == [file[0].group]
    s = share[file[0].group]
    assert [r.cached_prompt_tokens for r in got] == [
        *(int(s * r.isl) // CACHE_BLOCK_TOKENS * CACHE_BLOCK_TOKENS for r in file),
        None,
        100,
    ]
    # Simulated so, the runs come closer to what they measured (not all the way: the share is a
    # lower bound, below the three quarters they were made with).
    err = lambda res: sum(abs(x.ttft_err) for x in res)  # noqa: E731
    assert err(evaluate(got[:2], builtin_terms(), FIXED)) < 0.6 * err(evaluate(file, builtin_terms(), FIXED))
    # The shipped file's one such group needs at least about 80 % of its prompts cached.
    shipped = [aiconfigurator_server(r) for r in read_bench(TRAINING_FILE) if "FP8" in r.model]
    sh = gpu_shares(shipped)
    assert (
        0.7
        < least_cached_share(shipped, sh, faster_than_kernels(shipped, busy=implied_gpu_busy(shipped, shares=sh)))[
            shipped[0].group
        ]
        < 0.9
    )


def test_runs_that_wait_for_kv_bracket_the_capacity_their_server_held():
    # 80,000 tokens hold 32 clients of 1024 + 1024 (65,536) but not 64 of 1024 + 512 (98,304): those
    # runs' TTFT multiplies, the others' stays, and the bracket holds the capacity.
    runs = kv_bound_runs(80_000)
    ttft = {(r.concurrency, r.osl): r.ttft_ms for r in runs}
    assert ttft[(32, 1024)] < 1.2 * ttft[(32, 128)] and ttft[(64, 512)] > 1.5 * ttft[(64, 128)]
    ((key, found),) = kv_capacity_evidence(runs).items()
    assert key == f"{LLAMA}/h100_sxm/trtllm tp1 bf16"
    assert (found["holds_up_to"], found["waits_from"]) == (32 * 2048, 64 * 1536)
    assert found["holds_up_to"] < 80_000 <= found["waits_from"]
    assert "1024/512 c64" in found["waiting_runs"] and "1024/2048 c32" in found["waiting_runs"]
    # What kvsim derives from an H100's memory for an 8B model is far more: said, with the numbers.
    assert found["derived"] > 300_000
    (line,) = kv_warnings({key: found})
    assert f"between {32 * 2048:,} and {64 * 1536:,} tokens" in line and f"derives {found['derived']:,}" in line
    # Derived inside the bracket: nothing to say.
    assert kv_warnings({key: {**found, "derived": 80_000}}) == []
    # Pinned, as the server logged it: the rows are left to their column.
    assert kv_capacity_evidence([replace(r, kv_cache_tokens=80_000) for r in runs]) == {}


def test_ttft_growing_with_the_output_for_other_reasons_is_not_taken_for_kv():
    runs = kv_bound_runs(80_000)
    # Waiting runs needing fewer tokens than runs that fit: not a KV limit (a completion-bound TTFT).
    grows_early = [replace(r, ttft_ms=r.ttft_ms * 3) if (r.concurrency, r.osl) == (32, 512) else r for r in runs]
    assert kv_capacity_evidence(grows_early) == {}
    # The same wait at two and four GPUs, whose memory holds twice the KV: not a KV limit either.
    both = [replace(r, tp=tp) for tp in (2, 4) for r in runs]
    assert kv_capacity_evidence(both) == {}
    assert set(kv_capacity_evidence([replace(r, tp=2) for r in runs])) == {f"{LLAMA}/h100_sxm/trtllm tp2 bf16"}


def test_the_shipped_runs_bracket_the_kv_their_servers_held():
    found = kv_capacity_evidence(served_by_rows(read_bench(TRAINING_FILE), "aiconfigurator"))
    trt = found["Qwen/Qwen3-32B/h100_sxm/trtllm tp1 fp8"]
    assert (trt["holds_up_to"], trt["waits_from"]) == (64 * (4096 + 256), 128 * (2048 + 256))
    assert trt["derived"] > trt["waits_from"]
    vllm = found["Qwen/Qwen3-32B/h100_sxm/vllm tp2 bf16"]
    assert (vllm["holds_up_to"], vllm["waits_from"]) == (128 * (1024 + 1024), 64 * (4096 + 512))
    # Llama-3.1-8B / SGLang's TTFT grows with the output at 512 clients on 2, 4 and 8 GPUs alike: its
    # token stream's ceiling, not KV; Llama-3.1-8B / TensorRT-LLM's follows completions.
    assert not any("sglang tp" in k and "Llama" in k for k in found)
    assert not any("Llama-3.1-8B-Instruct/h100_sxm/trtllm" in k for k in found)
