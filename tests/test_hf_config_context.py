"""A Hugging Face config's context (``HfModel.context``, which ``sim.config.model_context`` and
``workload.max_model_len`` use) derived as vLLM's ``_get_and_verify_max_len`` derives it, rope
scaling included; and the sliding window a config leaves out taken from its transformers class
(Mistral's 4096, Mixtral's none, Qwen2's switched off), told apart from one given as ``null``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import write_config
from sim.config import model_context, scenario_from_dict
from sim.engine.cluster import simulate
from sim.engine.deployment import Deployment
from sim.errors import ConfigError
from sim.hf_config import read_hf_config, shipped_config

#: What Qwen2.5's model cards tell you to add to config.json for contexts over 32,768 tokens.
QWEN_YARN = {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}


def _shipped(tmp_path: Path, model: str, name: str = "m_config.json", **fields) -> Path:
    """A copy of a shipped config with ``fields`` replaced (``None``: the key removed)."""
    path = shipped_config(model)
    assert path is not None
    cfg = json.loads(path.read_text())
    for k, v in fields.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return write_config(tmp_path, cfg, name)


def _context(path: Path) -> int | None:
    return model_context(scenario_from_dict({"model": {"hf_config": str(path)}}))


# --- one reading: model_context takes the parsed config's context ------------------------------


def test_model_context_reads_the_parsed_config_not_the_file_again(tmp_path, monkeypatch):
    path = _shipped(tmp_path, "Qwen/Qwen2.5-3B", rope_scaling=QWEN_YARN)
    sc = scenario_from_dict({"model": {"hf_config": str(path)}})
    real = Path.read_text

    def no_second_read(self, *args, **kwargs):
        if self.resolve() == path.resolve():
            raise AssertionError(f"{path.name} read again")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", no_second_read)
    assert model_context(sc) == 131_072 == read_hf_config(path).context


# --- rope scaling ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model,fields,context",
    [
        # Qwen2.5 with its model card's YaRN block: 32,768 x 4.
        ("Qwen/Qwen2.5-3B", {"rope_scaling": QWEN_YARN}, 131_072),
        # Qwen3's 40,960 positions with the same block: vLLM counts from the original 32,768.
        ("Qwen/Qwen3-8B", {"rope_scaling": {"rope_type": "yarn", **QWEN_YARN}}, 131_072),
        # YaRN without original_max_position_embeddings: from max_position_embeddings (transformers 5
        # fills it in with that, and vLLM reads it).
        ("Qwen/Qwen2.5-3B", {"rope_scaling": {"type": "yarn", "factor": 2.0}}, 65_536),
        # Llama 3.1: the llama3 factor (8) is already in max_position_embeddings.
        ("meta-llama/Meta-Llama-3.1-8B", {}, 131_072),
        # Linear and dynamic factors stretch it.
        ("meta-llama/Llama-3.2-1B", {"max_position_embeddings": 2048, "rope_scaling": {"type": "linear", "factor": 4.0}}, 8192),
        ("meta-llama/Llama-3.2-1B", {"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, 8192),
        ("meta-llama/Llama-3.2-1B", {"max_position_embeddings": 2048, "rope_scaling": {"type": "linear", "factor": 1.5}}, 3072),
        # longrope (and its old name su) counts its factor already; mrope / default have none.
        ("meta-llama/Llama-3.2-1B", {"max_position_embeddings": 4096, "rope_scaling": {"type": "su", "factor": 32.0}}, 4096),
        ("meta-llama/Llama-3.2-1B", {"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "longrope", "factor": 32.0}}, 4096),
        ("meta-llama/Llama-3.2-1B", {"max_position_embeddings": 4096, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}, 4096),
        # transformers 5 writes rope_parameters, flat or one per layer type.
        ("meta-llama/Llama-3.2-1B", {"max_position_embeddings": 4096, "rope_scaling": None, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}, 8192),
        ("meta-llama/Llama-3.2-1B", {"max_position_embeddings": 4096, "rope_scaling": None, "rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}, "sliding_attention": {"rope_type": "default"}}}, 8192),
        # Command-R's model_max_length is the context vLLM reads over max_position_embeddings.
        ("meta-llama/Llama-3.2-1B", {"max_position_embeddings": 8192, "rope_scaling": None, "model_max_length": 131_072}, 131_072),
    ],
)  # fmt: skip
def test_the_context_is_vllms_derived_max_model_len(tmp_path, model, fields, context):
    path = _shipped(tmp_path, model, **fields)
    assert read_hf_config(path).context == context
    assert _context(path) == context
    # vLLM's default max_model_len is the context; kvsim's stays 8192 unless the context is shorter.
    sc = scenario_from_dict({"model": {"hf_config": str(path)}})
    assert sc.workload.max_model_len == min(8192, context)
    # Up to the context is accepted, one more token refused naming the field, value and limit.
    assert scenario_from_dict({"model": {"hf_config": str(path)}, "workload": {"max_model_len": context}})
    with pytest.raises(ConfigError) as err:
        scenario_from_dict({"model": {"hf_config": str(path)}, "workload": {"max_model_len": context + 1}})
    assert err.value.key == "workload.max_model_len" and err.value.value == context + 1
    assert f"at most {context}" in err.value.allowed and "\n" not in str(err.value)


def test_gemma3s_linear_factor_is_already_in_its_context(tmp_path):
    # google/gemma-3-*: max_position_embeddings left out (Gemma3TextConfig: 131,072), linear factor 8;
    # vLLM does not multiply Gemma-3's.
    text = {
        "model_type": "gemma3_text",
        "head_dim": 128,
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_attention_heads": 8,
        "num_hidden_layers": 34,
        "num_key_value_heads": 4,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    }
    assert read_hf_config(write_config(tmp_path, text)).context == 131_072
    wrapped = {"model_type": "gemma3", "text_config": {k: v for k, v in text.items() if k != "model_type"}}
    assert read_hf_config(write_config(tmp_path, wrapped, "vl_config.json")).context == 131_072


def test_a_prompt_up_to_a_yarn_context_is_served(tmp_path):
    path = _shipped(tmp_path, "Qwen/Qwen2.5-0.5B", rope_scaling=QWEN_YARN)
    sc = scenario_from_dict(
        {
            "model": {"hf_config": str(path)},
            "workload": {
                "num_requests": 2,
                "max_model_len": 131_072,
                "arrival": {"kind": "poisson", "rate": 1.0},
                "lengths": {"kind": "fixed", "prompt_tokens": 40_000, "output_tokens": 8},
            },
        }
    )
    Deployment.from_scenario(sc)  # the deployment's own check agrees
    res = simulate(sc)
    assert res.summary["completed"] == 2 and not res.summary.get("rejected_by_reason")


@pytest.mark.parametrize(
    "fields,needle",
    [
        ({"rope_scaling": {"type": "linear", "factor": "x"}}, "'rope_scaling.factor' must be a number > 0; got 'x'"),
        ({"rope_scaling": {"type": "linear", "factor": 0}}, "'rope_scaling.factor' must be a number > 0; got 0"),
        ({"rope_scaling": "linear"}, "'rope_scaling' must be a mapping (rope_type, factor, ...) or null; got 'linear'"),
        (
            {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0.5}},
            "'rope_scaling.original_max_position_embeddings' must be an integer >= 1; got 0.5",
        ),
        ({"model_max_length": "long"}, "'model_max_length' must be an integer >= 1"),
    ],
)
def test_a_malformed_rope_scaling_is_one_line_naming_the_field(tmp_path, fields, needle):
    with pytest.raises(ConfigError) as err:
        read_hf_config(_shipped(tmp_path, "Qwen/Qwen2.5-0.5B", **fields))
    msg = str(err.value)
    assert needle in msg and "\n" not in msg


# --- sliding windows a config leaves out -------------------------------------------------------


def test_mistral_without_sliding_window_takes_mistralconfigs_4096(tmp_path):
    # The key absent: MistralConfig's default, a 4096-token window on every layer.
    absent = read_hf_config(_shipped(tmp_path, "mistralai/Mistral-7B-v0.3", sliding_window=None)).spec
    assert (absent.sliding_window, absent.sliding_layers, absent.layer_types) == (4096, 32, ())
    assert absent.kv_tokens_held(10_000) == 4096
    # Given as null (Mistral-7B-v0.3's shipped config): no window.
    null = read_hf_config(shipped_config("mistralai/Mistral-7B-v0.3")).spec
    assert (null.sliding_window, null.sliding_layers) == (None, 0)
    # A window given is kept.
    given = read_hf_config(_shipped(tmp_path, "mistralai/Mistral-7B-v0.3", "w_config.json", sliding_window=2048)).spec
    assert (given.sliding_window, given.sliding_layers) == (2048, 32)


def test_mistrals_other_class_defaults(tmp_path):
    cfg = {
        "model_type": "mistral",
        "hidden_size": 1024,
        "intermediate_size": 2048,
        "num_attention_heads": 16,
        "num_hidden_layers": 4,
        "vocab_size": 1000,
    }
    m = read_hf_config(write_config(tmp_path, cfg))
    # MistralConfig: 8 KV heads, 4096 x 32 positions, the 4096 window.
    assert (m.spec.kv_heads, m.context, m.spec.sliding_window) == (8, 131_072, 4096)


def test_mixtral_without_sliding_window_has_none(tmp_path):
    absent = read_hf_config(_shipped(tmp_path, "mistralai/Mixtral-8x7B-v0.1", sliding_window=None)).spec
    assert (absent.sliding_window, absent.sliding_layers) == (None, 0)
    given = read_hf_config(_shipped(tmp_path, "mistralai/Mixtral-8x7B-v0.1", "w_config.json", sliding_window=4096)).spec
    assert (given.sliding_window, given.sliding_layers) == (4096, 32)


def test_qwen2s_window_is_off_unless_use_sliding_window_says_on(tmp_path):
    # use_sliding_window left out: Qwen2Config's False, so sliding_window alone is no window.
    off = read_hf_config(_shipped(tmp_path, "Qwen/Qwen2.5-0.5B", use_sliding_window=None, sliding_window=4096)).spec
    assert (off.sliding_window, off.sliding_layers) == (None, 0)
    qwen3 = read_hf_config(
        _shipped(tmp_path, "Qwen/Qwen3-0.6B", "q3_config.json", use_sliding_window=None, sliding_window=4096)
    ).spec
    assert (qwen3.sliding_window, qwen3.sliding_layers) == (None, 0)
    # Switched on without max_window_layers: Qwen2Config's 28, so layers 28.. of 32 slide.
    on = read_hf_config(
        _shipped(
            tmp_path,
            "Qwen/Qwen2.5-0.5B",
            "on_config.json",
            use_sliding_window=True,
            sliding_window=4096,
            max_window_layers=None,
            num_hidden_layers=32,
        )
    ).spec
    assert (on.sliding_window, on.sliding_layers) == (4096, 4)
    assert on.layer_types[27:29] == ("full_attention", "sliding_attention")
