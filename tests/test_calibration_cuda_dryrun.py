"""A dry run of ``kvsim calibrate --device cuda`` on this CPU: a stand-in device that calls itself
``cuda`` (tensors on the CPU, host clock) and stand-in attention backends exercise the CUDA route's
backend selection (``auto``: flashinfer > vllm > flex), the provenance it writes, block sizes a
backend skips, and the profile writer (profile, Parquet sidecar, fit report)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from calibration import attention_backends as AB, kernels as K  # noqa: E402
from calibration.devices import CpuDevice  # noqa: E402
from sim.catalog import get_model  # noqa: E402
from sim.cost.profile import load_profile  # noqa: E402

TINY = get_model("tiny-llama")


class FakeCuda(CpuDevice):
    """A CPU that the calibration takes for a CUDA GPU (no pinned host memory: host transfers are timed
    as copies, as on a CPU)."""

    kind = "cuda"

    def describe(self, dtype, threads):
        return {
            "kind": "cuda",
            "torch": torch.__version__,
            "dtype": dtype,
            "name": "Fake H200 (CPU stand-in)",
            "memory_bytes": 141 << 30,
            "compute_capability": "9.0",
            "cuda_runtime": "fake",
            "threads": threads,
        }


def fake_backend(name, *, available=True, version="0.0-fake", bad_block=None):
    """An SDPA backend under another name (what a test can run here), available or not."""

    def unavailable(cls, kind):
        if kind != "cuda":
            return f"{name}: CUDA only"
        return None if available else f"{name} is not installed"

    def block_size_problem(self, bs):
        return f"{name} pages need 16-token multiples" if bad_block and bs % bad_block else None

    return type(
        f"Fake{name}",
        (AB.SdpaBackend,),
        {
            "name": name,
            "prefill_kernel": f"{name}_paged_prefill",
            "unavailable": classmethod(unavailable),
            "version": lambda self: version,
            "block_size_problem": block_size_problem,
            "routes": {
                "decode_paged": f"{name} paged decode (stand-in: SDPA)",
                "decode_contiguous": f"{name} contiguous",
                "prefill": f"{name} paged prefill",
            },
        },
    )


TINY_PLAN = K.Plan(
    gemm_m=(1, 16, 64),
    ctx_batch=(1, 2),
    ctx_len=(16, 64),
    ctx_max_tokens=128,
    gen_batch=(1, 2, 4),
    gen_len=(16, 64, 128),
    gen_max_kv_bytes=1 << 20,
    block_sizes=(8, 32),
    overhead_batch=(1, 4),
    mem_bytes=(1 << 12, 1 << 16),
    ew_tokens=(1, 16),
    repeats=3,
    warmup=1,
    target_repeat_s=0.0002,
    passes=1,
)


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    reg = {
        "sdpa": AB.SdpaBackend,
        "flex": fake_backend("flex"),
        "flashinfer": fake_backend("flashinfer", version="9.9-fake", bad_block=16),
        "vllm": fake_backend("vllm", available=False),
    }
    res = K.calibrate_device(
        "cuda",
        TINY,
        plan=TINY_PLAN,
        progress=False,
        ops=FakeCuda(torch, torch.device("cpu")),
        registry=reg,
        kernels="auto",
    )
    out = tmp_path_factory.mktemp("dry") / "h200-dry.json"
    files = K.write_outputs(res, out, TINY)
    return res, files, reg


def test_auto_picks_flashinfer_and_says_so(dry):
    res, files, _ = dry
    prov = res.profile.provenance
    att = prov["attention_backend"]
    assert (
        att["name"] == "flashinfer"
        and att["version"] == "9.9-fake"
        and att["prefill_kernel"] == "flashinfer_paged_prefill"
    )
    assert prov["backend_versions"]["generation_attention"] == "flashinfer 9.9-fake"
    assert (
        prov["backend_versions"]["context_attention"] == "flashinfer 9.9-fake"
        and "flashinfer 9.9-fake" in prov["backend"]
    )
    assert prov["device_info"]["kind"] == "cuda" and prov["device_info"]["name"].startswith("Fake H200")
    assert "attention" not in prov["device_info"]
    lay = res.profile.layout
    assert lay["measured_kernel"] == "flashinfer 9.9-fake: flashinfer paged decode (stand-in: SDPA)"
    assert lay["contiguous_kernel"].startswith("flashinfer 9.9-fake: ")
    key = next(iter(res.profile.generation_attention))
    assert res.profile.generation_attention[key].meta["backend"] == "flashinfer 9.9-fake"
    assert "CUDA events" in prov["method_detail"]


def test_block_sizes_the_backend_cannot_use_are_skipped_and_named(dry):
    res, _, _ = dry
    lay = res.profile.layout
    # block 8 is not a multiple of the stand-in's 16: not timed, and the reason is in the profile
    assert "8" not in lay["paged_overhead_by_block_size"] and "32" in lay["paged_overhead_by_block_size"]
    assert lay["skipped_block_sizes"] == {"8": "flashinfer pages need 16-token multiples"}
    sizes = {r["block_size"] for r in res.measurements.select("generation_attention", kernel="decode_paged")}
    assert sizes == {16, 32}
    assert {r["backend"] for r in res.measurements.select("generation_attention")} == {"flashinfer"}


def test_profile_writer_outputs_load(dry):
    res, files, _ = dry
    p = load_profile(files["profile"])
    assert p.provenance["attention_backend"]["name"] == "flashinfer"
    assert json.loads(files["profile"].read_text())["layout"]["measured_kernel"].startswith("flashinfer")
    import pyarrow.parquet as pq

    raw = pq.read_table(files["measurements"]).to_pydict()
    assert "flashinfer_paged_prefill" in raw["kernel"]
    if files["report"] is not None:
        text = files["report"].read_text()
        assert "flashinfer, paged, block 16" in text and '<script src="http' not in text


def test_auto_falls_back_and_explicit_choices(dry):
    _, _, reg = dry
    reg = {**reg, "flashinfer": fake_backend("flashinfer", available=False)}
    assert AB.select("auto", "cuda", reg) == "flex"
    bench = K.Bench.open("cuda", "bf16", ops=FakeCuda(torch, torch.device("cpu")), registry=reg, kernels="flex")
    assert bench.kernels.name == "flex" and bench.ops.kind == "cuda" and bench.rotate_bytes == K.ROTATE_BYTES["cuda"]
    from sim.errors import ConfigError

    with pytest.raises(ConfigError, match="calibrate.kernels.*vllm is not installed.*available: sdpa, flex"):
        K.Bench.open("cuda", "bf16", ops=FakeCuda(torch, torch.device("cpu")), registry=reg, kernels="vllm")
