"""``kvsim calibrate --from-serving-bench`` and ``kvsim validate --serving-bench`` end to end: what
they print, write and refuse, on tiny files and on the shipped one."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from _serving_helpers import GOOD, HEADER, LLAMA, TINY, apart_runs, kv_bound_runs, kvsim, measured, row, vllm_result
from calibration.serving_bench import (
    BenchRow,
    read_bench,
    read_csv,
)
from calibration.serving_evidence import (
    kv_capacity_evidence,
    kv_from_runs,
)
from calibration.serving_fit import (
    builtin_terms,
)
from calibration.serving_notes import few_runs_lines, kernel_warnings
from calibration.serving_selection import (
    selected_rows,
)
from sim.config import APART_SPREAD_CYCLES, scenario_from_dict
from sim.engine.cluster import simulate
from sim.engine_presets import FITTED_TERMS, PRESETS, read_terms_file
from sim.errors import ConfigError

# --- command line ----------------------------------------------------------------------------


TINY_CSV = (
    f"{HEADER}\n{LLAMA},h100_sxm,vllm,1,128,16,2,16.0,7.5\n{LLAMA},h100_sxm,vllm,1,256,16,4,25.0,8.0\n"
    f"Qwen/Qwen3-32B,h100_sxm,vllm,2,128,16,2,30.0,12.0\n{LLAMA},h100_sxm,sglang,1,128,16,2,18.0,7.0\n"
)


def test_calibrate_with_prior_hands_its_starting_terms_to_the_fit_as_prior(tmp_path, monkeypatch):
    import calibration.serving_report as report

    (tmp_path / "tiny.csv").write_text(TINY_CSV)
    seen = []
    real = report.fit

    def spy(rows, start, *a, **k):
        seen.append((start, k.get("prior")))
        return real(rows, start, *a, **k)

    monkeypatch.setattr(report, "fit", spy)
    for prior in (False, True):
        report.calibrate_from_serving_bench(
            str(tmp_path / "tiny.csv"), tmp_path / f"t{prior}.json", max_evals=3, sensitivity=False, prior=prior
        )
    (start0, none), (start1, pulled) = seen
    assert none is None and pulled is start1 and start1.engines == builtin_terms().engines
    assert set(read_terms_file(tmp_path / "tTrue.json")) == {"sglang", "vllm"}


def test_cli_calibrate_writes_terms_a_scenario_runs_with(tmp_path):
    (tmp_path / "tiny.csv").write_text(TINY_CSV)
    r = kvsim("calibrate", "--from-serving-bench", "tiny.csv", "--out", "t.json", "--max-evals", "8", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "wrote t.json" in r.stdout
    terms = read_terms_file(tmp_path / "t.json")
    assert set(terms) == {"sglang", "vllm"} and all(set(v) == set(FITTED_TERMS) for v in terms.values())
    doc = json.loads((tmp_path / "t.json").read_text())
    # Each engine's fit evaluates at least its first simplex (six points for five terms).
    assert doc["evals"] >= 12 and doc["fitted_on"] == "tiny.csv" and len(doc["groups"]) == 3
    # How firmly the rows pin each term, in the file and on the screen.
    assert set(doc["sensitivity"]) == {"sglang", "vllm"}
    assert all(set(d["terms"]) == set(FITTED_TERMS) for d in doc["sensitivity"].values())
    assert "  sglang: objective" in r.stdout and "  vllm: objective" in r.stdout
    assert sum(" -> " in line and "pinned" in line for line in r.stdout.splitlines()) == 2 * len(FITTED_TERMS)
    (tmp_path / "sc.yaml").write_text(
        "name: fitted\nmodel: {name: llama-3.1-8b}\ngpu: {name: H100-SXM-80GB}\n"
        "workload: {num_requests: 12, max_model_len: 512, arrival: {kind: closed_loop, concurrency: 3},\n"
        "           lengths: {kind: fixed, prompt_tokens: 128, output_tokens: 8}}\n"
        "engine: {kind: vllm, terms_file: t.json}\n"
    )
    r = kvsim("run", "sc.yaml", "-q", "--out", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["completed"] == 12
    # The run used the file's vLLM terms: the same scenario with them written as engine.* keys runs the same.
    import yaml

    data = yaml.safe_load((tmp_path / "sc.yaml").read_text())
    data["engine"] = {"kind": "vllm", **terms["vllm"]}
    assert terms["vllm"] != {k: getattr(PRESETS["vllm"], k) for k in FITTED_TERMS}  # the fit moved them
    same = simulate(scenario_from_dict(data)).summary
    assert same["makespan_s"] == summary["makespan_s"]


def test_cli_validate_writes_json_and_offline_html(tmp_path):
    (tmp_path / "tiny.csv").write_text(TINY_CSV)
    r = kvsim("validate", "--serving-bench", "tiny.csv", "--requests-per-client", "2", "--out", "val", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "val" / "serving_validation.json").read_text())
    assert doc["rows"] == 4 and len(doc["results"]) == 4 and doc["requests_per_client"] == 2
    assert all(x["error"] is None and x["sim_ttft_ms"] > 0 and x["sim_tpot_ms"] > 0 for x in doc["results"])
    assert len(doc["score"]["groups"]) == 3 and doc["score"]["overall"]["tpot"]["n"] == 4
    html = (tmp_path / "val" / "serving_validation.html").read_text()
    # plotly.js inline, no script from the network (tests/test_offline_reports.py opens it with the network cut).
    assert "Plotly.newPlot" in html and len(html) > 1_000_000 and not re.search(r"<script[^>]*src=[\"']?https?:", html)
    assert "ALL" in r.stdout
    assert doc["ttft_follows_completions"] == {} and doc["faster_than_kernels"] == {} and "note:" not in r.stdout
    assert all(0 < x["implied_gpu_busy"] < 1.25 for x in doc["results"])
    # No run was measured at two GPU counts: nothing to say about what more GPUs buy.
    assert doc["tp_scaling"] == {} and "what more GPUs buy" not in r.stdout
    # Nor, with 1-2 runs per group, about what sets TTFT at the lowest concurrency.
    assert doc["ttft_vs_prefill"] == {} and "what sets TTFT" not in r.stdout


def test_cli_validate_own_fit_fits_each_group_on_itself(tmp_path):
    (tmp_path / "tiny.csv").write_text(TINY_CSV)
    args = ["--requests-per-client", "2", "--max-evals", "3"]
    r = kvsim("validate", "--serving-bench", "tiny.csv", "--own-fit", *args, "--out", "own", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "own" / "serving_validation.json").read_text())
    assert doc["protocol"].startswith("own fit") and "own fit" in r.stdout
    assert sorted(doc["folds"]) == sorted(doc["score"]["groups"]) and len(doc["folds"]) == 3
    assert all(x["error"] is None for x in doc["results"]) and "group " in r.stderr


def test_cli_validate_logo_names_the_terms_each_folds_training_runs_leave_unpinned(tmp_path):
    (tmp_path / "tiny.csv").write_text(TINY_CSV)
    args = ["--requests-per-client", "2", "--max-evals", "3", "--logo", "--sensitivity"]
    r = kvsim("validate", "--serving-bench", "tiny.csv", *args, "--out", "logo", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "logo" / "serving_validation.json").read_text())
    sens = doc["fold_sensitivity"]
    # The two vLLM groups were each fitted on the other; SGLang's one group on shared terms, not probed.
    assert sorted(sens) == sorted(g for g in doc["folds"] if g.endswith("/vllm")) and len(sens) == 2
    said = " ".join(r.stdout.split())
    for g, engines in sens.items():
        assert set(engines) == {"vllm"} and set(engines["vllm"]["terms"]) == set(FITTED_TERMS)
        loose = [t for t, v in engines["vllm"]["terms"].items() if not v["pinned"]]
        line = f"the runs {g}'s terms were fitted on do not pin {', '.join(loose)}"
        assert (line in said) == bool(loose), (g, loose)
    # It probes fits: without --logo or --own-fit there is none, and it says so.
    r = kvsim("validate", "--serving-bench", "tiny.csv", "--sensitivity", "--out", "none", cwd=tmp_path)
    assert r.returncode == 2 and "--sensitivity" in r.stderr and "with --logo or --own-fit" in r.stderr
    # --blind keeps the treatments out of held-out predictions: there are none without --logo.
    r = kvsim("validate", "--serving-bench", "tiny.csv", "--own-fit", "--blind", "--out", "none", cwd=tmp_path)
    assert r.returncode == 2 and "--blind" in r.stderr and "with --logo" in r.stderr
    # Without --sensitivity nothing is probed.
    r = kvsim("validate", "--serving-bench", "tiny.csv", *args[:-1], "--out", "plain", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plain = json.loads((tmp_path / "plain" / "serving_validation.json").read_text())
    assert plain["fold_sensitivity"] == {} and "do not pin" not in r.stdout
    # Each fold is pulled towards terms shared by its training groups, unless told not to.
    assert "each fit pulled towards terms shared by every training group" in plain["protocol"]
    r = kvsim("validate", "--serving-bench", "tiny.csv", *args[:-1], "--no-prior", "--out", "free", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    free = json.loads((tmp_path / "free" / "serving_validation.json").read_text())
    assert "pulled" not in free["protocol"] and free["protocol"] in plain["protocol"]
    # The terms each fold was pulled towards are kept: the two vLLM folds' (SGLang's one group has no other).
    assert sorted(plain["fold_priors"]) == sorted(g for g in plain["folds"] if g.endswith("/vllm"))
    assert all(set(t) == {"vllm"} for t in plain["fold_priors"].values()) and free["fold_priors"] == {}


def test_unpinned_warnings_name_loose_terms_and_fits_stopped_short():
    from calibration.serving_notes import unpinned_warnings

    def term(pinned, short=False):
        return {"value": 1.0, "probes": [], "pinned": pinned, "short_of_minimum": short}

    sens = {
        "g1": {"vllm": {"objective": 0.1, "terms": {"host_s": term(True), "stream_per_token_s": term(False)}}},
        "g2": {"vllm": {"objective": 0.1, "terms": {"host_s": term(True, short=True), "frontend_s": term(True)}}},
    }
    logo = unpinned_warnings(sens, logo=True)
    assert len(logo) == 2
    assert logo[0].startswith("the runs g1's terms were fitted on do not pin stream_per_token_s (")
    assert logo[0].endswith("so those terms say least about g1")
    assert logo[1].startswith("the fit behind g2's terms stopped short of its minimum in host_s (")
    own = unpinned_warnings(sens, logo=False)
    assert own[0].startswith("g1's own runs do not pin stream_per_token_s") and "say least" not in own[0]
    assert own[1].startswith("g2's own fit stopped short of its minimum in host_s (")
    assert unpinned_warnings({}, logo=True) == []


def test_cli_validate_and_calibrate_go_on_past_rows_they_cannot_simulate(tmp_path):
    bad = f"acme/NoSuchModel-7B,h100_sxm,vllm,1,128,16,2,16.0,7.5\n{LLAMA},H100 PCIe,vllm,1,128,16,2,16.0,7.5\n"
    (tmp_path / "mixed.csv").write_text(TINY_CSV + bad)
    r = kvsim("validate", "--serving-bench", "mixed.csv", "--requests-per-client", "2", "--out", "val", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "val" / "serving_validation.json").read_text())
    assert doc["rows"] == 4 and all(x["error"] is None for x in doc["results"])
    assert [m.split(": ", 2)[1] for m in doc["skipped_rows"]] == ["row 6, model", "row 7, gpu"]
    said = " ".join(r.stderr.split())
    assert (
        "2 rows left out, not simulated" in said and "got 'acme/NoSuchModel-7B'" in said and "got 'H100 PCIe'" in said
    )
    assert "2 rows of the file left out" in r.stdout
    assert "2 rows of the file left out" in (tmp_path / "val" / "serving_validation.html").read_text()
    r = kvsim(
        "calibrate",
        "--from-serving-bench",
        "mixed.csv",
        "--out",
        "t.json",
        "--max-evals",
        "8",
        "--no-sensitivity",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stderr.split())
    assert "calibrate warning 2 rows left out, not simulated" in said and "row 7, gpu: got 'H100 PCIe'" in said
    assert len(json.loads((tmp_path / "t.json").read_text())["groups"]) == 3
    # Nothing left to simulate: one line naming the first problem, exit status 2.
    (tmp_path / "bad.csv").write_text(f"{HEADER}\n{bad}")
    r = kvsim("validate", "--serving-bench", "bad.csv", "--out", "val2", cwd=tmp_path)
    assert r.returncode == 2 and "none that kvsim can simulate" in r.stderr and "row 2, model" in r.stderr


def test_cli_validate_says_which_runs_no_calibrated_profile_priced(tmp_path):
    # No built-in profile has NVFP4 kernels on Hopper or any kernels for the A10G: the roofline prior
    # prices those runs, and the report says so instead of mixing them silently with the others.
    (tmp_path / "r.csv").write_text(
        f"{HEADER},weights\n{GOOD},bf16\n" + GOOD + ",nvfp4\n" + GOOD.replace("h100_sxm", "A10G") + ",bf16\n"
    )
    r = kvsim("validate", "--serving-bench", "r.csv", "--requests-per-client", "2", "--out", "v", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "v" / "serving_validation.json").read_text())
    assert [x["cost_model_calibrated"] for x in doc["results"]] == [True, False, False]
    assert doc["roofline_priced"] == {f"{LLAMA}/h100_sxm/vllm": 1, f"{LLAMA}/A10G/vllm": 1}
    said = " ".join(r.stdout.split())
    assert f"note: {LLAMA}/A10G/vllm: 1 run priced by the roofline prior" in said
    assert "1 runs priced by the roofline prior" in (tmp_path / "v" / "serving_validation.html").read_text()


def test_cli_validate_compares_what_more_gpus_buy_measured_and_simulated(tmp_path):
    (tmp_path / "tp.csv").write_text(
        f"{HEADER}\n{LLAMA},h100_sxm,vllm,1,128,16,4,16.0,7.5\n{LLAMA},h100_sxm,vllm,2,128,16,4,12.0,5.0\n"
    )
    r = kvsim("validate", "--serving-bench", "tp.csv", "--requests-per-client", "2", "--out", "val", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "val" / "serving_validation.json").read_text())
    sim = {x["tp"]: x["sim_tpot_ms"] for x in doc["results"]}
    assert sim[1] > sim[2] > 0
    assert doc["tp_scaling"] == {
        f"{LLAMA}/h100_sxm/vllm": [
            {"tp": [1, 2], "concurrency": 4, "runs": 1, "measured": 1.5, "simulated": round(sim[1] / sim[2], 3)}
        ]
    }
    assert "what more GPUs buy" in r.stdout and "1.50x" in r.stdout
    # The HTML report draws the pair against concurrency, measured and simulated.
    html = (tmp_path / "val" / "serving_validation.html").read_text()
    assert "what more GPUs buy" in html
    assert all(f"vllm: TP 1 to 2, {k}" in html for k in ("measured", "simulated"))  # plotly escapes the slashes


def csv_lines(rows: list[BenchRow]) -> str:
    """``rows`` as lines of a benchmark CSV with the :data:`HEADER` columns."""
    return "".join(
        f"{r.model},{r.gpu},{r.engine},{r.tp},{r.isl},{r.osl},{r.concurrency},{r.ttft_ms:.3f},{r.tpot_ms:.4f}\n"
        for r in rows
    )


def validate_then_calibrate(tmp_path, csv: str, *calibrate_args: str):
    """``kvsim validate`` and then ``kvsim calibrate`` on one CSV: (validate's stdout, its JSON, its
    HTML, calibrate's stderr), each run checked to exit 0."""
    (tmp_path / "runs.csv").write_text(f"{HEADER}\n{csv}")
    r = kvsim("validate", "--serving-bench", "runs.csv", "--requests-per-client", "2", "--out", "val", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "val" / "serving_validation.json").read_text())
    html = (tmp_path / "val" / "serving_validation.html").read_text()
    c = kvsim(
        "calibrate",
        "--from-serving-bench",
        "runs.csv",
        "--out",
        "t.json",
        "--max-evals",
        "3",
        "--no-sensitivity",
        *calibrate_args,
        cwd=tmp_path,
    )
    assert c.returncode == 0, c.stderr
    # Asked for none, the terms file holds no sensitivity and calibrate prints none.
    assert json.loads((tmp_path / "t.json").read_text())["sensitivity"] == {} and " -> " not in c.stdout
    return " ".join(r.stdout.split()), doc, html, " ".join(c.stderr.split())


def validate_with(tmp_path, *flags: str):
    """``kvsim validate`` again on :func:`validate_then_calibrate`'s CSV with ``flags``: (its stdout on
    one line, its JSON, its HTML), the run checked to exit 0."""
    out = "_".join(f.strip("-") for f in flags)
    r = kvsim(
        "validate", "--serving-bench", "runs.csv", "--requests-per-client", "2", *flags, "--out", out, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / out / "serving_validation.json").read_text())
    return " ".join(r.stdout.split()), doc, (tmp_path / out / "serving_validation.html").read_text()


def test_cli_names_single_runs_faster_than_their_kernels(tmp_path):
    # One run at a hundredth of what the other two take: possible runs beside one no GPU computes.
    stdout, doc, html, warned = validate_then_calibrate(
        tmp_path,
        f"{LLAMA},h100_sxm,vllm,1,1024,64,16,2.0,0.5\n{LLAMA},h100_sxm,vllm,1,1024,64,32,3000.0,100.0\n"
        f"{LLAMA},h100_sxm,vllm,1,512,64,8,2000.0,80.0\n",
    )
    g = f"{LLAMA}/h100_sxm/vllm"
    assert doc["faster_than_kernels"] == {} and list(doc["fast_runs"]) == [g]
    (run,) = doc["fast_runs"][g]
    assert (run["isl"], run["osl"], run["concurrency"], run["tp"]) == (1024, 64, 16, 1) and run[
        "implied_gpu_busy"
    ] > 1.25
    assert f"note: {g}: 1 of its runs needs the GPU computing more than 1.25x" in stdout and "1024/64 c16 tp1" in stdout
    assert "1 run faster than the kernels" in html
    assert "calibrate warning" in warned and "1 of its runs needs the GPU" in warned


def test_cli_says_which_groups_are_faster_than_their_kernels(tmp_path):
    # One group's runs whose decoding kvsim prices about as measured, but whose prompts never cost a
    # prefill: no GPU computes that fast, unless the prefix cache served most of every prompt.
    stdout, doc, html, warned = validate_then_calibrate(
        tmp_path,
        f"{LLAMA},h100_sxm,vllm,1,1024,64,16,2.0,7.5\n{LLAMA},h100_sxm,vllm,1,1024,64,32,3.0,9.0\n",
        "--exclude-group",
        "suspect",
        "--cache-flagged",
    )
    assert f"note: {LLAMA}/h100_sxm/vllm: its measured throughput needs the GPU computing" in stdout
    assert list(doc["faster_than_kernels"]) == [f"{LLAMA}/h100_sxm/vllm"]
    assert all(x["implied_gpu_busy"] > 1.25 for x in doc["results"])
    assert "faster than its kernels: GPU busy" in html and "c 16 tp 1, GPU busy" in html
    assert "calibrate warning" in warned and "kernel prices" in warned and "simulated so (--cache-flagged)" in warned
    # Excluded from training: the only group, so the engine keeps its starting terms.
    terms = json.loads((tmp_path / "t.json").read_text())
    assert terms["groups"] == []
    # How much of every prompt the cache must have served, said, and simulated on request.
    g = f"{LLAMA}/h100_sxm/vllm"
    share = doc["least_cached_share"][g]
    assert 0 < share < 1 and doc["cached"] == []
    assert f"at least {share:.0%} of every prompt from the prefix cache makes them possible" in stdout
    assert "(--cache-flagged simulates that)" in stdout
    cached_out, cached, cached_html = validate_with(tmp_path, "--cache-flagged")
    assert cached["cached"] == [g] and "simulated so (--cache-flagged)" in cached_out
    assert f"simulated with {share:.0%} of each prompt cached" in cached_html
    before = {x["concurrency"]: x["sim_ttft_ms"] for x in doc["results"]}
    assert all(x["sim_ttft_ms"] < before[x["concurrency"]] for x in cached["results"])
    # Runs whose decoding alone is faster than the kernels: no share of cached prompt explains them.
    (line,) = kernel_warnings({g: 10.0}, {g: 1.0}, [])
    assert "not even every prompt from the prefix cache makes them possible: their decoding alone needs more" in line
    assert "at least" not in line and "--cache-flagged simulates" not in line
    (line,) = kernel_warnings({g: 10.0}, {g: 1.0}, [g])
    assert "simulated with all but one prompt token cached, --cache-flagged" in line


def test_cli_validate_scores_all_rows_and_all_but_the_groups_flagged_whole(tmp_path):
    # The fast group of the test above beside one that kvsim prices as measured (its own runs).
    fast = f"{LLAMA},h100_sxm,vllm,1,1024,64,16,2.0,7.5\n{LLAMA},h100_sxm,vllm,1,1024,64,32,3.0,9.0\n"
    own = measured([row(gpu="h200_sxm", concurrency=c) for c in (2, 4)], builtin_terms(), TINY)
    mine = "".join(f"{LLAMA},h200_sxm,vllm,1,128,16,{r.concurrency},{r.ttft_ms},{r.tpot_ms}\n" for r in own)
    (tmp_path / "runs.csv").write_text(f"{HEADER}\n{fast}{mine}")
    r = kvsim("validate", "--serving-bench", "runs.csv", "--requests-per-client", "2", "--out", "val", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "val" / "serving_validation.json").read_text())
    g = f"{LLAMA}/h100_sxm/vllm"
    assert list(doc["faster_than_kernels"]) == [g]
    u = doc["score"]["overall_unflagged"]
    assert u["set_aside"] == [g] and u["rows"] == 2 and doc["score"]["overall"]["rows"] == 4
    assert u["ttft"] == doc["score"]["groups"][f"{LLAMA}/h200_sxm/vllm"]["ttft"]
    assert "ALL but the 1 group flagged whole" in r.stdout


def test_cli_says_which_groups_ttft_waits_for_completions(tmp_path):
    # Two runs of one group whose TTFT is one completion gap (request cycle / 4) at both output lengths.
    stdout, doc, html, warned = validate_then_calibrate(
        tmp_path, f"{LLAMA},h100_sxm,vllm,1,128,16,4,25.0,5.0\n{LLAMA},h100_sxm,vllm,1,128,64,4,105.0,5.0\n"
    )
    assert f"note: {LLAMA}/h100_sxm/vllm: at concurrency 4" in stdout
    assert doc["ttft_follows_completions"] == {f"{LLAMA}/h100_sxm/vllm": [4]}
    assert "TTFT follows completions at c 4" in html
    assert "calibrate warning" in warned and "wait for another one to finish" in warned
    assert "--hold-back-flagged simulates one request waiting" in warned and doc["held_back"] == {}
    # Held back: both runs simulated with 3 of the 4 requests running, said in the note and the JSON.
    said, held, held_html = validate_with(tmp_path, "--hold-back-flagged")
    assert held["held_back"] == {f"{LLAMA}/h100_sxm/vllm": [4]}
    assert [x["max_num_seqs"] for x in held["results"]] == [3, 3]
    assert [x["max_num_seqs"] for x in doc["results"]] == [None, None]
    assert all(h["sim_ttft_ms"] > d["sim_ttft_ms"] for h, d in zip(held["results"], doc["results"]))
    assert "simulated with concurrency - 1 requests running" in said
    assert "simulated with c - 1 running at c 4" in held_html
    assert "simulated with c - 1" not in html


def test_cli_says_which_groups_clients_did_not_start_together(tmp_path):
    # The file names no aiconfigurator-core run: its clients are simulated apart from the start, and
    # the note says so rather than offering the treatment.
    stdout, doc, html, warned = validate_then_calibrate(tmp_path, csv_lines(apart_runs(1.0)))
    g = f"{LLAMA}/h100_sxm/trtllm"
    assert f"note: {g}: at concurrency 4 its TTFT grows by" in stdout
    assert list(doc["clients_apart"]) == [g] and doc["spread"] == [] and doc["clients_apart"][g]["simulated_apart"]
    assert [x["start_spread_cycles"] for x in doc["results"]] == [APART_SPREAD_CYCLES] * 4
    assert "simulated with their starts spread over a request cycle (--clients)" in stdout
    assert "clients not started together" in html and "clients simulated apart" in html
    assert (
        "calibrate warning" in warned and "(--clients)" in warned and "4 of 4 rows of runs.csv: clients apart" in warned
    )
    # In step (--clients together), the note offers --spread-flagged, which spreads them again.
    said, together, together_html = validate_with(tmp_path, "--clients", "together")
    assert "--spread-flagged spreads them" in said and not together["clients_apart"][g]["simulated_apart"]
    assert "clients simulated apart" not in together_html
    assert [x["start_spread_cycles"] for x in together["results"]] == [0.0] * 4
    said, spread, spread_html = validate_with(tmp_path, "--clients", "together", "--spread-flagged")
    assert spread["spread"] == [g]
    assert [x["start_spread_cycles"] for x in spread["results"]] == [APART_SPREAD_CYCLES] * 4
    assert "simulated with their starts spread over a request cycle (--spread-flagged)" in said
    assert "simulated with their starts spread" in spread_html and "clients simulated apart" not in spread_html


def test_cli_json_results_take_their_weights_and_kv_cache_from_the_command_line(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps(vllm_result()))
    args = ["--gpu", "h100_sxm", "--tp", "1", "--requests-per-client", "2"]
    r = kvsim(
        "validate", "--serving-bench", "run.json", *args, "--weights", "fp8", "--kv", "fp8", "--out", "v", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    (res,) = json.loads((tmp_path / "v" / "serving_validation.json").read_text())["results"]
    assert (res["weights"], res["kv"], res["error"]) == ("fp8", "fp8", None)
    r = kvsim("validate", "--serving-bench", "run.json", *args, "--kv", "int4", "--out", "w", cwd=tmp_path)
    assert r.returncode == 2 and "kv: got 'int4'" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # The KV capacity the server logged: two of the four 576-token clients fit, the others wait.
    r = kvsim("validate", "--serving-bench", "run.json", *args, "--kv-cache-tokens", "1200", "--out", "k", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (pinned,) = json.loads((tmp_path / "k" / "serving_validation.json").read_text())["results"]
    (free,) = json.loads((tmp_path / "v" / "serving_validation.json").read_text())["results"]
    assert pinned["kv_cache_tokens"] == 1200 and free["kv_cache_tokens"] is None
    assert pinned["sim_ttft_ms"] > 3 * free["sim_ttft_ms"]
    for cmd in (["validate", "--serving-bench"], ["calibrate", "--from-serving-bench"]):
        r = kvsim(
            *cmd, "run.json", "--gpu", "h100_sxm", "--tp", "1", "--kv-cache-tokens", "100", "--out", "x", cwd=tmp_path
        )
        assert r.returncode == 2 and "kv_cache_tokens: got 100; at least isl + osl = 576" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize(
    "args,match",
    [
        (
            ["validate", "--serving-bench", "bad.csv", "--out", "v"],
            "bad.csv: got '1 row, none that kvsim can simulate'; at least one; row 2, ttft_ms: got '-3'",
        ),
        (
            ["calibrate", "--from-serving-bench", "bad.csv", "--out", "t.json"],
            "bad.csv: got '1 row, none that kvsim can simulate'; at least one; row 2, ttft_ms: got '-3'",
        ),
        (["validate", "--serving-bench", "good.csv", "--engine", "trtllm", "--out", "v"], "--engine: got 'trtllm'"),
        (["calibrate", "--from-serving-bench", "good.csv", "--out", "."], "--out: got '.'"),
        (["validate", "--serving-bench", "good.csv", "--terms", "good.csv", "--out", "v"], "engine.terms_file"),
        (["validate", "--serving-bench", "run.json", "--out", "v"], "--gpu: got None"),
        (["validate", "--serving-bench", "good.csv", "--clients", "drift", "--out", "v"], "--clients: got 'drift'"),
        (["calibrate", "--from-serving-bench", "good.csv", "--clients", "drift", "--out", "t.json"], "--clients"),
        (
            ["validate", "--serving-bench", "good.csv", "--logo", "--exclude-group", "llama/h100", "--out", "v"],
            f"--exclude-group: got 'llama/h100'; 'suspect' or a group of the file (model/gpu/engine): {LLAMA}/h100_sxm/vllm",
        ),
        (
            ["calibrate", "--from-serving-bench", "good.csv", "--exclude-group", "x", "--out", "t.json"],
            "--exclude-group: got 'x'",
        ),
        (
            ["validate", "--serving-bench", "good.csv", "--logo", "--own-fit", "--out", "v"],
            "--own-fit: got True; either --logo (each group predicted by the others) or --own-fit (by itself), not both",
        ),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, args, match):
    (tmp_path / "bad.csv").write_text(f"{HEADER}\n{LLAMA},h100_sxm,vllm,1,128,16,2,-3,7\n")
    (tmp_path / "good.csv").write_text(f"{HEADER}\n{GOOD}\n")
    (tmp_path / "run.json").write_text(json.dumps(vllm_result()))
    r = kvsim(*args, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: ") and match in r.stderr, r.stderr
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "v").exists()


def test_a_row_without_weights_takes_its_checkpoints(tmp_path):
    """``weights`` left empty: the checkpoint's as its config declares them (block-scaled fp8 for
    Qwen3-32B-FP8, MXFP4 experts for gpt-oss), bf16 for a catalog model; a vLLM result JSON without ``--weights``
    reads the same way."""
    p = tmp_path / "bench.csv"
    p.write_text(
        f"{HEADER},weights\n"
        + GOOD.replace(LLAMA, "Qwen/Qwen3-32B-FP8")
        + ",\n"
        + GOOD.replace(LLAMA, "openai/gpt-oss-20b")
        + ",\n"
        + GOOD
        + ",\n"
        + GOOD.replace(LLAMA, "Qwen/Qwen3-32B-FP8")
        + ",bf16\n"
    )
    assert [r.weights for r in read_csv(p)] == ["fp8_block", "mxfp4", "bf16", "bf16"]


def test_fewer_runs_than_terms_are_said_per_engine():
    """A fit on fewer runs than an engine's terms is said; the groups left out of training do not count."""
    vllm = [row(concurrency=c) for c in (2, 4)]
    trt = [row(engine="trtllm", concurrency=c) for c in (1, 2, 4, 8, 16, 32)]
    (line,) = few_runs_lines(vllm + trt, (), prior=False)
    assert line.startswith("vllm: 2 runs (4 measured means) for 6 terms: too few") and "--prior keeps" in line
    (line,) = few_runs_lines([vllm[0]] + trt, (), prior=True)
    assert line.startswith("vllm: 1 run (2 measured means)") and "the pull towards the preset (--prior)" in line
    assert few_runs_lines(trt, (), prior=False) == []
    (line,) = few_runs_lines(trt[:5], (), prior=False)
    assert line.startswith("trtllm: 5 runs")
    # Two more runs of another group, held out: the engine still has five to fit on.
    held = [row(engine="trtllm", gpu="h200_sxm", concurrency=c) for c in (1, 2)]
    (line,) = few_runs_lines(trt[:5] + held, (f"{LLAMA}/h200_sxm/trtllm",), prior=False)
    assert line.startswith("trtllm: 5 runs")


def test_cli_says_what_kv_the_runs_server_held(tmp_path):
    stdout, doc, html, warned = validate_then_calibrate(tmp_path, csv_lines(kv_bound_runs(80_000)))
    key = f"{LLAMA}/h100_sxm/trtllm tp1 bf16"
    assert list(doc["kv_capacity"]) == [key] and doc["kv_capacity"][key]["waits_from"] == 64 * 1536
    assert f"note: {key}: runs whose TTFT grows with the output length" in stdout
    assert "wait for KV" in warned and "kv_cache_tokens" in warned
    assert f"waits for KV from {64 * 1536:,} tokens at tp1" in html


def test_kv_from_runs_simulates_the_capacity_the_runs_imply(tmp_path):
    runs = kv_bound_runs(80_000)
    evidence = kv_capacity_evidence(runs)
    key = f"{LLAMA}/h100_sxm/trtllm tp1 bf16"
    treated, used = kv_from_runs(runs, evidence)
    middle = (32 * 2048 + 64 * 1536) // 2
    assert used == {key: middle} and all(r.kv_cache_tokens == middle for r in treated)
    # A row that says its capacity keeps it; a deployment with no lower bound is left as it is.
    mine = replace(runs[0], kv_cache_tokens=70_000)
    assert kv_from_runs([mine], evidence)[0] == [mine]
    no_floor = {key: {**evidence[key], "holds_up_to": None}}
    assert kv_from_runs(runs, no_floor) == (runs, {})
    # Through the CLI: the waiting runs, made with 80,000 tokens, come back close to their TTFT.
    (tmp_path / "runs.csv").write_text(f"{HEADER}\n{csv_lines(runs)}")
    docs = {}
    for flag in ([], ["--kv-from-runs"]):
        r = kvsim(
            "validate",
            "--serving-bench",
            "runs.csv",
            "--requests-per-client",
            "2",
            "--clients",
            "together",  # as kvsim made the runs
            *flag,
            "--out",
            "v",
            cwd=tmp_path,
        )
        assert r.returncode == 0, r.stderr
        docs[bool(flag)] = json.loads((tmp_path / "v" / "serving_validation.json").read_text())
    assert docs[False]["kv_from_runs"] == {} and docs[True]["kv_from_runs"] == {key: middle}
    assert "simulated with 81,920 tokens (--kv-from-runs)" in " ".join(r.stdout.split())

    def waiting_errors(doc):
        return [abs(x["ttft_rel_err"]) for x in doc["results"] if x["concurrency"] * (1024 + x["osl"]) > 80_000]

    before, after = waiting_errors(docs[False]), waiting_errors(docs[True])
    assert len(before) == 4 and all(a < b for a, b in zip(after, before)), (before, after)
    assert sum(after) < 0.35 * sum(before), (before, after)


def test_a_config_json_in_the_model_column_that_is_missing_or_unreadable_names_the_row(tmp_path):
    (tmp_path / "broken_config.json").write_text('{"model_type": "llama", "hidden_size": 4096}')
    p = tmp_path / "hf.csv"
    p.write_text(
        f"{HEADER},weights\nmissing_config.json,h100_sxm,vllm,1,128,16,2,20.5,7.25,bf16\n"
        "broken_config.json,h100_sxm,vllm,1,128,16,2,20.5,7.25,bf16\n"
        f"{GOOD},bf16\n"
    )
    problems: list[str] = []
    (r,) = read_bench(p, problems)
    assert problems[0] == (
        f"{p}: row 2, model: got 'missing_config.json'; a config.json file that exists (relative paths from {tmp_path})"
    )
    assert problems[1].startswith(f"{p}: row 3, model: got 'broken_config.json'; model.hf_config: a decoder-only")


def test_rows_no_terms_can_simulate_are_said_and_left_out_before_any_fit(tmp_path):
    """A 70B model on one L40S does not fit: said with its file and row, and not fitted on (a fit
    would score it as a failure at every step and dilute the other rows' errors)."""
    p = tmp_path / "runs.csv"
    p.write_text(f"{HEADER}\n{GOOD}\nmeta-llama/Llama-3.1-70B-Instruct,l40s,vllm,1,1024,128,4,50,8\n")
    problems: list[str] = []
    (r,) = selected_rows(str(p), None, None, None, problems=problems)
    assert r.model == LLAMA
    (line,) = problems
    assert line.startswith(f"{p}: row 3: gpu: got 'L40S x TP1'; KV capacity per replica is -")
    p.write_text(f"{HEADER}\nmeta-llama/Llama-3.1-70B-Instruct,l40s,vllm,1,1024,128,4,50,8\n")
    with pytest.raises(
        ConfigError, match=r"runs.csv: got '1 row, none that kvsim can simulate'; at least one; row 2: gpu"
    ):
        selected_rows(str(p), None, None, None, problems=[])


def test_runs_longer_than_the_models_context_are_left_out_as_vllm_refuses_them(tmp_path):
    p = tmp_path / "runs.csv"
    p.write_text(
        f"{HEADER}\nQwen/Qwen3-8B,h100_sxm,vllm,1,200000,128,4,50,8\nQwen/Qwen3-8B,h100_sxm,vllm,1,1024,128,4,50,8\n"
    )
    skipped: list[str] = []
    rows = selected_rows(str(p), None, None, None, problems=skipped)
    assert [(r.isl, r.osl) for r in rows] == [(1024, 128)]
    (line,) = skipped
    assert "row 2: workload.max_model_len: got 200128; at most 40960: the context of Qwen/Qwen3-8B" in line
