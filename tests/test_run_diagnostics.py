"""The heavy-preemption warning: the rule on summaries at its thresholds, and ``kvsim run`` printing it."""

import re
import subprocess
import sys

import pytest

from sim.config import Scenario
from sim.output.diagnostics import (
    PREEMPTIONS_PER_COMPLETED,
    RECOMPUTED_PER_SERVED_PROMPT,
    heavy_preemption,
    preemption_load,
    preemption_warning,
)

# A prompt of 16,000 tokens on a KV cache of about 26,000: one fits at a time, so every request
# admitted beside it is preempted by its own next prefill chunk.
THRASH = (
    "workload.lengths.kind=fixed",
    "workload.lengths.prompt_tokens=16000",
    "workload.lengths.output_tokens=384",
    "workload.arrival.rate=2",
    "workload.num_requests=30",
    "gpu.gpu_memory_utilization=0.25",
)


def summary(completed=10, preemptions=0, recomputed=0, prompt=10_000, output=1_000, makespan=100.0):
    """A summary as summarize() writes it, with ``prompt`` + ``output`` tokens served in ``makespan`` s."""
    return {
        "completed": completed,
        "preemptions": preemptions,
        "recomputed_tokens": recomputed,
        "makespan_s": makespan,
        "throughput_tokens_per_s": (prompt + output) / makespan,
        "output_tokens_per_s": output / makespan,
        "kv_capacity_bytes_per_replica": 26_480 * 131_072,
        "kv_bytes_per_token": 131_072,
    }


def test_served_prompt_tokens_and_capacity_come_from_the_summary():
    load = preemption_load(summary(prompt=480_000, output=11_520, makespan=1214.86, recomputed=45_381_057))
    assert load is not None
    assert load.served_prompt_tokens == 480_000 and load.capacity_tokens == 26_480
    assert load.recomputed_share == pytest.approx(45_381_057 / (45_381_057 + 480_000))


def test_preemptions_threshold():
    at = int(PREEMPTIONS_PER_COMPLETED * 10)
    assert not heavy_preemption(summary(completed=10, preemptions=at))
    assert preemption_warning(summary(completed=10, preemptions=at)) is None
    assert heavy_preemption(summary(completed=10, preemptions=at + 1))
    # Nothing completed: any preemption is more than the completed requests.
    assert heavy_preemption(summary(completed=0, preemptions=1, prompt=0, output=0))
    assert not heavy_preemption(summary(completed=0, preemptions=0, prompt=0, output=0))


def test_recompute_threshold():
    at = int(RECOMPUTED_PER_SERVED_PROMPT * 10_000)
    assert not heavy_preemption(summary(recomputed=at))
    assert heavy_preemption(summary(recomputed=at + 1))


def test_a_summary_without_the_fields_gives_no_warning():
    assert preemption_load({}) is None
    assert not heavy_preemption({"completed": 3})
    assert preemption_warning({"makespan_s": 1.0}) is None


def test_warning_states_numbers_cause_and_remedies_that_exist():
    s = summary(completed=30, preemptions=5539, recomputed=45_381_057, prompt=480_000, output=11_520, makespan=1214.86)
    sc = Scenario()
    text = preemption_warning(s, longest_prompt_tokens=16_000, scenario=sc)
    assert text is not None and "\n" not in text
    assert "5,539 preemptions for 30 completed requests (184.6 per request)" in text
    assert "99.0% of all prefill work" in text
    assert "longest prompt (16,000 tokens) is 60% of the KV capacity (26,480 tokens per replica)" in text
    assert "room for 1 such prompt at a time" in text
    assert f"{sc.gpu.gpu_memory_utilization:g} now" in text
    # Every knob named is a key of the scenario.
    knobs = set(re.findall(r"\b(gpu|scheduler|allocator)\.([a-z_.]+[a-z])", text))
    assert {f"{a}.{b}" for a, b in knobs} >= {
        "gpu.gpu_memory_utilization",
        "gpu.tensor_parallel",
        "scheduler.max_num_seqs",
        "scheduler.max_num_batched_tokens",
        "scheduler.reserve_output",
        "allocator.preemption.mode",
    }
    for section, path in knobs:
        node = getattr(sc, section)
        for part in path.split("."):
            assert part in type(node).model_fields, f"{section}.{path}"
            node = getattr(node, part)
    # Without the run's scenario or prompts: the knobs, no current values, no cause from the prompt.
    bare = preemption_warning(s)
    assert bare is not None and "now" not in bare and "longest prompt" not in bare
    assert "scheduler.max_num_seqs" in bare and "26,480 tokens per replica" in bare


def test_swap_already_on_is_not_suggested():
    sc = Scenario.model_validate({"allocator": {"preemption": {"mode": "swap"}}})
    text = preemption_warning(summary(preemptions=50), scenario=sc)
    assert text is not None and "preemption.mode=swap" not in text


def test_knobs_already_at_their_floor_are_not_suggested():
    # A fuzzed run at max_num_seqs 1 and a 16-token budget was told to lower both.
    sc = Scenario.model_validate({"scheduler": {"max_num_seqs": 1, "max_num_batched_tokens": 16}})
    text = preemption_warning(summary(preemptions=50), scenario=sc)
    assert text is not None and "max_num_seqs" not in text and "max_num_batched_tokens" not in text
    roomy = Scenario.model_validate({"scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 8192}})
    text = preemption_warning(summary(preemptions=50), scenario=roomy)
    assert "scheduler.max_num_seqs, 8 now" in text and "scheduler.max_num_batched_tokens, 8192 now" in text


def kvsim(*args):
    return subprocess.run([sys.executable, "-m", "sim.cli", *args], capture_output=True, text=True, timeout=120)


def test_run_warns_on_a_thrashing_run(tmp_path):
    args = [a for kv in THRASH for a in ("--set", kv)]
    r = kvsim("run", "chat-api", *args, "-q", "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: heavy preemption")]
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert "per request" in line and "of all prefill work" in line
    assert "longest prompt (16,000 tokens)" in line and "room for 1 such prompt" in line
    assert "gpu.gpu_memory_utilization, 0.25 now" in line and "scheduler.max_num_seqs" in line


def test_the_warning_names_the_knobs_as_the_engine_filled_them(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sim.cli.main import warn_preemption
    from sim.engine.deployment import with_engine_defaults

    # No scheduler key set: the vLLM preset fills max_num_seqs (1,024 on an H100), which the warning
    # must quote rather than the scenario's unset default.
    sc = Scenario.model_validate({"model": {"name": "llama-3.1-8b"}, "gpu": {"name": "H100-SXM-80GB"}})
    ran = with_engine_defaults(sc).scheduler
    assert sc.scheduler.max_num_seqs != ran.max_num_seqs
    pq.write_table(pa.table({"status": ["completed"], "prompt_tokens": [16_000]}), tmp_path / "requests.parquet")
    warn_preemption(summary(completed=30, preemptions=5539), sc, tmp_path)
    line = capsys.readouterr().err
    assert line.startswith("warning: heavy preemption") and f"scheduler.max_num_seqs, {ran.max_num_seqs} now" in line


def test_with_a_static_fallback_the_cause_is_the_fallback_region():
    s = summary(completed=30, preemptions=500, recomputed=45_381_057, prompt=480_000)
    sc = Scenario.model_validate(
        {"allocator": {"kind": "static", "reserve": 2048, "overflow": "fallback", "fallback_fraction": 0.1}}
    )
    text = preemption_warning(s, longest_prompt_tokens=2_000, scenario=sc)
    assert text is not None
    # 2,000 tokens are 8% of the 26,480-token capacity but 75% of its 2,648-token fallback region.
    assert "is 76% of the fallback region that holds requests beyond their reservation (2,648 tokens" in text, text
    assert "room for 1 such prompt" in text and "allocator.fallback_fraction, 0.1 now" in text
    assert "down to" not in text  # fewer sequences would not help the reservations beside it


def test_run_is_quiet_on_the_default_scenario(tmp_path):
    r = kvsim("run", "chat-api", "-q", "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    assert "preemption" not in r.stderr, r.stderr
