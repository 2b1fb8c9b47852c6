"""SLO attainment, the goodput search and `kvsim plan` on the default scenario."""

import json
import subprocess
import sys

import pyarrow as pa
import pytest

from sim.analysis.plan_output import plan_router
from sim.analysis.planner import CANDIDATES, fewest_replicas, find_goodput, plan
from sim.analysis.slo import SLO, attainment, parse_slos
from sim.config import apply_overrides, read_scenario_dict, scenario_from_dict
from sim.engine.cluster import simulate
from sim.errors import ConfigError


def test_parse_slos_meaning():
    s = parse_slos(["ttft_p90_s=0.5", "tpot_p90_s=0.05"])
    assert (s.ttft_s, s.tpot_s, s.e2e_s, s.attainment) == (0.5, 0.05, None, 0.9)
    assert parse_slos(["ttft_p99_s=1"]).attainment == 0.99
    assert parse_slos(["ttft_s=1"]).attainment == 0.9
    assert parse_slos(["ttft_p90_s=1", "tpot_p99_s=0.1"], attainment=0.95).attainment == 0.95
    # Two percentiles: the error names the entries as typed, not the fractions they became.
    with pytest.raises(ConfigError) as e:
        parse_slos(["ttft_p90_s=1", "tpot_p99_s=0.1"])
    assert str(e.value).startswith("--slo: got 'ttft_p90_s, tpot_p99_s'; one percentile for all bounds"), str(e.value)
    for bad in (["ttft=1"], ["ttft_p90_s=-1"], ["ttft_p90_s=x"], [], ["ttft_s=1", "ttft_p90_s=2"]):
        with pytest.raises(ConfigError):
            parse_slos(bad)


def test_attainment_counts_rejected_and_truncated_as_misses():
    req = pa.table(
        {
            "status": ["completed", "completed", "completed", "completed", "rejected"],
            "truncated": [False, False, True, False, False],
            "arrival_s": [0.0, 0.0, 0.0, 0.0, 0.0],
            "first_token_s": [0.4, 0.6, 0.1, 0.2, -1.0],
            "finish_s": [1.4, 1.6, 0.5, 10.2, -1.0],
            "generated_tokens": [11, 11, 5, 11, 0],
        }
    )
    # row 0 meets both; row 1 TTFT 0.6 > 0.5; row 2 truncated; row 3 TPOT 1.0 > 0.5; row 4 rejected.
    assert attainment(req, SLO(ttft_s=0.5, tpot_s=0.5)) == pytest.approx(1 / 5)
    assert attainment(req, SLO(ttft_s=0.5)) == pytest.approx(2 / 5)
    assert attainment(req, SLO(tpot_s=0.5)) == pytest.approx(2 / 5)


def test_goodput_search_brackets_bisects_and_verifies():
    calls = []

    def step(edge):
        def f(r):
            calls.append(r)
            return 1.0 if r <= edge else 0.5

        return f

    for start, edge in ((15.0, 7.3), (1.0, 40.0), (7.3, 7.3)):
        calls.clear()
        s = find_goodput(step(edge), start, target=0.9, tol=0.05)
        assert s.status == "ok"
        assert edge / 1.05 <= s.goodput <= edge
        assert s.next_rate == pytest.approx(s.goodput * 1.05) and s.next_attainment < 0.9
        assert len(calls) <= 12
    assert find_goodput(lambda r: 0.0, 10.0, 0.9).status == "infeasible"
    # A noisy curve that passes again above a failure: the verification step keeps searching.
    noisy = find_goodput(lambda r: 1.0 if r <= 10 or 10.3 <= r <= 10.6 else 0.0, 10.0, 0.9, tol=0.05)
    assert noisy.status == "ok" and noisy.next_attainment < 0.9 and noisy.probes[noisy.goodput] >= 0.9


def test_fewest_replicas():
    for start in (1, 3, 5, 9, 100):
        n, seen = fewest_replicas(lambda k: k >= 5, start)
        assert n == 5 and seen[5] and not seen[4]
    assert fewest_replicas(lambda k: False, 2, limit=16)[0] is None


def test_fewest_replicas_bisects_down_from_an_overshooting_start():
    # A start ~2.7× the answer (one replica's goodput understates pooled replicas) stepped down one
    # replica at a time: 41, 40, …, 14 was 28 runs, each over n replicas' requests.
    calls: list[int] = []
    n, seen = fewest_replicas(lambda k: calls.append(k) or k >= 15, 41)
    assert n == 15 and seen[15] and not seen[14]
    assert len(calls) <= 10 and len(calls) == len(set(calls))
    # A good start still settles in two runs.
    calls.clear()
    assert fewest_replicas(lambda k: calls.append(k) or k >= 15, 15)[0] == 15 and calls == [15, 14]
    # The same answer as stepping by one, for every start and monotone threshold.
    for threshold in range(1, 40):
        for start in range(1, 50):
            got, seen = fewest_replicas(lambda k, t=threshold: k >= t, start, limit=32)
            assert got == (threshold if threshold <= 32 else None), (threshold, start)
            if got and got > 1:
                assert seen[got] and not seen[got - 1]
        calls.clear()
        fewest_replicas(lambda k, t=threshold: calls.append(k) or k >= t, 203, limit=4096)
        assert len(calls) <= 2 * 8 + 2, (threshold, calls)


def test_plan_operating_point_is_the_replica_search_scale(tmp_path):
    # The passing replica probe is a run stopped early (a tested pass): the operating point must
    # still be n × the base request count, as in the search, not the base count over n replicas.
    p = plan(
        "chat-api",
        SLO(ttft_s=1.0, tpot_s=0.1, attainment=0.9),
        {"model.name": "qwen3-32b", "workload.num_requests": 200},
        ["static"],
        target_rate=0.5,
        workers=1,
    )
    c = p["candidates"][0]
    n = c["replicas_needed"]
    assert n and n > 1
    assert not next(r for r in c["replica_probes"] if r["replicas"] == n)["exact"]
    op = c["operating_point"]
    assert (op["replicas"], op["requests"]) == (n, n * 200)


def test_plan_refuses_a_length_split_router_with_a_fixed_count():
    # The replica search varies the count: a fixed pool for long prompts would leave none for the others.
    with pytest.raises(ConfigError) as exc:
        over = {"gpu.replicas": 4, "router": "length_split"}
        plan("chat-api", SLO(ttft_s=0.5, tpot_s=0.05), over, ["paged"], target_rate=40, workers=1)
    assert str(exc.value).startswith(
        "length_split.replicas: got 1; a share of the replicas for a plan with --target-rate"
    )
    assert "--set length_split.share=0.25" in str(exc.value)


def test_plan_without_a_target_rate_keeps_a_length_split_count():
    # No replica search: the goodput at gpu.replicas, with the pool the scenario gives (1 of 3).
    over = {
        "gpu.replicas": 3,
        "router": "length_split",
        "length_split.prompt_tokens": 2048,
        "workload.num_requests": 120,
    }
    p = plan("chat-api", SLO(ttft_s=2.0, tpot_s=0.2), over, ["paged"], workers=1, max_evals=3)
    c = p["candidates"][0]
    assert c["status"] == "ok", c.get("message")
    assert "replicas_needed" not in c and c["operating_point"]["replicas"] == 3
    assert p["router"] == "length_split" and p["length_split"] == {"prompt_tokens": 2048, "replicas": 1}
    assert plan_router(p) == "; router length_split: 1 of the replicas for prompts of 2048+ tokens"


def test_plan_sizes_a_length_split_deployment_from_two_replicas_up():
    over = {
        "gpu.replicas": 4,
        "router": "length_split",
        "length_split.share": 0.25,
        "workload.num_requests": 200,
        "workload.lengths.outlier_fraction": 0.05,
        "workload.lengths.outlier_multiplier": 16.0,
        "workload.lengths.outlier_scales": "prompt",
        "workload.max_model_len": 65536,
    }
    slo = parse_slos(["ttft_p90_s=0.5", "tpot_p90_s=0.05", "long:ttft_p90_s=10"], long_prompt_tokens=8192)
    p = plan("worst-case-outliers", slo, over, ["paged"], target_rate=5, workers=1)
    c = p["candidates"][0]
    assert p["router"] == "length_split" and p["length_split"] == {"prompt_tokens": 8192, "share": 0.25}
    # One replica cannot hold two pools: the search never tries it, and says why it stops at two.
    assert min(r["replicas"] for r in c["replica_probes"]) >= 2
    assert c["replicas_needed"] == 2
    assert any("router length_split needs 2 at least" in r for r in p["recommendation"]["reasons"])


def test_fewest_replicas_never_asks_below_its_lowest():
    for threshold in (1, 2, 3, 7):
        for start in (1, 2, 5, 40):
            calls: list[int] = []
            n, _ = fewest_replicas(lambda k, t=threshold, c=calls: c.append(k) or k >= t, start, limit=64, lowest=2)
            assert n == max(threshold, 2) and min(calls) >= 2


@pytest.mark.parametrize(
    "over",
    [
        {"workload.arrival.max_concurrency": 4},
        {"workload.arrival.kind": "closed_loop", "workload.arrival.concurrency": 8},
    ],
)
def test_plan_refuses_arrivals_that_hold_the_rate_back(over):
    # With a client cap of 4, chat-api at 40 req/s was answered with one GPU at 100 % attainment
    # while it served 2.2 req/s: the cap, not the server, set the load.
    key = next(iter(over)) if "workload.arrival.kind" not in over else "workload.arrival.kind"
    with pytest.raises(ConfigError) as exc:
        plan("chat-api", SLO(ttft_s=0.5, tpot_s=0.05), over, ["paged"], target_rate=40, workers=1)
    assert exc.value.key == key


def test_plan_default_scenario(tmp_path):
    out = tmp_path / "plan"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "sim.cli.plan",
            "chat-api",
            "--slo",
            "ttft_p90_s=0.5",
            "--slo",
            "tpot_p90_s=0.05",
            "--set",
            "workload.num_requests=200",
            "--target-rate",
            "24",
            "-w",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "goodput" in r.stdout and "Use " in r.stdout
    p = json.loads((out / "plan.json").read_text())
    assert (out / "plan.html").is_file() and "js-plotly-plot" in (out / "plan.html").read_text()
    # The plan says how far its absolute figures may be from a real server's, in each output.
    assert "17.7 % on TTFT" in p["accuracy"] and "vllm serving llama-3.1-8b bf16" in p["accuracy"]
    assert "Accuracy:" in " ".join(r.stdout.split()) and "Accuracy: " in (out / "plan.html").read_text()
    by = {c["name"]: c for c in p["candidates"]}
    # Every candidate is either planned or skipped with a reason (kinds this build lacks).
    assert set(by) | {s["name"] for s in p["skipped"]} == {n for n, c in CANDIDATES.items() if c.get("default", True)}
    assert all(s["reason"] for s in p["skipped"])
    assert {"static", "paged"} <= set(by)
    for c in by.values():
        assert c["status"] == "ok" and c["search_status"] == "ok" and c["goodput_rps"] > 0
    # Reserving max_model_len (16384 tokens) per request caps concurrency: paged serves more.
    assert by["paged"]["goodput_rps"] > by["static"]["goodput_rps"]
    assert p["recommendation"]["candidate"] in by and p["recommendation"]["reasons"]
    # The reasons say what stops the recommended candidate above its goodput.
    binds = [
        r
        for r in p["recommendation"]["reasons"]
        if r.startswith(f"{p['recommendation']['candidate']}: what binds above the goodput")
    ]
    assert len(binds) == 1
    # ... and where that run's iteration time went, from one more run of it, iteration by iteration.
    split = by[p["recommendation"]["candidate"]]["binding_split"]
    assert sum(split["seconds"].values()) == pytest.approx(split["busy_s"])
    top = max(split["share"], key=split["share"].get)
    assert "its iterations there: " in binds[0] and top == "linear" and "GEMMs" in binds[0].split("there: ")[1][:6]
    # The plan carries each candidate's upper-bound flag, which keeps the oracle from being picked.
    assert {n for n, c in by.items() if c["upper_bound"]} == {n for n in by if CANDIDATES[n].get("upper_bound")}
    assert not by[p["recommendation"]["candidate"]]["upper_bound"]

    # The bisection property, re-simulated here: attainment ≥ target at the goodput, < target at goodput·(1+tol).
    data, base_dir = read_scenario_dict("chat-api")
    slo = SLO(**p["slo"])
    tol = p["tolerance"]

    def att(c, rate, replicas=1):
        over = {
            **c["overrides"],
            "workload.num_requests": 200 * replicas,
            "workload.arrival.rate": rate,
            "gpu.replicas": replicas,
        }
        return attainment(simulate(scenario_from_dict(apply_overrides(data, over), base_dir)).requests, slo)

    for c in by.values():
        g = c["goodput_rps"]
        assert att(c, g) >= slo.attainment > att(c, g * (1 + tol)), c["name"]
        # Fewest replicas for 24 req/s: n sustains it, n − 1 does not (an upper bound is not sized).
        if c["upper_bound"]:
            assert "replicas_needed" not in c and "operating_point" not in c
            continue
        n = c["replicas_needed"]
        assert n is not None
        assert att(c, 24, n) >= slo.attainment
        if n > 1:
            assert att(c, 24, n - 1) < slo.attainment


def test_plan_bad_input_is_one_line():
    r = subprocess.run(
        [sys.executable, "-m", "sim.cli.plan", "chat-api", "--slo", "ttft_p90_s=0.5", "--allocators", "paged,nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: --allocators: got 'nope'; candidate names: {', '.join(CANDIDATES)}"
    ]


def _cand(name: str, goodput: float, upper_bound: bool = False) -> dict:
    op = {
        "rejected": 0,
        "truncated": 0,
        "requests": 100,
        "memory_waste": 0.1,
        "external_frag_mean": 0.0,
        "external_frag_max": 0.0,
        "decode_jitter": 1.05,
        "preemptions": 0,
        "rejected_by_reason": {},
        "attainment": 0.95,
        "allocation_time_s": 0.0,
    }
    return {
        "name": name,
        "strategy": name,
        "overrides": {"allocator.kind": name.split("-")[0]},
        "status": "ok",
        "goodput_rps": goodput,
        "goodput_per_gpu_rps": goodput,
        "gpus": 1,
        "operating_point": op,
        "upper_bound": upper_bound,
    }


def test_an_upper_bound_is_reported_but_never_recommended():
    from sim.analysis.recommend import recommend

    p = {
        "tolerance": 0.05,
        "target_rate": None,
        "slo_text": "-",
        "gpu": "H100",
        "tensor_parallel": 1,
        "candidates": [_cand("paged", 5.0), _cand("hybrid_tail", 4.0), _cand("hybrid_tail-oracle", 9.0, True)],
    }
    rec = recommend(p)
    assert rec["candidate"] == "paged"
    bound = [r for r in rec["reasons"] if r.startswith("hybrid_tail-oracle is an upper bound")]
    assert len(bound) == 1 and "goodput 9 req/s vs hybrid_tail 4 req/s" in bound[0], rec["reasons"]
    assert not any("vs hybrid_tail-oracle" in r for r in rec["reasons"])
    assert CANDIDATES["hybrid_tail-oracle"]["upper_bound"] and not CANDIDATES["hybrid_tail"].get("upper_bound")
    assert CANDIDATES["hybrid_tail"]["overrides"]["allocator.length_predictor"] != "oracle"


def test_miss_shares_add_up_to_the_misses():
    """With one bound, refused + truncated + that bound's misses are exactly the requests that miss
    the SLO; with two, each request that misses is counted at least once."""
    from sim.analysis.slo import miss_shares

    over = {"workload.num_requests": 300, "workload.arrival.rate": 60.0, "allocator.kind": "static"}
    over.update({"allocator.reserve": "p90", "allocator.overflow": "truncate"})
    req = simulate(scenario_from_dict(apply_overrides(read_scenario_dict("chat-api")[0], over))).requests
    for slo in (SLO(ttft_s=0.3), SLO(tpot_s=0.015), SLO(ttft_s=0.3, tpot_s=0.015)):
        m = miss_shares(req, slo)
        missed = 1.0 - attainment(req, slo)
        assert missed > 0.05, slo  # the case is not trivial
        if len(m) == 3:
            assert sum(m.values()) == pytest.approx(missed)
        else:
            assert sum(m.values()) >= missed - 1e-12 and max(m.values()) <= missed + 1e-12


def _probe(rate, att, misses, peak, preemptions=0):
    return {
        "rate": rate,
        "replicas": 1,
        "attainment": att,
        "misses": misses,
        "kv_reserved_peak": peak,
        "preemptions": preemptions,
    }


def test_binding_line_names_the_bound_and_whether_memory_filled():
    from sim.analysis.recommend import binding_line

    latency = {
        "goodput_rps": 10.0,
        "probes": [_probe(9.0, 0.95, {"ttft": 0.02}, 0.3), _probe(10.5, 0.8, {"refused": 0.0, "tpot": 0.2}, 0.6)],
    }
    line = binding_line(latency, 1, 0.9)
    assert "at 10.5 req/s (80.0% within the SLO)" in line and "TPOT 20.0%" in line
    assert "not KV memory but TPOT binds" in line and "at most 60% of capacity" in line
    memory = {
        "goodput_rps": 10.0,
        "quick_probes": [_probe(11.0, 0.7, {"ttft": 0.3}, 0.99), _probe(12.0, 0.5, {"ttft": 0.5}, 0.99)],
    }
    assert "at 11 req/s" in binding_line(memory, 1, 0.9) and "KV memory binds" in binding_line(memory, 1, 0.9)
    # Preemptions or refusals say memory ran out even below the full mark.
    assert "KV memory binds" in binding_line(
        {"goodput_rps": 1.0, "probes": [_probe(2.0, 0.5, {"ttft": 0.5}, 0.5, 3)]}, 1, 0.9
    )
    # No run above the goodput missed the target (or none at the base replica count): nothing to say.
    assert binding_line({"goodput_rps": 10.0, "probes": [_probe(9.0, 0.95, {}, 0.3)]}, 1, 0.9) is None
    assert binding_line({"goodput_rps": 10.0, "probes": [_probe(11.0, 0.5, {"ttft": 0.5}, 0.3)]}, 2, 0.9) is None


def test_plan_text_helpers():
    from sim.analysis.plan_output import plan_columns, plan_dtypes
    from sim.analysis.recommend import jitter_text

    # Two decimals, except where they would print a jitter above (or below) the 1.10 rule as 1.10.
    assert [jitter_text(j) for j in (1.1, 1.3, 1.104, 1.0996, 1.10000004)] == [
        "1.10",
        "1.30",
        "1.104",
        "1.0996",
        "1.10000004",
    ]
    assert plan_dtypes({"weight_dtype": "fp8_block", "kv_dtype": "bf16"}) == " (weights fp8_block, KV bf16)"
    assert plan_dtypes({}) == ""
    cols = plan_columns({"replicas": 2, "seeds": 1})
    assert cols[1:3] == ["goodput req/s (2 replicas)", "edge req/s (2 replicas)"]
    assert plan_columns({"replicas": 1, "seeds": 1})[1:3] == ["goodput req/s", "edge req/s"]
