"""A quantized checkpoint's id runs that checkpoint's format, whether a config of it ships
(``scenarios/models``) or its id maps to a catalog shape (``sim.model_ids.MODEL_IDS``):
``nvidia/Llama-3.1-8B-Instruct-FP8`` and ``Qwen/Qwen3-8B-FP8`` ran bf16 weights and a bf16 KV
cache while their shipped siblings ran fp8 (docs/scenario.md: an id whose quantization tags match
"runs that checkpoint's format")."""

from __future__ import annotations

import pytest

from sim.config import apply_overrides, read_scenario_dict, scenario_from_dict
from sim.engine.deployment import Deployment
from sim.hf_config import shipped_models
from sim.model_ids import CHECKPOINT_FORMATS, MODEL_IDS, model_argument, quant_tags, variant_note

#: Every id kvsim knows exactly whose name says FP8: the catalog ids and the shipped configs.
FP8_IDS = sorted({i for i in [*MODEL_IDS, *shipped_models()] if "fp8" in quant_tags(i)})


def _format(ident: str) -> tuple[str, str]:
    """(weight dtype, KV dtype) a run of ``--model ident`` resolves to."""
    sc = scenario_from_dict({"model": model_argument(ident)})
    return sc.model.weight_dtype, sc.model.kv_dtype


def _siblings(ident: str) -> list[str]:
    """Shipped configs of the same organisation with the same quantization tags."""
    org = ident.split("/")[0]
    return [s for s in shipped_models() if s != ident and s.split("/")[0] == org and quant_tags(s) == quant_tags(ident)]


def test_the_fp8_ids_include_the_catalog_ones():
    assert {"nvidia/Llama-3.1-8B-Instruct-FP8", "Qwen/Qwen3-8B-FP8"} <= set(FP8_IDS)
    assert {"nvidia/Llama-3.1-70B-Instruct-FP8", "Qwen/Qwen3-32B-FP8"} <= set(FP8_IDS)


@pytest.mark.parametrize("ident", FP8_IDS)
def test_every_fp8_id_runs_fp8_weights_as_its_shipped_siblings_do(ident):
    weights, kv = _format(ident)
    assert weights in ("fp8", "fp8_block"), (ident, weights)
    for sibling in _siblings(ident):
        assert (weights, kv) == _format(sibling), (ident, sibling)


def test_the_catalog_fp8_ids_have_their_siblings_format():
    assert _format("nvidia/Llama-3.1-8B-Instruct-FP8") == _format("nvidia/Llama-3.1-70B-Instruct-FP8") == ("fp8", "fp8")
    assert _format("Qwen/Qwen3-8B-FP8") == _format("Qwen/Qwen3-32B-FP8") == ("fp8_block", "bf16")


def test_every_quantized_catalog_id_has_a_format_and_agrees_with_a_shipped_config():
    for ident in MODEL_IDS:
        if quant_tags(ident):
            assert ident in CHECKPOINT_FORMATS, ident
    for ident, fmt in CHECKPOINT_FORMATS.items():
        assert ident in MODEL_IDS
        if ident in shipped_models():
            # The shipped config wins (it is read first); the table must say the same.
            assert _format(ident) == fmt, ident


def test_a_run_of_the_catalog_fp8_id_holds_fp8_kv_and_explicit_dtypes_still_win():
    data, base = read_scenario_dict("chat-api")
    data = {**data, "model": model_argument("nvidia/Llama-3.1-8B-Instruct-FP8")}
    dep = Deployment.from_scenario(scenario_from_dict(data, base_dir=base))
    assert dep.kv_bytes_per_token == 65_536  # 32 layers x 2 x 8 KV heads x 128 x 1 byte
    plain = scenario_from_dict(apply_overrides(data, {"model.weight_dtype": "bf16", "model.kv_dtype": "bf16"}), base)
    assert (plain.model.weight_dtype, plain.model.kv_dtype) == ("bf16", "bf16")
    assert Deployment.from_scenario(plain).kv_bytes_per_token == 131_072


def test_a_variant_of_a_catalog_fp8_id_says_whose_format_it_runs():
    # Another publisher's FP8 checkpoint has fp8 weights but no KV cache scale (compressed-tensors
    # kv_cache_scheme null): NVIDIA's fp8 KV cache is its own checkpoints' (tests/test_compare_formats.py).
    section = model_argument("RedHatAI/Llama-3.1-8B-Instruct-FP8")
    assert section == {
        "name": None,
        "hf_config": "meta-llama/Meta-Llama-3.1-8B",
        "weight_dtype": "fp8",
        "kv_dtype": "bf16",
    }
    note = variant_note("RedHatAI/Llama-3.1-8B-Instruct-FP8", section)
    assert note is not None and "fp8 weights, bf16 KV cache (the format its name's tags give" in note
    section = model_argument("nvidia/Llama-3.1-8B-Instruct-FP8-dynamic")  # no such release: the tags' format
    assert (section["weight_dtype"], section["kv_dtype"]) == ("fp8", "bf16")
    assert model_argument("nvidia/Llama-3.3-70B-Instruct-FP8") == {
        "name": None,
        "hf_config": "nvidia/Llama-3.1-70B-Instruct-FP8",
    }
    assert variant_note("nvidia/Llama-3.1-8B-Instruct-FP8", model_argument("nvidia/Llama-3.1-8B-Instruct-FP8")) is None
