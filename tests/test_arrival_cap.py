"""``workload.arrival.max_concurrency``: a client-side cap on requests in flight for open-loop
arrivals (poisson, gamma, trace), as ``vllm bench serve --request-rate R --max-concurrency C``
sends. A request due while C are in flight waits in the client, first come first served, and is
sent when one ends; its arrival at the server (what TTFT and latency run from) is that send."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import tiny_scenario
from sim.analysis.sweep import load_sweep
from sim.config import ArrivalConfig
from sim.engine.cluster import simulate
from sim.errors import ConfigError
from sim.workload import arrival_use as au

# --- the config --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["poisson", "gamma", "trace"])
def test_open_loop_kinds_take_a_cap(kind):
    extra = {"path": "t.csv"} if kind == "trace" else {"rate": 5.0}
    assert ArrivalConfig(kind=kind, **extra).max_concurrency is None  # no cap by default
    assert ArrivalConfig(kind=kind, max_concurrency=1, **extra).max_concurrency == 1
    assert au.arrival_reads(kind, "max_concurrency")


@pytest.mark.parametrize(
    "value,allowed",
    [
        (0, "an integer in [1, 10000000]"),
        (-3, "an integer in [1, 10000000]"),
        (2.5, "an integer in [1, 10000000]"),
        (10**8, "an integer in [1, 10000000]"),
        (True, "a number, not true/false"),
    ],
)
def test_bad_caps_name_the_field_the_value_and_what_is_allowed(value, allowed):
    with pytest.raises(ConfigError) as e:
        tiny_scenario(**{"workload.arrival.max_concurrency": value})
    assert e.value.key == "workload.arrival.max_concurrency"
    assert str(e.value) == f"workload.arrival.max_concurrency: got {value!r}; {allowed}"


def test_closed_loop_refuses_a_cap():
    """A closed loop's clients are its cap already: a second one is refused, not ignored."""
    with pytest.raises(ConfigError) as e:
        tiny_scenario(**{"workload.arrival": {"kind": "closed_loop", "concurrency": 4, "max_concurrency": 2}})
    assert e.value.key == "workload.arrival.max_concurrency"
    msg = str(e.value)
    assert msg.startswith("workload.arrival.max_concurrency: got 2; unset with arrival kind 'closed_loop'"), msg
    assert "poisson, gamma and trace" in msg
    assert not au.arrival_reads("closed_loop", "max_concurrency")


def test_a_sweep_over_the_cap_runs_one_point_per_value(tmp_path):
    f = tmp_path / "sweep.yaml"
    f.write_text(
        "base: chat-api\nset: {workload.num_requests: 20}\ngrid:\n  workload.arrival.max_concurrency: [1, 4, 16]\n"
    )
    pts = load_sweep(f).points()
    assert [p.scenario["workload"]["arrival"]["max_concurrency"] for p in pts] == [1, 4, 16]


def test_a_swept_cap_gives_client_wait_columns(tmp_path):
    # The wait is a distribution like ttft_s: one column per statistic, which `kvsim report --z`
    # and the dataset's readers take by name (a JSON string column would not plot).
    from sim.analysis.sweep import read_dataset, run_sweep

    f = tmp_path / "sweep.yaml"
    f.write_text(
        "base: chat-api\nset: {workload.num_requests: 20}\ngrid:\n  workload.arrival.max_concurrency: [null, 2]\n"
    )
    run_sweep(f, workers=1, out=tmp_path / "out", progress=False)
    t = read_dataset(tmp_path / "out").to_pydict()
    assert {"client_wait_s.p90", "client_wait_s.max", "client_wait_s.mean"} <= set(t)
    by_cap = dict(zip(t["workload.arrival.max_concurrency"], t["client_wait_s.max"]))
    assert by_cap[None] is None and by_cap[2] > 0


# --- the runs ----------------------------------------------------------------------------------


def _trace(tmp_path, rows: list[tuple[float, int, int]], cap: int) -> dict:
    """Trace arrivals of ``rows`` (due s, prompt tokens, output tokens) under a cap of ``cap``."""
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{a!r},{pt},{o}\n" for a, pt, o in rows))
    return {"kind": "trace", "path": str(p), "format": "csv", "max_concurrency": cap}


def _run(arrival: dict, **over):
    res = simulate(tiny_scenario(**{"workload.arrival": arrival, **over}))
    return res, res.requests.sort_by("id").to_pydict()


def _max_in_flight(t: dict) -> int:
    """Requests in flight at once, from the per-request rows: sent at ``arrival_s``, ended at
    ``finish_s`` (an end before a send at the same instant)."""
    ev = sorted([(a, 1) for a in t["arrival_s"]] + [(f, -1) for f in t["finish_s"]])
    return int(np.max(np.cumsum([d for _, d in ev])))


def test_a_cap_of_one_never_overlaps_requests(tmp_path):
    """40 requests due at once, cap 1: each is sent when the one before it ends, in id order; its
    client wait is its send time (all were due at 0), and TTFT runs from the send (an idle server)."""
    rows = [(0.0, 40 + 9 * (i % 7), 5 + (i % 11)) for i in range(40)]
    res, t = _run(_trace(tmp_path, rows, 1), **{"workload.lengths": {"kind": "trace"}})
    arr, fin, first = (np.asarray(t[k]) for k in ("arrival_s", "finish_s", "first_token_s"))
    assert set(t["status"]) == {"completed"} and _max_in_flight(t) == 1
    assert arr[0] == 0.0 and np.array_equal(arr[1:], fin[:-1])  # FIFO, each at the end of the last
    # An idle server: first token one prefill after the send, never the wait behind others.
    assert float(np.max(first - arr)) < 0.1 * float(fin[-1])
    wait = res.summary["client_wait_s"]
    assert wait["mean"] == pytest.approx(float(arr.mean()), rel=1e-12)
    assert wait["max"] == pytest.approx(float(arr.max()), rel=1e-12)
    assert res.summary["ttft_s"]["mean"] == pytest.approx(float(np.mean(first - arr)), rel=1e-12)


@pytest.mark.parametrize("kind,cap", [("poisson", 3), ("gamma", 5)])
def test_in_flight_never_exceeds_the_cap(kind, cap):
    """A rate far above what the server serves: the cap binds, requests go out in due order, and
    the cap is reached. Without it the server holds many more."""
    arrival = {"kind": kind, "rate": 400.0, **({"cv": 3.0} if kind == "gamma" else {})}
    _, free = _run(arrival)
    res, t = _run({**arrival, "max_concurrency": cap})
    assert _max_in_flight(free) > 2 * cap
    assert _max_in_flight(t) == cap
    arr = np.asarray(t["arrival_s"])
    assert np.all(np.diff(arr) >= 0)  # ids are in due order: first come, first sent
    # Sent no earlier than due (the uncapped run's arrivals are the due times: the same draws).
    assert np.all(arr >= np.asarray(free["arrival_s"]))
    assert res.summary["client_wait_s"]["mean"] == pytest.approx(
        float(np.mean(arr - np.asarray(free["arrival_s"]))), rel=1e-9
    )


def test_a_rejected_request_frees_its_slot_at_once(tmp_path):
    """Requests over max_model_len are rejected as they are sent; the next due one goes out then."""
    rows = [(0.0, 2000 if i % 3 == 1 else 50, 8) for i in range(12)]
    _, t = _run(_trace(tmp_path, rows, 1), **{"workload.lengths": {"kind": "trace"}})
    status, arr, fin = t["status"], np.asarray(t["arrival_s"]), np.asarray(t["finish_s"])
    assert status.count("rejected") == 4 and status.count("completed") == 8
    assert np.array_equal(arr[1:], fin[:-1])
    for i in range(12):
        if status[i] == "rejected":
            assert fin[i] == arr[i]


def test_a_cap_that_never_binds_changes_nothing():
    """A cap of at least the request count: the same requests at the same times as no cap, and
    every client wait 0; the uncapped summary has no client_wait_s."""
    free, t0 = _run({"kind": "poisson", "rate": 20.0})
    capped, t1 = _run({"kind": "poisson", "rate": 20.0, "max_concurrency": 60})
    assert t0 == t1
    assert "client_wait_s" not in free.summary
    assert capped.summary["client_wait_s"] == {"p50": 0.0, "p90": 0.0, "p99": 0.0, "mean": 0.0, "max": 0.0}
    skip = {"client_wait_s", "sim_events"}
    assert {k: v for k, v in capped.summary.items() if k not in skip} == {
        k: v for k, v in free.summary.items() if k not in skip
    }


def test_same_scenario_and_seed_give_identical_runs():
    arrival = {"kind": "gamma", "rate": 300.0, "cv": 2.0, "max_concurrency": 4}
    a, ta = _run(arrival)
    b, tb = _run(arrival)
    assert ta == tb and a.summary == b.summary
    _, tc = _run(arrival, seed=11)
    assert tc != ta


@pytest.mark.parametrize("cap", [1, 4])
def test_fast_forward_equals_stepping_under_a_cap(cap):
    """Sends that wait for a request to end happen inside fast-forward windows as between steps:
    the same requests at the same times (to rounding) and the same client waits."""
    arrival = {"kind": "gamma", "rate": 200.0, "cv": 2.0, "max_concurrency": cap}
    over = {"workload.num_requests": 80, "workload.lengths.output_max": 300, "allocator.kind": "static"}
    ff, tf = _run(arrival, **over, **{"engine.mode": "fast_forward"})
    st, ts = _run(arrival, **over, **{"engine.mode": "step"})
    for col in tf:
        if col.endswith("_s"):
            assert np.allclose(tf[col], ts[col], rtol=1e-9, atol=1e-12), col
        else:
            assert tf[col] == ts[col], col
    assert _max_in_flight(tf) == cap
    for k, v in ff.summary["client_wait_s"].items():
        assert v == pytest.approx(st.summary["client_wait_s"][k], rel=1e-9, abs=1e-12), k
    for k in ("completed", "rejected", "preemptions", "rejected_by_reason"):
        assert ff.summary[k] == st.summary[k], k
