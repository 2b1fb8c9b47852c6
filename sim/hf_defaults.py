"""What transformers assumes of a Hugging Face ``config.json`` where the file says nothing, per
architecture (``model_type``), for the fields :mod:`sim.hf_config` reads.

A published config leaves out the fields equal to its config class's defaults: Google's
Gemma-3 configs carry no ``sliding_window_pattern`` (6), the 12B no ``head_dim`` (256, not
``hidden_size / heads`` = 240), the 4B no head counts, the 27B-it no ``vocab_size``.
transformers fills those in from the class (``src/transformers/models/<name>/configuration_<name>.py``)
before a model is built, and vLLM, SGLang and TensorRT-LLM load configs through it; so does
kvsim, from :data:`DEFAULTS`, for a key the file does not have at all. A key present with
``null`` keeps ``null``, as in transformers.

Every value below is the one the cited class sets (checked against transformers 5.25); an
architecture or field not listed gets no default (kvsim asks for the field, or keeps its own
fallback: ``head_dim = hidden / heads``, ``num_key_value_heads = heads``, untied embeddings,
``max_position_embeddings`` 4096 for the shape, an unknown context).

"Absent" and ``null`` differ where the class's default is not ``None``: a Mistral config without
``sliding_window`` slides over MistralConfig's 4096 tokens on every layer, one with
``"sliding_window": null`` (Mistral-7B-v0.3, Mistral-Nemo) has no window; a Qwen2/Qwen3 config
without ``use_sliding_window`` has it off (the class's ``False``), whatever ``sliding_window`` says.
"""

from __future__ import annotations

#: CohereConfig's defaults, which Cohere2Config shares.
_COHERE: dict[str, int | bool] = {
    "vocab_size": 256_000,
    "hidden_size": 8192,
    "intermediate_size": 22_528,
    "num_hidden_layers": 40,
    "num_attention_heads": 64,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "attention_bias": False,
}
#: MistralConfig's defaults, which MixtralConfig shares (but for the window: Mistral's 4096, Mixtral's None).
_MISTRAL: dict[str, int | bool] = {
    "vocab_size": 32_000,
    "hidden_size": 4096,
    "intermediate_size": 14_336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 4096 * 32,
    "tie_word_embeddings": False,
}
#: What Qwen2Config, Qwen3Config and their mixture-of-experts classes share: the window declared
#: (4096 tokens) but off.
_QWEN: dict[str, int | bool] = {
    "vocab_size": 151_936,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "max_position_embeddings": 32_768,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": 4096,
}
#: GPT2Config's defaults, which GPTBigCodeConfig shares.
_GPT2: dict[str, int | bool] = {
    "vocab_size": 50_257,
    "n_positions": 1024,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "tie_word_embeddings": True,
}

#: Per ``model_type``: the defaults of its transformers config class for the fields kvsim reads
#: (``num_hidden_layers, hidden_size, intermediate_size, num_attention_heads,
#: num_key_value_heads, head_dim, vocab_size, max_position_embeddings, tie_word_embeddings,
#: attention_bias, sliding_window, sliding_window_pattern, use_sliding_window,
#: max_window_layers`` and the mixture-of-experts counts). ``num_key_value_heads``, ``head_dim``
#: and ``sliding_window`` are listed only where the class gives a number (``None`` there means
#: "the query heads", ``hidden / heads`` and "no window", kvsim's own fallbacks: MixtralConfig's
#: ``sliding_window`` is ``None``, so a Mixtral config without one has no window).
DEFAULTS: dict[str, dict[str, int | bool]] = {
    # GemmaConfig (models/gemma/configuration_gemma.py).
    "gemma": {
        "vocab_size": 256_000,
        "hidden_size": 3072,
        "intermediate_size": 24_576,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "attention_bias": False,
    },
    # Gemma2Config (models/gemma2/configuration_gemma2.py). Its layer_types default (even layers
    # slide, odd layers attend globally) is applied in sim.hf_config._attention_layout.
    "gemma2": {
        "vocab_size": 256_000,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "sliding_window": 4096,
    },
    # Gemma3TextConfig (models/gemma3/configuration_gemma3.py, since transformers 4.50; the text
    # tower of Gemma3Config). sliding_window_pattern 6: layer i attends globally when
    # (i + 1) % 6 == 0 and slides otherwise (its layer_types default; read from the config's
    # "sliding_window_pattern", default 6, in later versions).
    "gemma3_text": {
        "vocab_size": 262_208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131_072,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
    },
    # MistralConfig (models/mistral/configuration_mistral.py): sliding_window 4096 on every layer
    # unless the file says otherwise ("sliding_window": null: none, as Mistral-7B-v0.3's has).
    "mistral": {**_MISTRAL, "sliding_window": 4096},
    # MixtralConfig (models/mixtral/configuration_mixtral.py): sliding_window None (no window).
    "mixtral": {**_MISTRAL, "num_local_experts": 8, "num_experts_per_tok": 2},
    # Qwen2Config (models/qwen2/configuration_qwen2.py): use_sliding_window False clears the
    # window (sliding_window = sliding_window if use_sliding_window else None), as vLLM reads it;
    # switched on, layers from max_window_layers on slide.
    "qwen2": {**_QWEN, "intermediate_size": 22_016, "num_key_value_heads": 32, "max_window_layers": 28},
    # Qwen3Config (models/qwen3/configuration_qwen3.py): Qwen2's, with head_dim 128.
    "qwen3": {
        **_QWEN,
        "intermediate_size": 22_016,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "attention_bias": False,
        "max_window_layers": 28,
    },
    # Qwen2MoeConfig (models/qwen2_moe/configuration_qwen2_moe.py). Its max_window_layers (28) is
    # left out: switched on, its window covers every other layer below it, a layout kvsim does not
    # read (sim.hf_config._attention_layout reads Qwen2's).
    "qwen2_moe": {
        **_QWEN,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "decoder_sparse_step": 1,
    },
    # Qwen3MoeConfig (models/qwen3_moe/configuration_qwen3_moe.py).
    "qwen3_moe": {
        **_QWEN,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "attention_bias": False,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "decoder_sparse_step": 1,
    },
    # CohereConfig (models/cohere/configuration_cohere.py): Command-R, Aya 23.
    "cohere": _COHERE,
    # Cohere2Config (models/cohere2/configuration_cohere2.py): Command-R7B, Command-A: CohereConfig's
    # defaults, and every 4th layer attends globally (its layer_types default from
    # sliding_window_pattern, default 4).
    "cohere2": {**_COHERE, "sliding_window": 4096, "sliding_window_pattern": 4},
    # Starcoder2Config (models/starcoder2/configuration_starcoder2.py): tie_word_embeddings True
    # (bigcode/starcoder2-15b's config sets false; the 3B and 7B tie theirs).
    "starcoder2": {
        "vocab_size": 49_152,
        "hidden_size": 3072,
        "intermediate_size": 12_288,
        "num_hidden_layers": 30,
        "num_attention_heads": 24,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    },
    # PhiConfig (models/phi/configuration_phi.py): Phi-1, Phi-1.5, Phi-2.
    "phi": {
        "vocab_size": 51_200,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    },
    # GPTNeoXConfig (models/gpt_neox/configuration_gpt_neox.py): Pythia, GPT-NeoX-20B.
    "gpt_neox": {
        "vocab_size": 50_432,
        "hidden_size": 6144,
        "intermediate_size": 24_576,
        "num_hidden_layers": 44,
        "num_attention_heads": 64,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "attention_bias": True,
    },
    # GPT2Config (models/gpt2/configuration_gpt2.py): GPT-2. Its own names (n_layer, n_embd,
    # n_head, n_positions; its attribute_map) are read into kvsim's by sim.hf_config._legacy_names;
    # n_inner None means 4 × n_embd (GPT2Block); multi-head (no KV-head field); tie_word_embeddings
    # is PretrainedConfig's default, True. The context default is kept under its own name,
    # n_positions, as a file gives it (sim.hf_config._legacy_names reads either name).
    "gpt2": _GPT2,
    # GPTBigCodeConfig (models/gpt_bigcode/configuration_gpt_bigcode.py): StarCoder, SantaCoder.
    # GPT-2's names and defaults; multi_query True (num_key_value_heads = 1 if multi_query else
    # n_head) and tie_word_embeddings True, both in its __init__.
    "gpt_bigcode": _GPT2,
    # FalconConfig (models/falcon/configuration_falcon.py): Falcon. num_kv_heads (default the
    # query heads) counts only with new_decoder_architecture; otherwise multi_query (default True)
    # means one KV head (FalconAttention). ffn_hidden_size None means 4 × hidden_size;
    # tie_word_embeddings is PretrainedConfig's default, True.
    "falcon": {
        "vocab_size": 65_024,
        "hidden_size": 4544,
        "num_hidden_layers": 32,
        "num_attention_heads": 71,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    },
}

#: ``model_type``s whose configs name the fields otherwise (GPT-2's ``n_layer``, Falcon's
#: ``ffn_hidden_size``) and whose decoders carry LayerNorms with biases (and, but for Falcon
#: with ``bias: false``, biases on every linear layer): :func:`sim.hf_config._legacy_names`
#: reads their names, :func:`sim.hf_config._param_count` counts the biases. The value: the
#: transformers module whose learned position embeddings (``n_positions × n_embd``) the
#: model has, else ``""`` (Falcon: rotary or ALiBi, nothing stored).
LEGACY_TYPES: dict[str, str] = {
    "gpt2": "GPT2Model.wpe",
    "gpt_bigcode": "GPTBigCodeModel.wpe",
    "falcon": "",
}

#: A multimodal wrapper's ``model_type`` -> the ``model_type`` of the config class it builds its
#: ``text_config`` with (``sub_configs``), for a ``text_config`` that does not name its own.
TEXT_TOWERS: dict[str, str] = {
    "gemma3": "gemma3_text",  # Gemma3Config.sub_configs["text_config"] = Gemma3TextConfig
}

#: ``model_type``s whose decoder MLP is two matrices, up and down (``2 × hidden × intermediate``),
#: not a gated three (gate, up, down: ``3 × hidden × intermediate``, every other architecture,
#: Llama's SwiGLU and Gemma's GeGLU alike). From each one's MLP class in transformers'
#: ``models/<name>/modeling_<name>.py``; ``hidden_act`` does not decide it (a Llama with
#: ``gelu`` is still gated) and transformers reads no ``mlp_type`` field.
UNGATED_MLP: dict[str, str] = {
    "starcoder2": "Starcoder2MLP: c_fc, c_proj",
    "phi": "PhiMLP: fc1, fc2",
    "gpt_neox": "GPTNeoXMLP: dense_h_to_4h, dense_4h_to_h",
    "gpt2": "GPT2MLP: c_fc, c_proj",
    "gpt_bigcode": "GPTBigCodeMLP: c_fc, c_proj",
    "falcon": "FalconMLP: dense_h_to_4h, dense_4h_to_h",
    "nemotron": "NemotronMLP: up_proj, down_proj (squared ReLU)",
}


def defaults_for(model_type: str) -> dict[str, int | bool]:
    """The config-class defaults of ``model_type`` (empty for an architecture not listed)."""
    return DEFAULTS.get(model_type, {})


def gated_mlp(model_type: str) -> bool:
    """Whether ``model_type``'s dense MLP has a gate projection (see :data:`UNGATED_MLP`)."""
    return model_type not in UNGATED_MLP
