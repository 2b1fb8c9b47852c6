"""kvsim validate: spec loading, metric definitions, and a short timed validation (marked timing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from calibration.validate import (
    METRICS,
    capacity_tokens,
    latency_metrics,
    load_spec,
    make_requests,
    median_metrics,
    rel_error,
    replay_spread,
    sim_scenario,
    write_trace,
)
from sim.errors import ConfigError


def test_spec_defaults_and_quick():
    spec = load_spec("scenarios/validate-cpu.yaml")
    assert [ld.name for ld in spec.loads] == ["light", "medium", "saturating"]
    assert spec.allocators == ["paged", "static"]
    q = load_spec("scenarios/validate-cpu.yaml", quick=True)
    assert [ld.name for ld in q.loads] == ["medium"] and q.workload.num_requests < 50
    # the full run calibrates on both batch mixes (docs/validation.md, "Overhead batch mix"); CI's subset on one
    assert (spec.engine.overhead_mix, q.engine.overhead_mix) == ("both", "offline")


def test_spec_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: tiny-llama\nbogus: 1\n")
    with pytest.raises(ConfigError, match="bogus"):
        load_spec(bad)
    bad.write_text("loads: [{name: x}]\n")
    with pytest.raises(ConfigError, match="utilization, rate"):
        load_spec(bad)
    with pytest.raises(ConfigError):
        load_spec(tmp_path / "missing.yaml")
    bad.write_text("engine: {clocks: [cpu, virtual]}\n")
    with pytest.raises(ConfigError, match="clocks"):
        load_spec(bad)
    for v in ("0", "true", "2.5", "21"):
        bad.write_text(f"engine: {{replays: {v}}}\n")
        with pytest.raises(ConfigError, match=r"validate\.engine\.replays.*1 to 20"):
            load_spec(bad)
    bad.write_text("quick: {replays: x}\n")
    load_spec(bad)  # the quick section only matters with --quick
    for text, quick, match in (
        ("engine: {overhead_rounds: sometimes}", False, r"validate\.engine\.overhead_rounds.*spread, upfront"),
        ("engine: {kernel_rounds: often}", False, r"validate\.engine\.kernel_rounds.*spread, upfront"),
        ("engine: {overhead_mix: mixed}", False, r"validate\.engine\.overhead_mix.*offline, queued, both"),
        ("engine: {replay_order: random}", False, r"validate\.engine\.replay_order.*interleaved, blocked"),
        ("quick: {replays: x}", True, r"validate\.quick\.replays"),
        ("quick: {overhead_mix: some}", True, r"validate\.quick\.overhead_mix.*offline, queued, both"),
        ("quick: 5", False, r"validate\.quick.*a mapping"),
        ("quick: {clocks: [cpu]}", False, r"validate\.quick\.clocks.*unknown key"),
    ):
        bad.write_text(text + "\n")
        with pytest.raises(ConfigError, match=match):
            load_spec(bad, quick=quick)
    # the quick subset may set its own calibration mix (CI keeps its calibration short)
    bad.write_text("engine: {overhead_mix: both}\nquick: {overhead_mix: offline}\n")
    assert load_spec(bad).engine.overhead_mix == "both"
    assert load_spec(bad, quick=True).engine.overhead_mix == "offline"


#: The spec's defaults written out: the model's defaults and DEFAULT_SPEC must equal them.
_DEFAULTS_AS_WRITTEN = {
    "name": "validate",
    "description": "",
    "model": "tiny-llama",
    "engine": {
        "dtype": "fp32",
        "threads": 1,
        "seed": 0,
        "clocks": ["cpu_norm", "cpu", "wall"],
        "replays": 1,
        "overhead_rounds": "spread",
        "kernel_rounds": "spread",
        "replay_order": "interleaved",
        "prefill_probe": True,
        "overhead_mix": "offline",
        "kernels": "auto",
    },
    "kv": {"num_blocks": 256, "block_size": 16},
    "scheduler": {"max_num_seqs": 16, "max_num_batched_tokens": 256},
    "static_reserve": 480,
    "workload": {
        "num_requests": 100,
        "max_model_len": 480,
        "seed": 1,
        "lengths": {"kind": "uniform", "prompt_min": 16, "prompt_max": 384, "output_min": 8, "output_max": 96},
    },
    "loads": [
        {"name": "light", "utilization": 0.3},
        {"name": "medium", "utilization": 0.7},
        {"name": "saturating", "utilization": 1.6},
    ],
    "allocators": ["paged", "static"],
    "host_speed": "probe",
    "quick": {"num_requests": 24, "loads": ["medium"], "allocators": ["paged", "static"]},
}


def test_spec_model_defaults_and_types(tmp_path):
    from calibration.validate import DEFAULT_SPEC, LoadSpec, ValidationSpec

    assert DEFAULT_SPEC == _DEFAULTS_AS_WRITTEN
    assert ValidationSpec().model_dump(exclude_none=True) == _DEFAULTS_AS_WRITTEN
    # a spec naming one key: the rest are the defaults, section by section (lengths replaced whole)
    p = tmp_path / "one.yaml"
    p.write_text("engine: {replays: 2}\nworkload: {lengths: {kind: fixed, prompt_tokens: 32, output_tokens: 8}}\n")
    spec = load_spec(p)
    assert isinstance(spec, ValidationSpec) and spec.source == str(p)
    assert spec.engine.replays == 2 and spec.engine.clocks == ["cpu_norm", "cpu", "wall"]
    assert (
        spec.workload.lengths == {"kind": "fixed", "prompt_tokens": 32, "output_tokens": 8} and spec.workload.seed == 1
    )
    assert spec.capacity_tokens() == capacity_tokens(spec) == 256 * 16
    # a load is written back as given: its name and its one rate
    assert LoadSpec(name="x", rate=2).model_dump() == {"name": "x", "rate": 2}
    assert LoadSpec(name="x", rate=2).arrival_rate(9.0) == 2.0
    assert LoadSpec(name="x", utilization=0.5).arrival_rate(9.0) == 4.5
    # assignments are checked as the loaded value was
    with pytest.raises(ValueError, match="1 to 20"):
        spec.engine.replays = 0


def test_quick_subset_is_a_narrowed_copy():
    spec = load_spec("scenarios/validate-cpu.yaml")
    q = spec.quick_subset()
    assert q == load_spec("scenarios/validate-cpu.yaml", quick=True).model_copy(update={"source": spec.source})
    assert [ld.name for ld in q.loads] == ["medium"] and q.workload.num_requests == 24
    assert (q.engine.replays, q.engine.overhead_mix) == (3, "offline")
    # the spec it came from is as it was
    assert [ld.name for ld in spec.loads] == ["light", "medium", "saturating"]
    assert (spec.workload.num_requests, spec.engine.replays, spec.engine.overhead_mix) == (100, 5, "both")


def test_spec_errors_name_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    for text, quick, match in (
        # unknown keys in every section, engine and workload included
        ("engine: {bogus: 1}", False, r"^validate\.engine\.bogus: got 1; unknown key; allowed: clocks, dtype, "),
        ("workload: {arrival: 1}", False, r"^validate\.workload\.arrival: got 1; unknown key; allowed: lengths, "),
        ("loads: [{name: a, rate: 1, burst: 2}]", False, r"^validate\.loads\[0\]\.burst: got 2; unknown key"),
        ("source: x.yaml", False, r"^validate\.source: got 'x\.yaml'; unknown key; allowed: allocators, "),
        ("loads: [{name: a, rate: 1}, {name: a, rate: 2}]", False, r"^validate\.loads\[1\]\.name: got 'a'; .*distinct"),
        ("loads: [{name: a, rate: 1, utilization: 0.5}]", False, r"^validate\.loads\[0\]: .*exactly one of"),
        ("loads: 5", False, r"^validate\.loads: got 5; a non-empty list"),
        ("allocators: [paged, dynamic]", False, r"^validate\.allocators: got 'dynamic'; paged or static"),
        ("model: no-such-model", False, r"^validate\.model: got 'no-such-model'; a catalog model: .*tiny-llama"),
        ("name: 5", False, r"^validate\.name: got 5; a string"),
        ("engine: {prefill_probe: 1}", False, r"^validate\.engine\.prefill_probe: got 1; true or false"),
        ("engine: {kernels: fast}", False, r"^validate\.engine\.kernels: got 'fast'; one of auto, "),
        ("engine: {clocks: []}", False, r"^validate\.engine\.clocks: got \[\]; a non-empty list of distinct"),
        ("engine: {seed: -1}", False, r"^validate\.engine\.seed: got -1; an integer >= 0"),
        ("engine: 5", False, r"^validate\.engine: got 5; a mapping"),
        ("workload: {lengths: 5}", False, r"^validate\.workload\.lengths: got 5; a mapping"),
        ("host_speed: true", False, r"^validate\.host_speed: got True; one of probe, fixed"),
        ("quick: {replays: 0}", True, r"^validate\.quick\.replays: got 0; an integer from 1 to 20"),
    ):
        bad.write_text(text + "\n")
        with pytest.raises(ConfigError, match=match):
            load_spec(bad, quick=quick)
    bad.write_text("kind: validation\n")
    with pytest.raises(ConfigError, match=r"^validate\.engine\.kernels: got 'fast'"):
        load_spec(bad, kernels="fast")
    assert load_spec(bad, kernels="sdpa").engine.kernels == "sdpa"


def test_overhead_rounds_pool_every_pass(monkeypatch):
    """OverheadRounds: the up-front passes and each later round (new prompts: a new seed) are fitted
    pooled, and the per-round level is measured against that pooled fit."""
    from calibration import kernels
    from calibration.validate import OverheadRounds

    calls = []

    def fake(bases, model, *, passes, seed, **kw):
        calls.append((passes, seed))
        level = 1.0 + 0.1 * seed  # each round's host a little slower: the pooled fit sits between
        rows = []
        for S in (1, 2, 4):
            for _ in range(passes * 5):
                kern = 1e-3 * S
                meas = level * (kern + 1e-3 + 2e-4 * S)
                rows.append(
                    {
                        "seqs": S,
                        "tokens": S,
                        "pure_decode": True,
                        "predicted_s": kern,
                        "measured_s": meas,
                        "cpu_s": meas,
                        "residual_s": meas - kern,
                    }
                )
        return {
            a: {
                **kernels.fit_overhead(rows, "cpu_norm"),
                "allocator": a,
                "block_size": 16,
                "dtype": "fp32",
                "threads": 1,
                "clock": "cpu_norm",
                "elapsed_s": 0.5,
                "passes": passes,
                "batches": [1, 2, 4],
                "prompt_range": [16, 384],
                "output_tokens": 24,
            }
            for a in kw["allocators"]
        }

    monkeypatch.setattr(kernels, "measure_engine_overhead", fake)
    r = OverheadRounds({"paged": None, "static": None}, None, {"allocators": ("paged", "static")})
    r.upfront()
    first = r.fits()["paged"]
    for label in ("before light/paged", "before medium/paged", "before light/static", "after the last replay"):
        r.round(label)
    assert calls == [(3, 0), (1, 1), (1, 2), (1, 3), (1, 4)]
    fit = r.fits()["paged"]
    assert fit["passes"] == 7 and fit["rounds"] == 5 and fit["iterations"] == 105
    assert fit["intercept_s"] > first["intercept_s"]  # the later, slower rounds are in the fit
    lv = r.level_by_round()
    assert [x["label"] for x in lv][::4] == ["calibration", "after the last replay"]
    assert lv[0]["paged"] < 1.0 < lv[4]["paged"] and lv[0]["static"] == lv[0]["paged"]
    assert set(r.summary()["static"]) >= {"intercept_s", "per_seq_s", "per_token_s", "passes", "rounds"}
    assert "rows" not in r.summary()["static"]


def test_overhead_rounds_refit_on_pooled_kernel_rounds(monkeypatch):
    """With kernel rounds: a kernel pass runs right before every later overhead round (not before the
    up-front passes), and the fit prices every overhead row against the kernel curves pooled over all
    passes (predicted_s recomputed from the row's shape; residual = measured - that)."""
    from calibration import kernels
    from calibration.validate import OverheadRounds
    from sim.catalog import MODELS
    from sim.cost.model import BatchShape
    from sim.cost.profile import load_profile

    tiny = MODELS["tiny-llama"]
    prof = load_profile("cpu-reference")
    events = []

    def fake(bases, model, *, passes, seed, **kw):
        events.append(("overhead", seed))
        rows = []
        for S in (1, 2, 4):
            for _ in range(passes * 6):
                meas = 1e-3 * (3 + S)
                rows.append(
                    {
                        "seqs": S,
                        "decode_seqs": S,
                        "tokens": S,
                        "pure_decode": True,
                        "chunks": [],
                        "decode_kv_tokens": 100 * S,
                        "alloc_events": 0,
                        "predicted_s": 0.0,
                        "measured_s": meas,
                        "cpu_s": meas,
                        "residual_s": meas,
                        "since_prefill": 10,
                    }
                )
        return {
            a: {
                "rows": rows,
                "elapsed_s": 0.1,
                "block_size": 16,
                "dtype": "fp32",
                "threads": 1,
                "clock": "cpu_norm",
                "batches": [1, 2, 4],
                "prompt_range": [16, 384],
                "output_tokens": 24,
            }
            for a in kw["allocators"]
        }

    class FakeKernels:
        runs = ["upfront"]

        def round(self, label):
            events.append(("kernels", label))
            self.runs.append(label)

        def passes(self):
            return len(self.runs) + 1

        def bases(self):
            return {"paged": prof, "static": prof}

    monkeypatch.setattr(kernels, "measure_engine_overhead", fake)
    r = OverheadRounds(
        {"paged": None, "static": None},
        tiny,
        {"allocators": ("paged", "static"), "block_size": 16},
        kernels=FakeKernels(),
    )
    r.upfront()
    r.round("before light/paged")
    r.round("after the last replay")
    assert events == [
        ("overhead", 0),
        ("kernels", "before light/paged"),
        ("overhead", 1),
        ("kernels", "after the last replay"),
        ("overhead", 2),
    ]
    fit = r.fits()["paged"]
    assert r.bases["paged"] is prof and fit["kernel_passes"] == 4
    cost = kernels.kernel_cost(prof, tiny, "paged", 16)
    for row in r.rows["paged"]:
        pred = cost.step_time_s(BatchShape([], row["decode_seqs"], row["decode_kv_tokens"]))
        assert row["predicted_s"] == pytest.approx(pred, rel=1e-12) and pred > 0
        assert row["residual_s"] == pytest.approx(row["measured_s"] - pred, rel=1e-12)
    # the fit is the plain fit of those re-priced rows
    again = kernels.fit_overhead(r.rows["paged"], "cpu_norm")
    assert (fit["intercept_s"], fit["per_seq_s"]) == (again["intercept_s"], again["per_seq_s"])


def test_engine_overhead_queued_mix():
    """``mixes``: the ``queued`` runs admit waiting requests as others finish, so their prefill chunks
    run beside running decodes after the batch has been decoding (what a loaded replay does and an
    ``offline`` batch never does: all its prefills come first); every row says which runs it is from."""
    pytest.importorskip("torch")
    from calibration.kernels import kernels_only, measure_engine_overhead
    from sim.catalog import get_model
    from sim.cost.profile import load_profile

    model = get_model("tiny-llama")
    prof = kernels_only(load_profile("cpu-reference"))
    with pytest.raises(ValueError, match="mixes: one or more of offline, queued"):
        measure_engine_overhead(prof, model, mixes=("online",))
    out = measure_engine_overhead(
        prof,
        model,
        batches=(2, 4),
        passes=1,
        clock="cpu",
        prompt_range=(16, 64),
        output_tokens=8,
        output_range=(4, 24),
        mixes=("offline", "queued"),
    )
    fit = out["paged"]
    assert fit["mixes"] == ["offline", "queued"] and fit["output_range"] == [4, 24]
    runs: dict[str, list] = {}
    for r in fit["rows"]:
        assert r["run"].endswith("/" + r["mix"])
        runs.setdefault(r["run"], []).append(r)
    assert sorted(runs) == ["0/2/offline", "0/2/queued", "0/4/offline", "0/4/queued"]
    for name, rows in runs.items():
        first_decode = next(i for i, r in enumerate(rows) if r["pure_decode"])
        late_prefill = [r for r in rows[first_decode:] if not r["pure_decode"]]
        if name.endswith("offline"):
            assert not late_prefill, name
        else:  # b + b // 2 requests through b slots: at least one admitted mid-stream, beside decodes
            assert late_prefill and all(r["decode_seqs"] >= 1 for r in late_prefill), name
            assert max(r["seqs"] for r in rows) <= int(name.split("/")[1])
    assert all(r["predicted_s"] > 0 for r in fit["rows"])


def test_pool_measurements_median_of_runs():
    """Per coordinate the median of the runs' medians; extremes and repeats over all runs; a point
    that only some runs have is pooled over those; pooling pooled runs counts every run once."""
    from calibration.kernels import Measurements, Timing, pool_measurements

    runs = []
    for med in (1.0, 3.0, 2.0):
        m = Measurements()
        m.add("gemm", "qkv", Timing(med, med / 2, med * 2, 5, 10, 2), m=1, n=8, k=8)
        m.add("gemm", "qkv", Timing(10 * med, 5 * med, 20 * med, 5, 10, 2), m=2, n=8, k=8)
        runs.append(m)
    runs[2].add("memory", "copy", Timing(7.0, 6.0, 8.0, 3, 1, 1), nbytes=4096)
    p = pool_measurements(runs)
    rows = {(r["family"], r.get("m"), r.get("nbytes")): r for r in p.rows}
    assert len(p.rows) == 3
    a = rows[("gemm", 1, None)]
    assert (a["median_s"], a["min_s"], a["max_s"], a["repeats"], a["runs"]) == (2.0, 0.5, 6.0, 15, 3)
    assert rows[("gemm", 2, None)]["median_s"] == 20.0
    assert rows[("memory", None, 4096)]["median_s"] == 7.0 and rows[("memory", None, 4096)]["runs"] == 1
    assert [r["m"] for r in p.select("gemm", n=8)] == [1, 2]
    twice = pool_measurements([p, runs[0]])
    assert twice.select("gemm", m=1)[0]["runs"] == 4 and len(twice.rows) == 3


def test_host_speed_kernel_round_probes_after_freeze():
    """After the reference is frozen tick() probes nothing, except inside kernel_round(), which
    records under its own phase; the reference stays; factor_at reads the new probes."""
    from calibration.validate import HostSpeed

    class Probe:
        def __init__(self, times):
            self.times = list(times)

        def measure(self, warm=True):
            return self.times.pop(0)

    hs = HostSpeed({"paged": Probe([1.0] * 10 + [2.0] * 4)})
    hs.every_s = 1e9  # only forced ticks probe, however slow this host
    hs.sample("before_calibration", 10)
    hs.freeze()
    hs.tick(force=True)
    assert len(hs.series["paged"]) == 10 and hs.reference("paged") == 1.0
    with hs.kernel_round():
        hs.tick(force=True)
        hs.tick(force=True)
        hs.tick()  # within every_s of the last: nothing
        hs.tick(force=True)
    hs.tick(force=True)  # closed again
    assert [x[0] for x in hs.series["paged"]][10:] == ["kernel_rounds"] * 3
    assert hs.reference("paged") == 1.0
    import time as _t

    # probe stamps are kept to 0.1 ms: look a second on, past the last of these instant probes
    assert hs.factor_at(_t.perf_counter() + 1.0) == pytest.approx(0.5)  # host now twice as slow


def test_replay_order_interleaved_and_blocked():
    """replay_cells: interleaved sweeps every cell once per replay (the raw clocks after a cell's last
    table-clock replay); blocked finishes one cell first. ``before`` sees every table-clock replay."""
    from calibration.validate import LoadSpec, Replayed, replay_cells

    class FakeEngine:
        def __init__(self, name, log):
            self.name, self.log = name, log

        def run(self, reqs, clock, **kw):
            self.log.append((self.name, len(reqs), clock, "probe" if "probe" in kw else kw.get("lead_s", "replay")))
            return (self.name, clock)

    class FakeSpeed:
        def run_kwargs(self, allocator):
            return {"probe": allocator[0].upper(), "probe_ref_s": 1.0}

    for order, want in (
        ("interleaved", ["pl", "pm", "sl", "pl", "pm", "sl"]),
        ("blocked", ["pl", "pl", "pm", "pm", "sl", "sl"]),
    ):
        spec = load_spec("scenarios/validate-cpu.yaml")
        spec.engine.replays, spec.engine.clocks, spec.engine.replay_order = 2, ["cpu_norm", "wall"], order
        log, seen = [], []
        engines = {a: FakeEngine(a, log) for a in ("paged", "static")}
        rows = np.zeros((3, 3))
        cells = [
            Replayed(LoadSpec(name=ld, rate=1.0), a, 1.0, rows, Path("t.csv"), {"cpu_norm": [], "wall": []}, {})
            for a, ld in (("paged", "light"), ("paged", "medium"), ("static", "light"))
        ]
        replay_cells(
            spec,
            cells,
            engines,
            FakeSpeed(),
            before=lambda k, c, seen=seen: seen.append((k, c.allocator[0] + c.load.name[0])),
        )
        assert [x[1] for x in seen] == want and [x[0] for x in seen] == list(range(6))
        norm = [(name[0], clock) for name, n, clock, kind in log if n == 3]
        assert [n for n, c in norm if c == "cpu_norm"] == [w[0] for w in want]
        for c in cells:
            assert len(c.results["cpu_norm"]) == 2 and len(c.results["wall"]) == 1
            assert set(c.probes) == {"wall"}  # before and after the raw clock's one replay
        # a raw clock's replay comes right after its cell's last cpu_norm replay, bracketed by probes
        i = next(i for i, x in enumerate(log) if x[2] == "wall" and x[1] == 3)
        assert log[i - 2][2] == "cpu_norm" and log[i - 1][3] == 0.0 and log[i + 1][3] == 0.0


def _run_rows(a, b, c, excess, runs=12, decodes=20, rng=None):
    """Synthetic calibration rows: per run one prefill iteration of P tokens (S decoding alongside),
    then ``decodes`` pure-decode iterations, the k-th of which carries ``excess[k - 1]`` seconds more."""
    from calibration.kernels import AFTER_PREFILL

    rows = []
    for run in range(runs):
        S, P = 1 + run % 4, 32 + 16 * run
        since = 0
        for i in range(decodes + 1):
            kern = 1e-3 * S
            if i == 0:
                # the chunk is one more sequence; T - seqs = P - 1 tokens beyond one per sequence
                over, r = a + b * (S + 1) + c * (P - 1), {"seqs": S + 1, "tokens": S + P, "pure_decode": False}
                since = 0
            else:
                since += 1
                over = a + b * S + (excess[since - 1] if since <= len(excess) else 0.0)
                r = {"seqs": S, "tokens": S, "pure_decode": True}
            if rng is not None:
                over *= 1.0 + rng.normal(0, 0.01)
            m = kern + over
            r.update(
                predicted_s=kern,
                measured_s=m,
                cpu_s=m,
                residual_s=over,
                run=f"0/{run}",
                since_prefill=since,
                iteration=i + 1,
            )
            rows.append(r)
    assert AFTER_PREFILL == 5
    return rows


def test_overhead_fit_steady_state_and_after_prefill():
    """The decode term is fitted on steady-state iterations; the k-th decode iteration after a prefill
    gets its own excess over it (after_prefill_s), which the all-decode fit averages into a + b·S."""
    from calibration.kernels import fit_overhead

    a, b, c = 1e-3, 2e-4, 20e-6
    excess = [6e-4, 3e-4, 1e-4, 0.0, 0.0]  # seconds, decode iterations 1..5 after a prefill
    fit = fit_overhead(_run_rows(a, b, c, excess), "cpu_norm")
    # the mixed iteration counts one more sequence (the chunk) than the decodes around it
    assert fit["intercept_s"] == pytest.approx(a, rel=1e-6) and fit["per_seq_s"] == pytest.approx(b, rel=1e-6)
    assert fit["per_token_s"] == pytest.approx(c, rel=1e-6)
    assert fit["after_prefill_s"] == pytest.approx(excess[:3], rel=1e-6)  # trailing zeros dropped
    assert fit["after_prefill_samples"] == [12] * 5 and fit["steady_decode_iterations"] == 12 * 15
    assert fit["fit_p90_rel_err"] < 1e-6  # with the excess, the fit prices every row
    assert fit_overhead(_run_rows(a, b, c, excess), "cpu_norm", after_prefill=False)["after_prefill_s"] == []
    # short runs (most decode iterations right after a prefill): the all-decode fit lifts a + b·S instead
    long_excess = [6e-4, 5e-4, 4e-4, 3e-4, 2e-4]
    short = _run_rows(a, b, c, long_excess, decodes=8)
    alld = fit_overhead(short, "cpu_norm", steady=False)
    assert alld["intercept_s"] > a * 1.01 and alld["after_prefill_s"] == []
    assert fit_overhead(short, "cpu_norm")["intercept_s"] == pytest.approx(a, rel=1e-6)
    assert fit_overhead(_run_rows(a, b, c, [0.0] * 5), "cpu_norm")["after_prefill_s"] == []
    noisy = fit_overhead(_run_rows(a, b, c, excess, rng=np.random.default_rng(0)), "cpu_norm")
    assert noisy["after_prefill_s"][0] == pytest.approx(excess[0], rel=0.1)
    assert noisy["intercept_s"] + noisy["per_seq_s"] == pytest.approx(a + b, rel=0.03)
    # into the profile as is
    from calibration.kernels import with_engine_overhead
    from sim.catalog import get_model
    from sim.cost.profile import load_profile

    prof = with_engine_overhead(
        load_profile("cpu-reference"),
        {**fit, "allocator": "paged", "block_size": 16, "dtype": "fp32", "threads": 1},
        get_model("tiny-llama"),
    )
    assert prof.cpu_overhead["by_tp"]["1"]["after_prefill_s"] == fit["after_prefill_s"]


def test_overhead_fit_by_seqs_prices_each_measured_count():
    """``by_seqs``: each count with enough steady-state iterations gets its departure from the line,
    so the fit prices those counts exactly (the line alone misses them); a count with fewer gets none;
    the per-prefill-token part is measured against the line with its departures; the profile and
    ``step_overhead_s`` charge the same; without ``by_seqs`` nothing departs."""
    from calibration.kernels import BY_SEQS_MIN, fit_overhead, step_overhead_s, with_engine_overhead
    from sim.catalog import get_model
    from sim.cost.profile import load_profile

    a, b, c = 1e-3, 2e-4, 20e-6
    bump = {1: 0.0, 2: -3e-4, 3: 2e-4, 4: 0.0, 5: 0.0, 6: 4e-4}
    rows = []
    for S, n in ((1, 30), (2, 30), (3, BY_SEQS_MIN), (4, 30), (6, BY_SEQS_MIN - 1)):
        for _ in range(n):
            over = a + b * S + bump[S]
            rows.append(
                {
                    "seqs": S,
                    "tokens": S,
                    "pure_decode": True,
                    "since_prefill": 10,
                    "residual_s": over,
                    "predicted_s": 1e-3,
                    "measured_s": 1e-3 + over,
                    "cpu_s": 1e-3 + over,
                }
            )
    for S, P in ((2, 40), (3, 90), (4, 200)):  # mixed iterations: S sequences (the chunk's included), P + S tokens
        over = a + b * S + bump[S] + c * P
        rows.append(
            {
                "seqs": S,
                "tokens": S + P,
                "pure_decode": False,
                "since_prefill": 0,
                "residual_s": over,
                "predicted_s": 1e-3,
                "measured_s": 1e-3 + over,
                "cpu_s": 1e-3 + over,
            }
        )
    line = fit_overhead(rows, "cpu_norm", by_seqs=False)
    fit = fit_overhead(rows, "cpu_norm")
    assert "per_seq_delta_s" not in line and line["fit_p90_rel_err"] > 0.02
    assert fit["per_seq_delta_s"]["seqs"] == [1, 2, 3, 4]  # 6: one iteration too few
    assert step_overhead_s(fit, [1, 2, 3, 4]) == pytest.approx([a + b * S + bump[S] for S in (1, 2, 3, 4)], rel=1e-9)
    assert fit["per_token_s"] == pytest.approx(c, rel=1e-6)
    assert fit["fit_median_rel_err"] < 1e-9
    assert step_overhead_s(fit, [6])[0] == pytest.approx(fit["intercept_s"] + 6 * fit["per_seq_s"])
    prof = with_engine_overhead(
        load_profile("cpu-reference"),
        {**fit, "allocator": "paged", "block_size": 16, "dtype": "fp32", "threads": 1},
        get_model("tiny-llama"),
    )
    assert prof.cpu_overhead["by_tp"]["1"]["per_seq_delta_s"] == fit["per_seq_delta_s"]
    line_prof = with_engine_overhead(
        load_profile("cpu-reference"),
        {**line, "allocator": "paged", "block_size": 16, "dtype": "fp32", "threads": 1},
        get_model("tiny-llama"),
    )
    assert "per_seq_delta_s" not in line_prof.cpu_overhead["by_tp"]["1"]


def test_overhead_fit_mixed_decode_cost():
    """``mixed_decode``: iterations with prefill are fitted ``c·P + g·D``, recovering both from rows
    built so; without a per-decode cost the fit's ``c`` is the sum ratio the fit used before; the
    profile carries ``g`` and the simulator charges it per decoding sequence in a mixed iteration only."""
    from calibration.kernels import fit_overhead, with_engine_overhead
    from sim.catalog import GPUS, get_model
    from sim.cost.model import BatchShape
    from sim.cost.profile import load_profile
    from sim.cost.profile_model import ProfileCostModel

    a, b, c, g = 1e-3, 2e-4, 20e-6, 1.5e-4
    rng = np.random.default_rng(3)

    def rows_with(g):
        rows = []
        for S in (1, 2, 4, 8):
            for _ in range(30):
                over = a + b * S
                rows.append(
                    {
                        "seqs": S,
                        "tokens": S,
                        "decode_seqs": S,
                        "pure_decode": True,
                        "since_prefill": 10,
                        "residual_s": over,
                        "predicted_s": 1e-3,
                        "measured_s": 1e-3 + over,
                        "cpu_s": 1e-3 + over,
                    }
                )
        for _ in range(60):
            D, P = int(rng.integers(0, 8)), int(rng.integers(16, 250))
            S = D + 1
            over = a + b * S + c * P + g * D
            rows.append(
                {
                    "seqs": S,
                    "tokens": S + P,
                    "decode_seqs": D,
                    "pure_decode": False,
                    "since_prefill": 0,
                    "residual_s": over,
                    "predicted_s": 1e-3,
                    "measured_s": 1e-3 + over,
                    "cpu_s": 1e-3 + over,
                }
            )
        return rows

    fit = fit_overhead(rows_with(g), "cpu_norm")
    assert fit["per_token_s"] == pytest.approx(c, rel=1e-6) and fit["mixed_per_decode_s"] == pytest.approx(g, rel=1e-6)
    assert fit["fit_p90_rel_err"] < 1e-9
    assert fit_overhead(rows_with(g), "cpu_norm", mixed_decode=False)["mixed_per_decode_s"] == 0.0
    flat = rows_with(0.0)
    both, ratio = fit_overhead(flat, "cpu_norm"), fit_overhead(flat, "cpu_norm", mixed_decode=False)
    assert both["mixed_per_decode_s"] == pytest.approx(0.0, abs=1e-12)
    assert both["per_token_s"] == pytest.approx(ratio["per_token_s"], rel=1e-9)
    model = get_model("tiny-llama")
    meta = {"allocator": "paged", "block_size": 16, "dtype": "fp32", "threads": 1}
    prof = with_engine_overhead(load_profile("cpu-reference"), {**fit, **meta}, model)
    assert prof.cpu_overhead["by_tp"]["1"]["mixed_per_decode_s"] == pytest.approx(g)
    plain = with_engine_overhead(load_profile("cpu-reference"), {**fit, **meta, "mixed_per_decode_s": 0.0}, model)
    assert "mixed_per_decode_s" not in plain.cpu_overhead["by_tp"]["1"]
    kd = prof.dtypes["weight"][0]
    cm, cm0 = (ProfileCostModel(p, model, GPUS["cpu"], weight_dtype=kd, kv_dtype=kd) for p in (prof, plain))
    mixed = BatchShape(prefill_chunks=[(64, 0)], decode_seqs=5, decode_kv_tokens=900)
    assert cm.step_time_s(mixed) - cm0.step_time_s(mixed) == pytest.approx(5 * g, rel=1e-9)
    decode = BatchShape(decode_seqs=5, decode_kv_tokens=900)
    assert cm.step_time_s(decode) == cm0.step_time_s(decode)
    prof.cpu_overhead["by_tp"]["1"]["mixed_per_decode_s"] = -1e-3
    with pytest.raises(ConfigError, match="mixed_per_decode_s"):
        ProfileCostModel(prof, model, GPUS["cpu"], weight_dtype=kd, kv_dtype=kd)


def test_scale_profile_scales_every_cpu_term():
    """The raw clocks' host-speed scaling reaches the after-prefill excess and the per-count
    departures too, not only the line."""
    from calibration.validate import scale_profile
    from sim.cost.profile import load_profile

    prof = load_profile("cpu-reference")
    t = prof.cpu_overhead["by_tp"]["1"]
    t.update(
        after_prefill_s=[4e-3, 1e-3],
        per_seq_delta_s={"seqs": [1, 3], "delta_s": [-2e-4, 5e-4]},
        mixed_per_decode_s=2e-4,
    )
    scaled = scale_profile(prof, 1.5).cpu_overhead["by_tp"]["1"]
    assert scaled["mixed_per_decode_s"] == pytest.approx(3e-4)
    assert scaled["after_prefill_s"] == pytest.approx([6e-3, 1.5e-3])
    assert scaled["per_seq_delta_s"] == {"seqs": [1, 3], "delta_s": pytest.approx([-3e-4, 7.5e-4])}
    assert scaled["intercept_s"] == pytest.approx(1.5 * t["intercept_s"])


def test_overhead_fit_center_prices_the_mean_iteration():
    """Right-skewed iteration times (a few slow ones): the default trimmed centre lands between the
    median and the mean, so a sum of iterations is priced closer to its measured total than with
    medians; the trim keeps one huge outlier out; a bad centre is refused."""
    from calibration.kernels import fit_overhead

    rng = np.random.default_rng(1)
    rows = []
    for S in (1, 2, 4, 8):
        base = 1e-3 + 2e-4 * S
        extra = rng.exponential(0.1 * base, size=400)  # skewed: mean above median
        extra[0] = 100 * base  # one host stall
        for x in extra:
            rows.append(
                {
                    "seqs": S,
                    "tokens": S,
                    "pure_decode": True,
                    "since_prefill": 10,
                    "residual_s": base + x,
                    "measured_s": 2 * base + x,
                    "cpu_s": 2 * base + x,
                    "predicted_s": base,
                }
            )
    fits = {c: fit_overhead(rows, "cpu_norm", center=c) for c in ("median", "trimmed", "mean")}
    at = {c: f["intercept_s"] + 4 * f["per_seq_s"] for c, f in fits.items()}
    assert at["median"] < at["trimmed"] < at["mean"]
    total = sum(r["residual_s"] for r in rows if r["seqs"] == 4 and r["residual_s"] < 50 * 1.8e-3) / 399
    assert abs(at["trimmed"] - total) < abs(at["median"] - total)
    with pytest.raises(ValueError, match="center"):
        fit_overhead(rows, "cpu_norm", center="mode")
    # groups too small to trim (two iterations at S = 3) take their median, never NaN
    few = rows + [dict(rows[0], seqs=3, residual_s=1.7e-3), dict(rows[0], seqs=3, residual_s=1.9e-3)]
    small = fit_overhead(few, "cpu_norm")
    assert np.isfinite(small["intercept_s"]) and np.isfinite(small["per_seq_s"])


def test_replays_median_and_spread():
    per = [
        {"ttft_p50": 1.0, "preemptions": 0, "x": None},
        {"ttft_p50": 3.0, "preemptions": 2, "x": 1.0},
        {"ttft_p50": 1.2, "preemptions": 1, "x": 1.0},
    ]
    m = median_metrics(per)
    assert m["ttft_p50"] == 1.2 and m["preemptions"] == 1 and isinstance(m["preemptions"], int) and m["x"] is None
    assert median_metrics(per[:2])["preemptions"] == 1.0  # even count: mean of the middle two
    assert median_metrics(per[:1]) == per[0]
    assert replay_spread([1.0, 3.0, 1.2]) == pytest.approx(2.0 / 1.2)
    assert replay_spread([2.0]) is None and replay_spread([0, 0]) == 0.0 and replay_spread([1.0, None]) is None


def test_error_summary():
    from calibration.validate import error_summary

    rows = [
        {"load": "l", "allocator": "paged", "metric": m, "rel_error": e, "replay_spread": sp}
        for m, e, sp in (
            ("ttft_p50", 0.02, 0.05),
            ("ttft_p90", 0.30, 0.10),
            ("tpot_p50", 0.07, 0.01),
            ("e2e_p90", 0.10, None),
            ("ttft_p99", 0.9, 0.0),
            ("throughput", 0.5, 0.0),
        )
    ]
    sm = error_summary(rows)  # p99 and throughput are not target cells
    assert sm["cells"] == 4 and sm["within_10pct"] == 3 and sm["within_5pct"] == 1  # 10 % itself is within
    assert sm["max_rel_error"] == 0.30 and sm["worst"] == "l/paged ttft_p90"
    assert sm["median_rel_error"] == pytest.approx(0.085) and sm["below_replay_spread"] == 1
    assert error_summary([]) == {"cells": 0}


def test_cuda_spec_and_clocks():
    from calibration.validate import check_clocks

    spec = load_spec("scenarios/validate-cuda.yaml")
    assert spec.model == "llama-3.1-8b" and spec.engine.clocks == ["wall"] and spec.engine.dtype == "bf16"
    # a dedicated GPU: kernels and engine overhead measured once, before the replays
    assert (spec.engine.kernel_rounds, spec.engine.overhead_rounds) == ("upfront", "upfront")
    check_clocks(spec, "cuda")
    cpu = load_spec("scenarios/validate-cpu.yaml")
    check_clocks(cpu, "cpu")
    with pytest.raises(ConfigError, match=r"validate\.engine\.clocks.*\[wall\] with --device cuda"):
        check_clocks(cpu, "cuda")
    from calibration.validate import validate

    with pytest.raises(ConfigError, match="engine.clocks"):  # before anything is calibrated
        validate(cpu, device="cuda")


def test_cuda_spec_simulates_at_the_engines_capacity(tmp_path):
    """The simulator side of the GPU validation runs here: an 8B shape needs the cuda GPU entry's
    memory (the cpu entry cannot hold its weights), at exactly the engine's KV capacity."""
    from calibration.validate import estimate_capacity
    from sim.engine.cluster import simulate
    from sim.engine.deployment import Deployment

    spec = load_spec("scenarios/validate-cuda.yaml", quick=True)
    cap = estimate_capacity(spec, "paged", "none", tmp_path, "cuda")
    rows = make_requests(spec, 1.6 * cap, "cuda")
    path = write_trace(rows, tmp_path / "t.csv")
    for alloc in ("paged", "static"):
        sc = sim_scenario(spec, alloc, trace_path=str(path), profile="none", device="cuda")
        assert Deployment.from_scenario(sc).kv_capacity_tokens == capacity_tokens(spec)
        assert simulate(sc).summary["completed"] == len(rows)
    with pytest.raises(ConfigError, match="activation_reserve_bytes"):
        make_requests(spec, 1.0, "cpu")


def test_wall_clock_replays(tmp_path):
    """The path a GPU run takes (raw clock, bracketing probes) with replays, on a given profile."""
    pytest.importorskip("torch")
    from calibration.validate import validate

    spec = load_spec("scenarios/validate-cpu.yaml", quick=True)
    spec.engine.clocks, spec.engine.replays = ["wall"], 2
    spec.workload.num_requests = 6
    spec.allocators = ["paged"]
    doc = validate(spec, device="cpu", profile="cpu-reference", out=tmp_path, engine_overhead=False)
    assert doc["clock"] == "wall" and doc["replays"] == 2 and list(doc["rows_by_clock"]) == ["wall"]
    for r in doc["rows"]:
        assert len(r["measured_replays"]) == 2 and r["measured"] == pytest.approx(
            float(np.median(r["measured_replays"]))
        )
    d = doc["diagnostics"]["medium/paged"]["wall"]
    assert len(d["replays"]) == 2 and d["host_probe_before"]["measured_s"] > 0
    # the engine's side was on disk before the simulator ran: the same replays the table reports
    cell = json.loads((tmp_path / "measured.json").read_text())["cells"][0]
    assert (cell["load"], cell["allocator"], cell["requests"]) == ("medium", "paged", 6)
    for r in doc["rows"]:
        got = [rep.get(r["metric"]) for rep in cell["replays"]["wall"]]
        assert got == pytest.approx(r["measured_replays"]), r["metric"]
    assert all(sem["identical"] for sem in doc["semantics"].values())


def test_spec_clocks():
    spec = load_spec("scenarios/validate-cpu.yaml")
    assert spec.engine.clocks == ["cpu_norm", "cpu", "wall"]  # the table's clock first; raw clocks kept
    assert spec.engine.replays == 5 and load_spec("scenarios/validate-cpu.yaml", quick=True).engine.replays == 3


def test_cell_sensitivity_is_one_without_a_queue_and_above_one_on_a_queue(tmp_path):
    """d ln(metric) / d ln(step time): with requests far apart every latency is a sum of step times
    (exactly 1, up to the profile's stored digits); near the knee a queue multiplies it."""
    from calibration.validate import cell_sensitivity, estimate_capacity

    spec = load_spec("scenarios/validate-cpu.yaml")
    spaced = write_trace(np.array([[10.0 * i, 64 + 16 * i, 16] for i in range(6)], dtype=float), tmp_path / "a.csv")
    for alloc in ("paged", "static"):
        s = cell_sensitivity(spec, alloc, spaced, "cpu-reference")
        for m in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "e2e_p50", "e2e_p90"):
            assert s[m] == pytest.approx(1.0, abs=2e-3), (alloc, m, s[m])
        assert abs(s["throughput"]) < 0.01  # set by the arrivals 10 s apart
        assert s["preemptions"] is None  # zero at every factor: no slope
    cap = estimate_capacity(spec, "static", "cpu-reference", tmp_path)
    knee = write_trace(make_requests(spec, 0.9 * cap), tmp_path / "b.csv")
    s = cell_sensitivity(spec, "static", knee, "cpu-reference")
    assert s["ttft_p90"] > 2.0 and s["e2e_p90"] > 1.2, s  # the queue multiplies a step-time error
    with pytest.raises(ConfigError):
        cell_sensitivity(spec, "static", knee, "no-such-profile")


def test_step_equivalent_and_summary():
    from calibration.validate import SENSITIVITY_MIN, error_summary, sensitivity_fields

    assert sensitivity_fields(0.14, 7.0) == {"sensitivity": 7.0, "step_equivalent": pytest.approx(0.02)}
    assert sensitivity_fields(0.05, SENSITIVITY_MIN / 2)["step_equivalent"] is None  # set by arrivals, not steps
    assert sensitivity_fields(None, 2.0)["step_equivalent"] is None
    assert sensitivity_fields(0.1, None) == {"sensitivity": None, "step_equivalent": None}
    rows = [
        {"load": "medium", "allocator": "static", "metric": m, "rel_error": e, **sensitivity_fields(e, sv)}
        for m, e, sv in (
            ("ttft_p90", 0.14, 7.0),
            ("tpot_p50", 0.03, 1.0),
            ("e2e_p90", 0.02, 2.0),
            ("ttft_p99", 0.5, 1.0),
        )
    ]  # p99 is not a target cell
    sm = error_summary(rows)
    assert sm["worst"] == "medium/static ttft_p90" and sm["max_rel_error"] == 0.14
    assert (
        sm["max_step_equivalent"] == pytest.approx(0.03) and sm["max_step_equivalent_cell"] == "medium/static tpot_p50"
    )
    assert sm["max_sensitivity"] == 7.0 and sm["max_sensitivity_cell"] == "medium/static ttft_p90"


def test_simulator_capacity_matches_engine_blocks(tmp_path):
    from sim.engine.cluster import simulate
    from sim.engine.deployment import Deployment

    spec = load_spec("scenarios/validate-cpu.yaml")
    rows = make_requests(spec, 5.0)
    assert rows[0, 0] == 0.0 and np.all(np.diff(rows[:, 0]) >= 0) and len(rows) == spec.workload.num_requests
    path = write_trace(rows, tmp_path / "t.csv")
    for alloc in ("paged", "static"):
        sc = sim_scenario(spec, alloc, trace_path=str(path), profile="none")
        dep = Deployment.from_scenario(sc)
        assert dep.kv_capacity_tokens == capacity_tokens(spec)
        res = simulate(sc)
        assert res.summary["completed"] == len(rows)
        got = res.requests.sort_by("id")
        np.testing.assert_allclose(got["arrival_s"].to_numpy(), rows[:, 0], rtol=0, atol=1e-12)
        np.testing.assert_array_equal(got["prompt_tokens"].to_numpy(), rows[:, 1])


def test_latency_metrics_definitions():
    m = latency_metrics([0, 1], [0.5, 1.2], [1.5, 2.2], [10, 20], [3, 1])
    assert m["ttft_p50"] == pytest.approx(0.35)
    assert m["tpot_p50"] == pytest.approx(0.5)  # only the request with more than one token
    assert m["throughput"] == pytest.approx(34 / 2.2)
    assert rel_error(2.0, 2.2) == pytest.approx(0.1) and rel_error(0, 0) == 0.0 and rel_error(None, 1) is None


def _drift(doc) -> float:
    """How far the host's speed moved from calibration during the replays: the cpu_norm probe's
    p10 / p90 over each replay against its reference (1 = calibration speed; engine.SpeedProbe)."""
    worst = 0.0
    for by_clock in doc["diagnostics"].values():
        sp = by_clock.get("cpu_norm", {}).get("speed_probes") or {}
        for q in ("p10", "p90"):
            if sp:
                worst = max(worst, abs(sp["probe_s"][q] / sp["reference_s"] - 1.0))
    return worst


@pytest.mark.timing
def test_quick_validation_within_bound(tmp_path):
    """Calibrate (validation grid), measure the engine overhead, run engine and simulator on the
    quick subset (medium load, paged and static) and compare on the engine's host-speed-normalised
    CPU clock (``cpu_norm``, the spec's table clock; the raw clocks are left out to keep this short).

    A loose bound, as CI runs on a shared 2-core host whose speed moves by tens of percent within
    seconds, which the normalisation removes only partly (docs/validation.md): the median relative
    error over p50/p90 TTFT, TPOT and e2e of both allocators within 25 %, and none off by more
    than 2x. The semantics (schedule, blocks, preemptions) must be identical. A miss is measured
    once more before it fails."""
    pytest.importorskip("torch")
    from calibration.validate import validate

    spec = load_spec("scenarios/validate-cpu.yaml", quick=True)
    assert spec.engine.clocks[0] == "cpu_norm"
    spec.engine.clocks = ["cpu_norm"]
    for attempt in range(2):
        out = tmp_path / f"try{attempt}"
        doc = validate(spec, device="cpu", out=out)
        assert (out / "validation.html").is_file()
        on_disk = json.loads((out / "validation.json").read_text())
        assert on_disk["rows"] == json.loads(json.dumps(doc["rows"]))
        assert {r["metric"] for r in doc["rows"]} == set(METRICS) and doc["clock"] == "cpu_norm"
        n = spec.engine.replays
        assert doc["replays"] == n >= 2
        assert doc["summary"]["cells"] == 12 and "below_replay_spread" in doc["summary"]
        # each row carries the cell's sensitivity to step time (TPOT moves with it, at least ~1:1)
        assert all("sensitivity" in r and "step_equivalent" in r for r in doc["rows"])
        # Near the knee one cell's least-squares slope over ±3 % moves with batch composition (paged
        # TPOT p50: 0.79 in one quick validation, 1.69 on another quick profile and trace), so the
        # check is on the cells together.
        sens = [r["sensitivity"] for r in doc["rows"] if r["metric"] in ("tpot_p50", "e2e_p50")]
        assert len(sens) == 4 and float(np.median(sens)) > 0.5, sens
        assert doc["summary"]["max_sensitivity"] >= 0.5 and doc["summary"]["max_step_equivalent"] >= 0
        # the overhead calibration: 3 passes up front, one before each cell, one after the last
        lv = doc["profile"]["overhead_rounds"]
        assert [x["passes"] for x in lv] == [3, 1, 1, 1] and all(x["paged"] > 0 and x["static"] > 0 for x in lv)
        for a in ("paged", "static"):
            fit = doc["profile"]["engine_overhead"][a]
            assert fit["passes"] == 6 and fit["rounds"] == 4
            prof = json.loads(Path(doc["profile"]["files"][a]).read_text())
            assert prof["cpu_overhead"]["by_tp"]["1"]["intercept_s"] == pytest.approx(fit["intercept_s"])
            assert Path(doc["profile"]["engine_overhead_upfront"]["files"][a]).is_file()
        ov_rows = json.loads((out / "overhead_rows.json").read_text())
        assert {r["round"] for r in ov_rows["paged"]} == {0, 1, 2, 3} and len(ov_rows["static"]) > 100
        # refitting the kept rows with validate's own fit reproduces the table on the same replays
        from calibration.validate.refit import ROUNDS, VARIANTS, refit

        again, upfront = refit(out, variants={"steady": VARIANTS["steady"]}, rounds={"pooled": ROUNDS["pooled"]})
        assert (again["kernels"], upfront["kernels"]) == ("final", "upfront")
        ours = {(r["allocator"], r["metric"]): r["rel_error"] for r in doc["rows"]}
        for r in again["cells"]:
            assert r["rel_error"] == pytest.approx(ours[(r["allocator"], r["metric"])], rel=1e-9, abs=1e-12), r
        # the kernel grid: 2 passes up front, one more before each later overhead round, pooled
        assert [x["passes"] for x in doc["profile"]["kernel_rounds"]] == [2, 1, 1, 1]
        assert all(doc["profile"]["engine_overhead"][a]["kernel_passes"] == 5 for a in ("paged", "static"))
        assert all(r["chunks"] is not None for r in ov_rows["paged"])
        prof = json.loads(Path(doc["profile"]["files"]["paged"]).read_text())
        assert prof["provenance"]["kernel_rounds"]["passes"] == 5
        assert (
            prof["gemm"]
            != json.loads(Path(doc["profile"]["engine_overhead_upfront"]["files"]["paged"]).read_text())["gemm"]
        )
        for r in doc["rows"]:  # the measurement is the median of the replays, each replay kept
            vals = r["measured_replays"]
            assert len(vals) == n and r["measured"] == pytest.approx(float(np.median(vals))), r
            assert r["rel_error_replays"] == [rel_error(v, r["simulated"]) for v in vals]
        for key, by_clock in doc["diagnostics"].items():  # the probe series is reported
            sp = by_clock["cpu_norm"]["speed_probes"]
            assert sp["probes"] >= 3 and sp["reference_s"] > 0 and len(sp["series"]) == sp["probes"], key
            assert sp["prefill_reference_s"] > 0 and len(sp["prefill_series"]) == sp["probes"], key
        for a in ("paged", "static"):  # the prefill probe: its own reference, sampled with the probe
            ref = doc["host_speed_reference"][a]
            pre = ref["prefill_probe"]
            assert pre["reference_s"] > ref["reference_s"] and pre["shape"]["prefill_chunks"] == [[128, 0]]
            assert len(pre["series"]) == len(ref["series"])
        assert doc["shape"]["model"] == "tiny-llama" and doc["device"]["kind"] == "cpu"
        for key, sem in doc["semantics"].items():
            assert sem["identical"], (key, sem)  # same clock => same schedule, blocks, preemptions
        errs = {
            (r["allocator"], r["metric"]): r["rel_error"]
            for r in doc["rows"]
            if r["metric"].split("_")[0] in ("ttft", "tpot", "e2e") and r["metric"].endswith(("p50", "p90"))
        }
        median = float(np.median(list(errs.values())))
        bad = median > 0.25 or max(errs.values()) > 1.0
        drift = _drift(doc)
        if not bad:
            break  # else measure once more: one noisy minute on a shared host is not a verdict
    table = {f"{a}/{m}": f"{v:.0%}" for (a, m), v in sorted(errs.items())}
    print(f"median {median:.0%}: {table}")
    assert not bad, (
        f"median error {median:.0%}, worst {max(errs.values()):.0%}: {table}; host speed drift {drift:.0%}; host load {doc['host_load']}"
    )


def test_device_script_dry_run(tmp_path):
    """bench/device_validate.sh, the prepared GPU check, runs its steps end to end on this CPU (a
    tiny spec, a built-in profile) and leaves its results where a lent machine returns them."""
    pytest.importorskip("torch")
    root = Path(__file__).resolve().parent.parent
    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        "kind: validation\nname: tiny\nengine: {clocks: [wall]}\nworkload: {num_requests: 5}\n"
        "loads: [{name: medium, utilization: 0.7}]\nallocators: [paged]\n"
    )
    out = tmp_path / "out"
    # the attention-table step on sdpa alone (flex would compile its kernels for minutes on this host);
    # the calibrate step is `kvsim calibrate --quick`, tested in test_calibration_device.py
    env = dict(
        os.environ,
        DEVICE="cpu",
        SPEC=str(spec),
        PYTHON=sys.executable,
        OUT=str(out),
        PROFILE="cpu-reference",
        VALIDATE_ARGS="--no-engine-overhead",
        KERNELS="sdpa",
        STEPS="attention validate profile",
    )
    p = subprocess.run(
        ["bash", "bench/device_validate.sh"], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    assert {"validation.json", "run.log", "profile-paged.json", "attention.json"} <= {f.name for f in out.iterdir()}
    doc = json.loads((out / "validation.json").read_text())
    assert doc["clock"] == "wall" and doc["summary"]["cells"] == 6 and "torch" in p.stdout
    assert doc["device"]["kernels"] == "sdpa" and "attention backend flex: available" in p.stdout
    att = json.loads((out / "attention.json").read_text())
    assert att["backends"]["sdpa"]["points"] and "×contig" in p.stdout
    prof = json.loads((out / "engine_profile.json").read_text())
    assert prof["model"] == "tiny-llama" and all(r["paged_ms"] > 0 and r["static_ms"] > 0 for r in prof["rows"])
    # priced by the profile the validation step wrote (paged only in this spec: static is priced by it too)
    assert prof["profile"].endswith("profile-paged.json") and prof["static_profile"] == prof["profile"]
    assert all(r["paged_priced_ms"] > 0 and r["static_priced_ms"] > 0 for r in prof["rows"])
    env["DEVICE"] = "cuda"
    p = subprocess.run(
        ["bash", "bench/device_validate.sh"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    )
    import torch

    if not torch.cuda.is_available():
        assert p.returncode != 0 and "torch sees no CUDA device" in p.stdout + p.stderr
