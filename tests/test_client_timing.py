"""TTFT's dependence on how a benchmark's clients are timed (``validate --client-timing``)."""

from __future__ import annotations

import json
from dataclasses import replace

from _serving_helpers import kvsim
from calibration.client_timing import CLIENT_TIMINGS, client_timing, timing_header, timing_rows
from calibration.served_by import aiconfigurator_server
from calibration.serving_bench import TRAINING_FILE, read_bench
from calibration.serving_fit import builtin_terms, evaluate
from calibration.serving_runs import Clients, score

CLIENTS = Clients(requests_per_client=4)


def _qwen3_trt(*concurrencies: int):
    """Qwen3-32B / TensorRT-LLM runs of the shipped file on 2 GPUs, 1024/128, as they were served."""
    rows = [
        r
        for r in read_bench(TRAINING_FILE)
        if r.engine == "trtllm"
        and r.model == "Qwen/Qwen3-32B"
        and (r.tp, r.isl, r.osl) == (2, 1024, 128)
        and r.concurrency in concurrencies
    ]
    assert sorted(r.concurrency for r in rows) == sorted(concurrencies)
    return [aiconfigurator_server(r) for r in rows]


def test_clients_that_never_meet_wait_less_and_jitter_moves_ttft():
    rows = _qwen3_trt(8, 64)
    terms = builtin_terms()
    base = evaluate(rows, terms, CLIENTS)
    doc = client_timing(rows, base, terms, CLIENTS)
    assert list(doc) == [t.name for t in CLIENT_TIMINGS]
    spread = doc["spread over a cycle"]
    # Started together, prompts of fixed length queue behind each other's prefills; spread over a
    # request cycle they rarely meet, so every run's TTFT falls.
    assert spread["overall"]["ttft_moved_median"] < -0.2
    assert spread["start_spread_cycles"] == 1.0 and spread["client_cv"] is None
    # TensorRT-LLM's preset jitters each request's client time (cv 1.2): without it TTFT moves.
    assert doc["together, no jitter"]["overall"]["ttft_moved_p90_abs"] > 0.001
    group = "Qwen/Qwen3-32B/h100_sxm/trtllm"
    for v in doc.values():
        assert list(v["groups"]) == [group]
        assert v["groups"][group]["ttft"]["n"] == 2 and v["groups"][group]["tpot"]["n"] == 2
        assert v["overall"]["failed"] == 0
    # The table: one row per group and one for all, a column per timing after "as simulated".
    header = timing_header(doc)
    table = timing_rows(doc, score(base))
    assert header[:2] == ["group", "as simulated"] and len(header) == 2 + len(CLIENT_TIMINGS)
    assert [r[0] for r in table] == [group, "all"] and all(len(r) == len(header) for r in table)


def test_a_rows_own_start_spread_is_replaced_by_each_timing():
    (row,) = _qwen3_trt(8)
    spread_row = replace(row, start_spread_cycles=1.0)
    terms = builtin_terms()
    base = evaluate([spread_row], terms, CLIENTS)
    doc = client_timing([spread_row], base, terms, CLIENTS)
    # The row's clients were spread; in step they queue again.
    assert doc["together, no jitter"]["overall"]["ttft_moved_median"] > 0.2
    assert abs(doc["spread over a cycle"]["overall"]["ttft_moved_median"]) < 0.05


def _small_csv(tmp_path):
    header = "model,gpu,engine,engine_version,weights,isl,osl,concurrency,tp,ttft_ms,tpot_ms,source_id"
    lines = [header]
    for line in TRAINING_FILE.read_text().splitlines():
        if ",trtllm," in line and "_agg_1024x128_c8_tp2_" in line and line.startswith("Qwen/Qwen3-32B,"):
            lines.append(line)
    assert len(lines) == 2
    (tmp_path / "runs.csv").write_text("\n".join(lines) + "\n")


def test_cli_validate_client_timing_prints_and_writes_it(tmp_path):
    _small_csv(tmp_path)
    args = ["validate", "--serving-bench", "runs.csv", "--requests-per-client", "3"]
    r = kvsim(*args, "--client-timing", "--out", "ct", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "ct" / "serving_validation.json").read_text())
    assert list(doc["client_timing"]) == [t.name for t in CLIENT_TIMINGS]
    said = " ".join(r.stdout.split())
    assert "TTFT and the clients' timing" in said and "spread over a cycle" in said
    # The HTML report gains a panel of bars, one per timing.
    html = (tmp_path / "ct" / "serving_validation.html").read_text()
    assert "with the clients timed otherwise" in html and html.count('"clients spread over a cycle"') == 1
    # Without the flag the runs are simulated once and the key is empty.
    r = kvsim(*args, "--out", "plain", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "plain" / "serving_validation.json").read_text())["client_timing"] is None
    assert "clients' timing" not in r.stdout
    assert "with the clients timed otherwise" not in (tmp_path / "plain" / "serving_validation.html").read_text()


def test_cli_client_timing_with_a_fit_is_one_line_error(tmp_path):
    _small_csv(tmp_path)
    r = kvsim("validate", "--serving-bench", "runs.csv", "--client-timing", "--logo", "--out", "v", cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: --client-timing"), r.stderr
    assert "not with --logo or --own-fit" in r.stderr and not (tmp_path / "v").exists()
