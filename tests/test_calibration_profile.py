"""Profile format, loading, ProfileCostModel contract and error messages."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from calibration.tables import DEFAULT_TABLES_DIR, load_kernel_tables, read_gemm
from sim.catalog import get_gpu, get_model, with_overrides
from sim.cost.model import BatchShape, Layout
from sim.cost.profile import PROFILE_DIR, Profile, list_profiles, load_profile
from sim.cost.profile_model import ProfileCostModel, build_profile_cost_model
from sim.errors import ConfigError

H100 = get_gpu("H100-SXM-80GB")
L8B = get_model("llama-3.1-8b")


@pytest.fixture(scope="module")
def h100():
    return load_profile("h100-sxm")


@pytest.mark.parametrize("name", ["h100-sxm", "h200-sxm", "a100-sxm"])
@pytest.mark.parametrize("model,tp", [("llama-3.1-8b", 1), ("llama-2-7b", 1), ("llama-2-70b", 4), ("llama-3.1-70b", 8)])
def test_builtins_cover_models(name, model, tp):
    cm = build_profile_cost_model(name, get_model(model), H100, tensor_parallel=tp)
    assert cm.name == name and cm.calibrated
    t = cm.decode_times_s(32, np.array([32 * 2048.0]))
    assert np.isfinite(t).all() and t[0] > 0


@pytest.mark.parametrize("name", ["h100-sxm", "h200-sxm"])
def test_fp8_offered_on_hopper(name):
    bf = build_profile_cost_model(name, L8B, H100, weight_dtype="bf16", kv_dtype="bf16")
    f8 = build_profile_cost_model(name, L8B, H100, weight_dtype="fp8", kv_dtype="fp8")
    kv = np.array([64 * 8192.0])
    assert f8.decode_times_s(64, kv)[0] < bf.decode_times_s(64, kv)[0]


def test_builtin_sizes_small():
    for p in PROFILE_DIR.glob("*.json"):
        assert p.stat().st_size < 2_000_000


def test_round_trip(tmp_path, h100):
    path = h100.write(tmp_path / "p.json")
    again = load_profile(path)
    a = ProfileCostModel(h100, L8B, H100, tensor_parallel=2)
    b = ProfileCostModel(again, L8B, H100, tensor_parallel=2)
    kv = np.linspace(10, 2e6, 57)
    assert np.array_equal(a.decode_times_s(48, kv), b.decode_times_s(48, kv))
    batch = BatchShape(prefill_chunks=[(512, 0), (128, 3000)], decode_seqs=7, decode_kv_tokens=9000)
    assert a.mixed_step_time_s(batch) == b.mixed_step_time_s(batch)


def test_per_seq_delta_departs_from_the_line_between_measured_counts(h100):
    """``cpu_overhead``'s ``per_seq_delta_s`` adds its interpolated departure to the step at counts
    within its measured ones, in decode (scalar, window and array paths) and mixed iterations alike,
    and nothing beyond them; a malformed table is refused naming the field."""
    import copy

    plain = ProfileCostModel(h100, L8B, H100)
    prof = copy.deepcopy(h100)
    prof.cpu_overhead["by_tp"]["1"]["per_seq_delta_s"] = {"seqs": [2, 4], "delta_s": [1e-3, 3e-3]}
    cm = ProfileCostModel(prof, L8B, H100)
    for n, want in ((1, 0.0), (2, 1e-3), (3, 2e-3), (4, 3e-3), (5, 0.0), (40, 0.0)):
        kv = np.array([300.0 * n, 301.0 * n])
        assert cm.decode_times_s(n, kv) - plain.decode_times_s(n, kv) == pytest.approx([want, want], abs=1e-12)
        long = np.arange(80, dtype=np.float64) * n + 100 * n  # the array path
        assert np.allclose(cm.decode_times_s(n, long) - plain.decode_times_s(n, long), want, rtol=0, atol=1e-12)
        assert cm.decode_window_times(n, 100 * n, 3)[2] - plain.decode_window_times(n, 100 * n, 3)[2] == pytest.approx(
            want, abs=1e-12
        )
    mixed = BatchShape(prefill_chunks=[(64, 0)], decode_seqs=2, decode_kv_tokens=500)  # three sequences
    assert cm.mixed_step_time_s(mixed) - plain.mixed_step_time_s(mixed) == pytest.approx(2e-3, abs=1e-12)
    for bad in (
        {"seqs": [4, 2], "delta_s": [0.0, 0.0]},
        {"seqs": [2], "delta_s": [0.0, 1.0]},
        {"seqs": [0], "delta_s": [0.0]},
        [1, 2],
        {"seqs": [2], "delta_s": [2.0]},
    ):
        prof.cpu_overhead["by_tp"]["1"]["per_seq_delta_s"] = bad
        with pytest.raises(ConfigError, match="per_seq_delta_s"):
            ProfileCostModel(prof, L8B, H100)


def test_decode_times_match_step_time_and_are_elementwise(h100):
    cm = ProfileCostModel(h100, L8B, H100)
    kv = np.array([100.0, 5_000.0, 70_000.0, 3e6, 4e7])
    many = cm.decode_times_s(37, kv)
    for i, s in enumerate(kv):
        single = cm.step_time_s(BatchShape(decode_seqs=37, decode_kv_tokens=int(s)))
        assert single == pytest.approx(many[i], rel=1e-12)
        assert cm.decode_times_s(37, kv[i : i + 1])[0] == many[i]
        assert cm.decode_times_s(37, kv[::-1])[len(kv) - 1 - i] == many[i]
    assert np.all(np.diff(many) > 0)  # more KV never costs less


def test_contiguous_layout_cheaper_than_paged(h100):
    paged = ProfileCostModel(h100, L8B, H100, layout=Layout(paged=True, block_size=16))
    contig = ProfileCostModel(h100, L8B, H100, layout=Layout(paged=False))
    kv = np.array([64 * 4096.0])
    assert contig.decode_times_s(64, kv)[0] < paged.decode_times_s(64, kv)[0]


def test_out_of_range_is_counted(h100):
    cm = ProfileCostModel(h100, L8B, H100)
    cm.decode_times_s(8, np.array([8 * 1000.0]))
    assert "generation_attention" not in cm.out_of_range
    cm.decode_times_s(8, np.array([8 * 500_000.0, 8 * 600_000.0]))  # beyond 131072 tokens per sequence
    assert cm.out_of_range["generation_attention"] == 2
    cm.step_time_s(BatchShape(prefill_chunks=[(65536, 0)]))  # beyond the 32768-token GEMM grid
    assert cm.out_of_range["gemm_qkv"] >= 1


def test_memory_ops(h100):
    cm = ProfileCostModel(h100, L8B, H100)
    assert cm.copy_time_s(0) == 0 and cm.alloc_time_s(0) == 0
    assert cm.copy_time_s(1 << 30) > cm.zero_fill_time_s(1 << 30) > 0
    assert cm.host_transfer_time_s(1 << 30) > cm.copy_time_s(1 << 30)
    assert cm.alloc_time_s(10) == pytest.approx(10 * cm.alloc_time_s(1))


def test_tp_adds_allreduce(h100):
    t1 = ProfileCostModel(h100, get_model("llama-3.1-70b"), H100, tensor_parallel=8)
    assert t1.decode_times_s(16, np.array([16 * 1024.0]))[0] > 0
    with pytest.raises(ConfigError, match="tensor_parallel"):
        ProfileCostModel(h100, L8B, H100, tensor_parallel=16)


def test_qk_norm_adds_two_elementwise_kernels_per_layer(h100):
    qwen = get_model("qwen3-32b")
    assert qwen.qk_norm
    on = ProfileCostModel(h100, qwen, H100, tensor_parallel=8)
    off = ProfileCostModel(h100, with_overrides(qwen, qk_norm=False), H100, tensor_parallel=8)
    kernel = h100.elementwise["latency_s"]
    dt = on.decode_times_s(8, np.array([8 * 1024.0]))[0] - off.decode_times_s(8, np.array([8 * 1024.0]))[0]
    # 64 layers x 2 launches, plus reading and writing 8 tokens' q and k heads (a few ns).
    assert 64 * 2 * kernel <= dt < 64 * 2 * kernel * 1.05


def test_allreduce_envelope_drops_outliers_and_strategy_switches():
    from calibration.tables import LATENCY_BOUND_BYTES, NcclTable, allreduce_envelope

    big = 4.0 * LATENCY_BOUND_BYTES
    sizes = [1e3, 2e3, 4e3, 8e3, big]
    t = NcclTable(
        num_gpus=np.array([2] * 5 + [4] * 5 + [8] * 5),
        nbytes=np.array(sizes * 3),
        # 2 GPUs: an isolated slow point; 4 GPUs: a plateau above the 8-GPU rows at the larger
        # latency-bound sizes, and a bandwidth-bound message slower than on 8 GPUs (kept).
        latency_s=np.array([3, 9, 3.4, 4, 20, 3.2, 3.5, 11, 11, 40, 3.5, 4.0, 5.0, 7.0, 30]) * 1e-6,
        source="test",
        version="",
    )
    e = allreduce_envelope(t)
    got = {(int(g), float(b)): round(v * 1e6, 3) for g, b, v in zip(e.num_gpus, e.nbytes, e.latency_s)}
    assert [got[2, b] for b in sizes] == [3, 3.4, 3.4, 4, 20]
    assert [got[4, b] for b in sizes] == [3.2, 3.5, 5, 7, 40]
    assert [got[8, b] for b in sizes] == [3.5, 4, 5, 7, 30]  # the largest count keeps its own rows
    assert np.all(e.latency_s <= t.latency_s)


@pytest.mark.parametrize("name", ["h100-sxm", "h200-sxm"])
def test_engine_allreduce_never_slower_for_smaller_messages_or_fewer_gpus(name):
    from calibration.tables import LATENCY_BOUND_BYTES

    p = load_profile(name)
    assert set(p.custom_allreduce) == {"vllm", "sglang", "trtllm"}
    for engine, curves in p.custom_allreduce.items():
        grid = np.geomspace(256, 4 << 20, 40)
        by_tp = {int(tp): np.array([c.at(b)[0] for b in grid]) for tp, c in curves.items()}
        for tp, lat in by_tp.items():
            assert np.all(np.diff(lat) >= -1e-9), (engine, tp)
            bigger = [g for g in by_tp if g > tp]
            if bigger:
                small = grid <= LATENCY_BOUND_BYTES
                assert np.all(lat[small] <= by_tp[min(bigger)][small] + 1e-9), (engine, tp)
    # TensorRT-LLM's 4-GPU rows between 64 and 256 KiB measured an NCCL-like 11 us where its 8-GPU
    # rows took 5-7 us: as the server runs them, a 40960-element decode message costs what 8 GPUs pay.
    trt = p.custom_allreduce["trtllm"]
    assert trt["4"].at(81920)[0] < 7e-6 < p.allreduce["4"].at(81920)[0]


def test_fp8_excess_is_the_input_quantization_of_tensorrt_llm_tables(h100):
    # TensorRT-LLM's fp8 layers were timed with their input quantization: 7-10 us above bf16
    # where both GEMMs sit at their latency floor; vLLM's and SGLang's fp8 kernels are not.
    assert 5e-6 < h100.fp8_gemm_excess_s("trtllm") < 12e-6
    assert h100.fp8_gemm_excess_s("vllm") < 1e-6
    assert h100.fp8_gemm_excess_s("sglang") < 1e-6
    # The raw table says the same: fp8 minus bf16 at the same small shapes.
    (path,) = (DEFAULT_TABLES_DIR / "h100_sxm" / "gemm" / "trtllm").glob("*/gemm_perf.parquet")
    t = read_gemm(path)
    small = (t.m <= 32) & (t.n <= 8192) & (t.k <= 2048)
    by = {
        d: {(m, n, k): s for m, n, k, s in zip(t.m[sel], t.n[sel], t.k[sel], t.latency_s[sel])}
        for d in ("fp8", "bf16")
        for sel in [small & (t.dtype == d)]
    }
    raw = np.median([by["fp8"][key] - by["bf16"][key] for key in by["fp8"].keys() & by["bf16"].keys()])
    assert abs(raw - h100.fp8_gemm_excess_s("trtllm")) < 2.5e-6, raw


@pytest.mark.parametrize("weights,less", [("fp8", True), ("bf16", False)])
def test_engine_that_fuses_fp8_quantization_prices_fp8_gemms_without_it(h100, weights, less):
    from dataclasses import replace

    from sim.engine_presets import get_preset

    trt = get_preset("trtllm")
    assert trt is not None and trt.fp8_quant_fused
    model = get_model("llama-3.1-70b")
    kw = dict(tensor_parallel=4, weight_dtype=weights)
    fused = ProfileCostModel(h100, model, H100, engine=trt, **kw)
    unfused = ProfileCostModel(h100, model, H100, engine=replace(trt, fp8_quant_fused=False), **kw)
    step = BatchShape([], 4, 4 * 1024)
    saved = unfused.step_time_s(step) - fused.step_time_s(step)
    if not less:
        assert saved == 0.0
        return
    # Four GEMMs per layer, none of them down to its weights' read time at this size.
    assert saved == pytest.approx(4 * model.layers * h100.fp8_gemm_excess_s("trtllm"), rel=0.02)
    # Taking off more than a GEMM takes leaves the time to read its weights once (one byte each).
    fused._gemm_less = 1.0
    fused._tok_cache.clear()
    gemm_s = model.layers * sum(c.at(4)[0] for _, c in unfused._gemm_tok)
    weights_s = (
        model.layers
        * sum(
            int(n) * int(k)
            for n, k in (unfused.keys.gemms()[p].split(":")[0].split("x") for p in ("qkv", "o", "gate_up", "down"))
        )
        / h100.device["hbm_bandwidth"]
    )
    assert fused._tokens_part(4)[0] == pytest.approx(unfused._tokens_part(4)[0] - gemm_s + weights_s, rel=1e-9)


def test_an_eager_iteration_lasts_at_least_the_hosts_launches(h100):
    """``eager_host_per_layer_s``: an iteration that does not replay a CUDA graph cannot end before
    the host has launched every layer's kernels, after its own host time; graph replays are untouched."""
    from dataclasses import replace

    from sim.engine_presets import get_preset

    trt = get_preset("trtllm")
    assert trt is not None and not trt.graph_mixed and trt.graph_max_tokens == 128
    kw = dict(tensor_parallel=8)
    base = ProfileCostModel(h100, L8B, H100, engine=replace(trt, eager_host_per_layer_s=0.0), **kw)
    slow = ProfileCostModel(h100, L8B, H100, engine=replace(trt, eager_host_per_layer_s=1e-3), **kw)
    fast = ProfileCostModel(h100, L8B, H100, engine=replace(trt, eager_host_per_layer_s=1e-7), **kw)
    host = trt.host_s + trt.host_per_seq_s * 9
    mixed = BatchShape([(512, 0)], 8, 8 * 1024)
    assert base.step_time_s(mixed) < L8B.layers * 1e-3
    assert slow.step_time_s(mixed) == pytest.approx(host + L8B.layers * 1e-3, rel=1e-12)
    assert fast.step_time_s(mixed) == base.step_time_s(mixed)  # the GPU is slower than the launches
    # A decode of up to graph_max_tokens sequences replays a graph: no launches to wait for.
    graph = BatchShape([], 8, 8 * 1024)
    assert slow.step_time_s(graph) == base.step_time_s(graph)
    assert slow.decode_times_s(8, np.array([8 * 1024.0]))[0] == base.decode_times_s(8, np.array([8 * 1024.0]))[0]
    # A larger one runs eagerly: every decode path takes the same floor.
    n = 256
    floor = trt.host_s + trt.host_per_seq_s * n + L8B.layers * 1e-3
    kv = np.array([n * 1024.0, n * 1100.0])
    assert slow.step_time_s(BatchShape([], n, n * 1024)) == pytest.approx(floor, rel=1e-12)
    assert slow.decode_times_s(n, kv) == pytest.approx([floor, floor], rel=1e-12)
    assert slow.decode_times_list(n, kv.tolist()) == pytest.approx([floor, floor], rel=1e-12)
    assert base.decode_times_s(n, kv)[0] < floor


# --- errors --------------------------------------------------------------------------------


def test_unknown_name():
    with pytest.raises(ConfigError, match="cost_model.profile.*h100-sxm"):
        load_profile("no-such-gpu")


def test_corrupt_json(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="valid JSON"):
        load_profile(p)


def test_wrong_format_and_version(tmp_path, h100):
    doc = h100.to_json()
    p = tmp_path / "p.json"
    p.write_text(json.dumps({**doc, "format": "something-else"}))
    with pytest.raises(ConfigError, match="format"):
        load_profile(p)
    p.write_text(json.dumps({**doc, "version": 99}))
    with pytest.raises(ConfigError, match="version 1"):
        load_profile(p)
    broken = dict(doc)
    del broken["gemm"]
    p.write_text(json.dumps(broken))
    with pytest.raises(ConfigError, match="gemm"):
        load_profile(p)


def test_model_shape_absent(h100):
    # A profile of baked curves only (as `kvsim calibrate --device` writes) prices only its shapes.
    cm = ProfileCostModel(h100, L8B, H100)
    baked = Profile.from_json(
        {
            **h100.to_json(),
            "kernels": {},
            "kernel_defaults": {},
            "gemm": {cm.keys.gemms()[proj]: c.to_json() for proj, c in cm._gemm.items()},
            "context_attention": {cm.keys.attention: cm._ctx.to_json()},
            "generation_attention": {cm.keys.attention: cm._gen.to_json()},
        }
    )
    assert ProfileCostModel(baked, L8B, H100).step_time_s(BatchShape([], 4, 4000)) > 0
    odd = with_overrides(L8B, name="odd", head_dim=96, hidden=3072)
    # The error lists the models whose curves the file bakes, not every model its build once checked.
    with pytest.raises(ConfigError, match=r"'odd'.*has no fitted kernel families, and curves for: llama-3.1-8b@tp1$"):
        ProfileCostModel(baked, odd, H100)


def _without(doc: dict, *path: str) -> dict:
    """``doc`` (a profile document) with the key at ``path`` deleted."""
    doc = json.loads(json.dumps(doc))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    return doc


def test_profile_without_its_kernels_block_names_the_file_and_the_key(tmp_path, h100):
    """A tables-built profile whose "kernels" block was deleted bakes no curves either: it can price no
    model, though its "models" still lists 35. Loading it, by any route, says so on one line naming
    the file, the missing key and what to do (before: a run blamed a missing shape of a model the
    same message listed as covered, and `kvsim profile show` printed the profile as usable)."""
    from sim.engine_presets import get_preset

    path = tmp_path / "p.json"
    path.write_text(json.dumps(_without(h100.to_json(), "kernels")))
    line = (
        f"{path}: kernels: got nothing; fitted kernel families ({{engine: {{gemm, context_attention, "
        "generation_attention}}, kvsim-profile v2) or baked curves in gemm, context_attention and "
        f"generation_attention: the file has neither, so it prices no model of the {len(h100.models)} it lists "
        'under models; copy "kernels" (and "kernel_defaults") back from the profile this file came from, or '
        "rebuild the file with kvsim calibrate"
    )
    for load in (
        lambda: load_profile(path),
        lambda: build_profile_cost_model(str(path), L8B, H100),
        lambda: build_profile_cost_model(str(path), L8B, H100, engine=get_preset("sglang")),
    ):
        with pytest.raises(ConfigError) as exc:
            load()
        assert str(exc.value) == line
    r = CliRunner().invoke(_app(), ["profile", "show", str(path)])
    assert isinstance(r.exception, ConfigError) and str(r.exception) == line


def test_profile_missing_one_fitted_family_names_it(tmp_path, h100):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_without(h100.to_json(), "kernels", "trtllm", "gemm")))
    with pytest.raises(ConfigError) as exc:
        load_profile(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: kernels.trtllm.gemm: got nothing; the fitted gemm family of engine 'trtllm' that ")
    assert "kernel_defaults.gemm names" in msg and "trtllm (context_attention, generation_attention)" in msg
    assert msg.endswith(
        'copy "kernels.trtllm.gemm" back from the profile this file came from, or rebuild the file with kvsim calibrate'
    )


def test_any_shape_prices_from_fitted_kernels(h100):
    # Tables-built profiles derive any shape from their fitted families: an off-catalog width and
    # head_dim price, and a head_dim off the measured 128 is counted as outside the measured range.
    odd = with_overrides(L8B, name="odd", head_dim=96, hidden=3072)
    cm = ProfileCostModel(h100, odd, H100)
    assert cm.step_time_s(BatchShape(decode_seqs=8, decode_kv_tokens=8000)) > 0
    assert cm.out_of_range.get("generation_attention") == 1
    assert "head_dim 96" in cm._gen.meta["outside_measured"]


def test_dtype_not_in_profile():
    with pytest.raises(ConfigError, match="kv_dtype"):
        build_profile_cost_model("a100-sxm", L8B, H100, kv_dtype="fp8")
    with pytest.raises(ConfigError, match="weight_dtype"):
        build_profile_cost_model("h100-sxm", L8B, H100, weight_dtype="int4")


def test_bad_tables(tmp_path):
    p = tmp_path / "gemm_perf.parquet"
    pq.write_table(pa.table({"m": [1], "n": [2], "latency": [0.1]}), p)
    with pytest.raises(ConfigError, match="gemm_dtype"):
        read_gemm(p)
    p.write_bytes(b"not parquet")
    with pytest.raises(ConfigError, match="Parquet"):
        read_gemm(p)
    with pytest.raises(ConfigError, match="from_tables"):
        load_kernel_tables(tmp_path / "missing", "h100_sxm", "trtllm")
    with pytest.raises(ConfigError, match="calibrate.system"):
        load_kernel_tables(tmp_path, "h100_sxm", "trtllm")


# --- CLI -----------------------------------------------------------------------------------


def _app():
    import typer

    from calibration.cli import calibrate_command, profile_app

    app = typer.Typer()
    app.command("calibrate")(calibrate_command)
    app.add_typer(profile_app, name="profile")
    return app


def test_cli_profile_list_and_show():
    r = CliRunner().invoke(_app(), ["profile", "list"])
    assert r.exit_code == 0 and "h100-sxm" in r.output
    r = CliRunner().invoke(_app(), ["profile", "show", "a100-sxm"])
    assert r.exit_code == 0 and "held-out" in r.output
    # Backend versions as a clause, not a Python dict; a device's null entries (nccl) left out.
    r = CliRunner().invoke(_app(), ["profile", "show", "cpu-reference"])
    first = r.output.splitlines()[0]
    assert r.exit_code == 0 and "gemm " in first and "{" not in first and "None" not in first, first


def test_cli_calibrate_from_tables(tmp_path):
    out = tmp_path / "a100.json"
    r = CliRunner().invoke(
        _app(),
        [
            "calibrate",
            "--from-tables",
            str(DEFAULT_TABLES_DIR),
            "--system",
            "a100_sxm",
            "--model",
            "llama-2-7b",
            "--tp",
            "1",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    cm = build_profile_cost_model(str(out), get_model("llama-2-7b"), H100)
    assert cm.decode_times_s(4, np.array([4000.0]))[0] > 0
    assert list_profiles()  # built-ins untouched


def _tables_with_head_dim(root, head_dim: int):
    """A copy of the shipped A100 TensorRT-LLM tables (system, GEMM, attention) whose attention rows
    all measure ``head_dim``."""
    import shutil

    src, dst = DEFAULT_TABLES_DIR / "a100_sxm", root / "a100_sxm"
    dst.mkdir(parents=True)
    shutil.copy(src / "system.yaml", dst / "system.yaml")
    shutil.copytree(src / "gemm" / "trtllm", dst / "gemm" / "trtllm")
    for table in sorted((src / "attention" / "trtllm").glob("*/*_attention_perf.parquet")):
        t = pq.read_table(table)
        i = t.schema.get_field_index("head_dim")
        t = t.set_column(i, "head_dim", pa.array([head_dim] * t.num_rows, t.schema.field(i).type))
        out = dst / table.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(t, out)
    return root


def test_cli_calibrate_tables_without_head_dim_128_names_the_head_dim(tmp_path):
    """Attention tables with no head_dim-128 rows: the error names the table, its head_dim column, the
    head sizes it has and the one needed (it used to blame calibrate.dtype, with the system as value)."""
    root = _tables_with_head_dim(tmp_path / "tables", 64)
    args = ["calibrate", "--from-tables", str(root), "--system", "a100_sxm", "--model", "llama-3.1-8b"]
    r = CliRunner().invoke(_app(), [*args, "--tp", "1", "--out", str(tmp_path / "p.json")])
    assert isinstance(r.exception, ConfigError), r.output
    (ctx,) = root.glob("a100_sxm/attention/trtllm/*/context_attention_perf.parquet")
    assert str(r.exception) == (
        f"{ctx}: head_dim: got [64]; context-attention rows with head_dim 128: a profile maps each KV-cache "
        "dtype to the head_dim-128 attention tables (and prices other head sizes from the nearest measured one)"
    )
    assert not (tmp_path / "p.json").exists()


def test_tables_without_bf16_attention_name_the_dtypes(h100):
    """Head_dim-128 rows but no bf16 attention over a bf16 or fp8 cache: the table's dtype columns and
    the pairs it has are named (a GEMM table of other dtypes likewise)."""
    from dataclasses import replace

    from calibration.profile_builder import build_profile, default_models

    kt = load_kernel_tables(DEFAULT_TABLES_DIR, "a100_sxm", "trtllm")
    pairs = default_models(("llama-3.1-8b",), (1,))
    ctx = replace(kt.context, attn_dtype=np.full(len(kt.context), "fp8"))
    with pytest.raises(ConfigError) as exc:
        build_profile(replace(kt, context=ctx), models=pairs)
    assert str(exc.value) == (
        f"{kt.context.source}: attn_dtype/kv_cache_dtype: got ['fp8/bf16']; head_dim-128 rows with attn_dtype bf16 "
        "and kv_cache_dtype bf16 or fp8"
    )
    gen = replace(kt.generation, kv_dtype=np.full(len(kt.generation), "fp8"))
    with pytest.raises(
        ConfigError, match=r"generation_attention_perf.parquet: kv_cache_dtype: got \['fp8'\]; .* bf16 "
    ):
        build_profile(replace(kt, generation=gen), models=pairs)
    gemm = replace(kt.gemm, dtype=np.full(len(kt.gemm), "int4_wo"))
    with pytest.raises(ConfigError, match=r"gemm_perf.parquet: gemm_dtype: got \['int4_wo'\]; rows of gemm_dtype bf16"):
        build_profile(replace(kt, gemm=gemm), models=pairs)


def test_cli_calibrate_needs_a_route(tmp_path):
    r = CliRunner().invoke(_app(), ["calibrate", "--model", "tiny-llama", "--out", str(tmp_path / "x.json")])
    assert isinstance(r.exception, ConfigError)


def test_nvfp4_weights_are_priced_on_blackwells_fp4_tables():
    """B200's tables time NVFP4 GEMMs (FP4 tensor cores, 4-bit weights with an fp8 scale per 16):
    the profile offers them, prices a compute-bound GEMM below fp8 and bf16 and never above the
    FP4 peak, and TensorRT-LLM's preset takes off their input quantization as it does fp8's.
    Hopper has no FP4 tables: the profile does not claim them."""
    from dataclasses import replace

    from sim.engine_presets import get_preset

    b200, gpu = load_profile("b200-sxm"), get_gpu("B200-SXM-180GB")
    assert "nvfp4" in b200.dtypes["weight"] and "nvfp4" not in load_profile("h100-sxm").dtypes["weight"]
    n, k, m = 14336, 8192, 4096.0
    t = {d: b200.gemm_curve(f"{n}x{k}:{d}").at(m)[0] for d in ("bf16", "fp8", "nvfp4")}
    assert t["nvfp4"] < 0.8 * t["fp8"] < t["bf16"]
    assert 2 * m * n * k / t["nvfp4"] <= gpu.peak_gemm_flops("nvfp4") == 9000e12
    assert 1e-6 < b200.fp8_gemm_excess_s(None, "nvfp4") < b200.fp8_gemm_excess_s(None, "fp8")
    model, trt = get_model("llama-3.1-70b"), get_preset("trtllm")
    kw = dict(tensor_parallel=2, weight_dtype="nvfp4")
    fused = ProfileCostModel(b200, model, gpu, engine=trt, **kw)
    unfused = ProfileCostModel(b200, model, gpu, engine=replace(trt, fp8_quant_fused=False), **kw)
    step = BatchShape([], 8, 8 * 1024)
    saved = unfused.step_time_s(step) - fused.step_time_s(step)
    assert saved == pytest.approx(4 * model.layers * b200.fp8_gemm_excess_s(None, "nvfp4"), rel=0.02)
    # Linear weights take 4.5 bits a parameter: 70B on two GPUs holds 9/16 of fp8's bytes for them
    # (the token embedding and LM head stay in 16 bits in both), and the KV cache gets what that frees.
    from sim.config import scenario_from_dict
    from sim.engine.deployment import Deployment

    def dep(w):
        return Deployment.from_scenario(
            scenario_from_dict(
                {
                    "gpu": {"name": "B200-SXM-180GB", "tensor_parallel": 2},
                    "model": {"name": "llama-3.1-70b", "weight_dtype": w},
                    "engine": {"kind": "trtllm"},
                }
            )
        )

    fp4, fp8 = dep("nvfp4"), dep("fp8")
    per_gpu = fp8.weight_bytes / model.weight_bytes("fp8")
    emb16 = 2 * model.embedding_params * per_gpu
    assert fp4.weight_bytes - emb16 == pytest.approx((fp8.weight_bytes - emb16) * 0.5625, rel=0.01)
    assert fp4.kv_capacity_bytes - fp8.kv_capacity_bytes == pytest.approx(fp8.weight_bytes - fp4.weight_bytes, rel=0.01)


def test_b200_carries_each_engines_own_kernels():
    """As on Hopper, B200's profile prices each serving engine on its own tables: TensorRT-LLM's fp8
    layers were timed with their input quantization, vLLM's and SGLang's fp8 kernels were not."""
    b200 = load_profile("b200-sxm")
    assert set(b200.kernels) == {"vllm", "sglang", "trtllm"} and set(b200.custom_allreduce) == set(b200.kernels)
    assert b200.fp8_gemm_excess_s("trtllm") > 5e-6
    assert b200.fp8_gemm_excess_s("vllm") < 2.5e-6 and b200.fp8_gemm_excess_s("sglang") < 2.5e-6
    # An engine's table the fitted form misses badly (held-out p95 over ENGINE_FAMILY_P95_MAX) is not
    # used: B200 SGLang's attention tables (two latency regimes), priced on the default tables instead.
    from calibration.profile_builder import ENGINE_FAMILY_P95_MAX

    q = b200.fit_quality["backends"]["sglang"]
    assert q["generation_attention"]["p95_rel_err"] > ENGINE_FAMILY_P95_MAX >= q["gemm"]["p95_rel_err"]
    assert set(b200.kernels["sglang"]) == {"gemm"}
    assert "not used" in b200.provenance["engine_tables"]["sglang"]["generation_attention"]
    vllm = b200.fit_quality["backends"]["vllm"]
    assert set(b200.kernels["vllm"]) == {f for f in vllm if vllm[f]["p95_rel_err"] <= ENGINE_FAMILY_P95_MAX}


@pytest.mark.parametrize("gpu_name", ["H100-SXM-80GB", "H200-SXM-141GB", "A100-SXM-80GB", "B200-SXM-180GB", "L40S"])
def test_every_engine_prices_every_dtype_its_profile_offers(gpu_name):
    """An engine's own tables may lack a dtype the profile offers (the A100's vLLM and SGLang GEMMs are
    bf16 only; its fp8 weights are priced on TensorRT-LLM's int8 weight-only table): that kernel is priced
    on the profile's default tables, never refused, so no engine falls back to the roofline for it."""
    from sim.engine.deployment import BUILTIN_PROFILE_FOR_GPU
    from sim.engine_presets import PRESETS

    gpu = get_gpu(gpu_name)
    prof = load_profile(BUILTIN_PROFILE_FOR_GPU[gpu_name])
    weights = [*prof.dtypes["weight"], *(["fp8_block"] if "fp8" in prof.dtypes["weight"] else [])]
    step = BatchShape([(512, 0)], 8, 8 * 1024)
    for engine in PRESETS.values():
        for w in weights:
            for kv in prof.dtypes["kv"]:
                for model, tp in (("llama-3.1-8b", 1), ("qwen3-32b", 2)):
                    cm = ProfileCostModel(
                        prof, get_model(model), gpu, tensor_parallel=tp, weight_dtype=w, kv_dtype=kv, engine=engine
                    )
                    assert cm.calibrated and cm.mixed_step_time_s(step) > 0, (engine.name, w, kv, model)


@pytest.mark.parametrize("name", ["h100-sxm", "h200-sxm", "b200-sxm", "l40s"])
def test_block_fp8_is_priced_on_each_engines_block_kernels(name):
    """Block-scaled fp8 GEMMs come from an engine's own block-fp8 table where its tables time them
    (TensorRT-LLM everywhere, SGLang but on the L40S) and from its per-tensor fp8 table where they
    do not (vLLM). On Hopper TensorRT-LLM's block GEMMs are slower at prefill sizes: a 1024-token
    Qwen3-32B gate/up projection is priced above the per-tensor one."""
    p = load_profile(name)
    key = "51200x5120"
    for engine, has_block in (("trtllm", True), ("sglang", name != "l40s"), ("vllm", False)):
        block, fp8 = p.gemm_curve(f"{key}:fp8_block", engine), p.gemm_curve(f"{key}:fp8", engine)
        assert block.meta["backend"] == engine
        assert block.meta["table_dtype"] == ("fp8_block" if has_block else "fp8"), engine
        if not has_block:
            assert block.at(1024)[0] == fp8.at(1024)[0]
    trt = p.gemm_curve(f"{key}:fp8_block", "trtllm").at(1024)[0] / p.gemm_curve(f"{key}:fp8", "trtllm").at(1024)[0]
    if name in ("h100-sxm", "h200-sxm"):
        assert trt > 1.05, trt


def test_a100_carries_each_engines_own_kernels():
    """The A100's tables time vLLM's and SGLang's bf16 kernels too: a bf16 model on vLLM is priced on
    vLLM's GEMMs and attention; its fp8 (int8 weight-only proxy) GEMMs come from the default tables."""
    a100 = load_profile("a100-sxm")
    assert set(a100.kernels) == {"vllm", "sglang", "trtllm"}
    assert set(a100.kernels["vllm"]) == {"gemm", "context_attention", "generation_attention"}
    assert a100.gemm_curve("4096x4096:bf16", "vllm").meta["backend"] == "vllm"
    assert a100.gemm_curve("4096x4096:int8_wo", "vllm").meta["backend"] == "trtllm"
    assert a100.gemm_curve("4096x4096:int8_wo", "vllm") is a100.gemm_curve("4096x4096:int8_wo")
