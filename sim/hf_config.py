"""Hugging Face ``config.json`` files read into a :class:`~sim.catalog.ModelSpec`.

A scenario names one with ``model.hf_config`` (``kvsim run … --model PATH``): a local file
path, resolved like trace paths (absolute, relative to the scenario file, to ``scenarios/`` or
to the working directory), a folder holding ``config.json``, or the Hugging Face id of a
config shipped in ``scenarios/models/`` (``Qwen/Qwen3-32B``). Nothing is downloaded.

Read: ``num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads`` (default:
the query heads), ``head_dim`` (default ``hidden_size / num_attention_heads``),
``intermediate_size, vocab_size, tie_word_embeddings, max_position_embeddings``, the sliding
window (``sliding_window`` with ``use_sliding_window``/``max_window_layers`` as Qwen2 reads
them, ``layer_types``, ``sliding_window_pattern``), ``torch_dtype``/``dtype``, a nested
``text_config`` (vision-language models: the text tower is the model served), and the
quantisation: ``quantization_config`` in the file or a sibling ``<name>_hf_quant_config.json``
/ ``hf_quant_config.json`` (NVIDIA ModelOpt) give the weight dtype (fp8) and the KV-cache
dtype where one is declared (``kv_cache_scheme``, ``kv_cache_quant_algo``); a ModelOpt
quantisation's ``exclude_modules`` / ``ignore`` patterns are matched against each layer's linear
weights, and the weights they cover are counted in 16 bits (:attr:`ModelSpec.unquantized_params`;
:func:`_unquantized`), a pattern matching none of them said on stderr. A field the file
leaves out takes the default of the architecture's transformers config class where
:mod:`sim.hf_defaults` lists one (Gemma-3: ``sliding_window_pattern`` 6, ``head_dim`` 256,
``vocab_size`` 262,208, tied embeddings; Cohere: tied embeddings; Mistral: a 4096-token window;
Qwen2: ``use_sliding_window`` false), as transformers, and the engines that load configs through
it, do; a field given as ``null`` stays ``null``.

The model's context (:attr:`HfModel.context`, which bounds ``workload.max_model_len``) is derived
here as vLLM derives its largest ``max_model_len``: ``max_position_embeddings`` (or
``model_max_length``) times a linear, dynamic or YaRN ``rope_scaling`` factor (:func:`_context`).

``params`` is counted from the shapes: token embeddings, the LM head unless tied, per layer
the Q/K/V/O projections (``heads × head_dim`` wide, which need not equal ``hidden_size``:
Qwen3-32B has 64 × 128 = 8192 against a hidden size of 5120), the MLP (gate, up, down; up and
down alone for the architectures :data:`sim.hf_defaults.UNGATED_MLP` lists: StarCoder2, Phi-2,
GPT-NeoX), two norms (and Qwen3's and Gemma-3's per-head Q/K norms), the final norm; plus, for
Qwen2.5-VL and Qwen3-VL configs, the vision encoder (ViT blocks, patch and position embeddings,
patch mergers), whose weights sit in GPU memory too. Another vision encoder (SigLIP, Pixtral,
CLIP, MoonViT) is not counted, and ``kvsim run`` says so on stderr (:attr:`HfModel.warnings`).

GPT-2 (``gpt2``), GPTBigCode (``gpt_bigcode``: StarCoder, SantaCoder) and Falcon (``falcon``)
configs are read by their own names (``n_layer, n_embd, n_head, n_inner, n_positions``;
``multi_query``; Falcon's ``num_kv_heads``, ``new_decoder_architecture``, ``ffn_hidden_size``),
as transformers' GPT2Config, GPTBigCodeConfig and FalconConfig read them (:func:`_legacy_names`),
and their ``params`` count the LayerNorm and linear biases and GPT-2's learned position embeddings.

Mixture-of-experts feed-forwards are read into :class:`~sim.catalog.MoeSpec`: the expert count
(``num_experts``, ``num_local_experts``, ``n_routed_experts``), experts per token
(``num_experts_per_tok``, ``experts_per_token``, ``top_k_experts``), the expert width
(``moe_intermediate_size``, else ``intermediate_size``), shared experts
(``shared_expert_intermediate_size``, ``n_shared_experts`` × the expert or ``share_expert_dim``
width, ``shared_intermediate_size``) and which layers stay dense (``first_k_dense_replace``,
``mlp_only_layers``, ``decoder_sparse_step``); ``params`` then counts every expert and the routers.

Multi-head latent attention (``kv_lora_rank``, ``qk_rope_head_dim``, ``qk_nope_head_dim``,
``v_head_dim``, ``q_lora_rank``: DeepSeek-V3, Kimi-K2) is read into :class:`~sim.catalog.MlaSpec`:
a token caches ``kv_lora_rank + qk_rope_head_dim`` values per layer, and ``params`` counts the
low-rank projections.

Sparse attention over an indexer's top-k tokens (``index_topk``), chunked local attention,
linear-attention / state-space layers (``layer_types`` naming ``linear_attention`` or ``mamba``,
an ``attn_type_list`` with a 0, a ``linear_attn_config`` with ``kda_layers``,
``hybrid_override_pattern``, ``layers_block_type``, Jamba's ``attn_layer_period``, Bamba's
``attn_layer_indices``, any ``mamba_*`` field), per-layer block shapes and quantisations kvsim has
no dtype for are refused with one :class:`~sim.errors.ConfigError` line naming the field; so is a
malformed field (its name, value and what is allowed), and the file is read as
:func:`sim.inputs.load_json` reads input JSON (bounded size, UTF-8, nesting limit).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from sim.catalog import FULL, SLIDING, MlaSpec, ModelSpec, MoeSpec, check_kv_heads
from sim.errors import ConfigError
from sim.hf_defaults import LEGACY_TYPES, TEXT_TOWERS, defaults_for, gated_mlp
from sim.inputs import candidate_paths
from sim.limits import MAX_LAYERS
from sim.package_data import SCENARIO_DIR

KEY = "model.hf_config"
#: What a config's reading leaves out (:attr:`HfModel.warnings`): silent in library use (``sim/__init__.py``
#: gives the ``kvsim`` logger a null handler), ``warning: …`` on stderr from ``kvsim run``.
log = logging.getLogger("kvsim.model")
#: Configs shipped with kvsim, named ``<org>--<model>_config.json`` (``<org>/<model>`` on the Hub).
MODELS_DIR = SCENARIO_DIR / "models"

_SUFFIX = "_config.json"
_QUANT_SUFFIX = "_hf_quant_config.json"
_DENSE_ONLY = (
    "kvsim reads decoder-only transformers, dense or mixture-of-experts, with full, sliding-window or "
    "multi-head latent attention"
)


@dataclass(frozen=True)
class HfModel:
    """A config read: the shape, and the dtypes the checkpoint declares."""

    spec: ModelSpec
    #: ``bf16``, ``fp16`` or ``fp8`` (from the quantisation config, else ``torch_dtype``).
    weight_dtype: str
    #: ``fp8`` where the checkpoint declares an FP8 KV cache, else the 16-bit weight dtype.
    kv_dtype: str
    path: Path
    #: The file the quantisation came from (``None``: not quantised).
    quant_source: Path | None = None
    #: What the reading leaves out that changes the answer (a vision encoder not counted), said on
    #: stderr by ``kvsim run`` (:func:`apply_to_scenario` logs them on the ``kvsim`` logger).
    warnings: tuple[str, ...] = ()
    #: The longest sequence (tokens) the model serves, as vLLM derives its largest ``max_model_len``
    #: (:func:`_context`); ``None`` where the config gives no length (kvsim does not guess one).
    context: int | None = None

    @property
    def weights_label(self) -> str:
        """The weight dtype, with the routed experts' where the checkpoint quantises them apart:
        ``bf16 (mxfp4 experts)``."""
        experts = self.spec.moe.expert_dtype if self.spec.moe is not None else None
        return self.weight_dtype + (f" ({experts} experts)" if experts not in (None, self.weight_dtype) else "")


# --- finding the file -----------------------------------------------------------------------


def shipped_models() -> list[str]:
    """Hugging Face ids of the configs in ``scenarios/models/``."""
    out = []
    for p in sorted(MODELS_DIR.glob(f"*{_SUFFIX}")):
        if not p.name.endswith(_QUANT_SUFFIX):
            out.append(p.name[: -len(_SUFFIX)].replace("--", "/", 1))
    return out


def shipped_config(ident: str) -> Path | None:
    """The file of a shipped model's exact Hugging Face id (``Qwen/Qwen3-32B``), else ``None``; opens nothing."""
    if ident not in shipped_models():
        return None
    return MODELS_DIR / (ident.replace("/", "--", 1) + _SUFFIX)


def resolve_hf_config(ref: str, base_dir: str | Path | None = None) -> Path:
    """The ``config.json`` that ``ref`` names (see the module docstring), or a ConfigError."""
    for cand in candidate_paths(Path(str(ref)).expanduser(), base_dir or SCENARIO_DIR):
        if cand.is_file():
            return cand
        if cand.is_dir() and (cand / "config.json").is_file():
            return cand / "config.json"
    short = str(ref).strip().replace("/", "--", 1)
    hits = [
        q
        for q in MODELS_DIR.glob(f"*{_SUFFIX}")
        if not q.name.endswith(_QUANT_SUFFIX)
        and (
            q.name[: -len(_SUFFIX)].lower() == short.lower()
            or q.name[: -len(_SUFFIX)].split("--", 1)[-1].lower() == short.lower()
        )
    ]
    if len(hits) == 1:
        return hits[0]
    raise ConfigError(
        KEY,
        ref,
        "a config.json path (absolute, or relative to the scenario file, scenarios/ or the "
        f"working directory), a folder holding config.json, or a shipped model: "
        f"{', '.join(shipped_models()) or 'none'}",
    )


def model_section(model: str) -> dict:
    """A command line's ``--model``: a catalog name as ``model.name``, else a Hugging Face config
    (path or shipped id) as ``model.hf_config``."""
    from sim.catalog import MODELS

    if model in MODELS:
        return {"name": model}
    p = Path(model).expanduser()
    # A path given on the command line is relative to the working directory, not the scenario file.
    return {"hf_config": str(p.resolve()) if p.exists() else model}


def label_for(path: Path) -> str:
    """``Qwen/Qwen3-32B`` for ``Qwen--Qwen3-32B_config.json``; the folder name for ``config.json``;
    the file's stem for any other name (``phi-2`` for ``cfg/phi-2.json``)."""
    name = path.name
    if name == "config.json":
        return path.parent.name or path.stem
    if name.endswith(_SUFFIX):
        return name[: -len(_SUFFIX)].replace("--", "/", 1)
    return path.stem


# --- reading it -----------------------------------------------------------------------------


def read_hf_config(path: str | Path) -> HfModel:
    """Parse one config (cached per file, and per modification time of it and its quantisation siblings)."""
    path = Path(path)
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        raise ConfigError(KEY, str(path), "a readable config.json file") from None
    siblings = tuple(q.stat().st_mtime_ns if q.is_file() else -1 for q in _quant_files(path))
    return _read_cached(str(path), mtime, siblings)


@lru_cache(maxsize=64)
def _read_cached(path_str: str, _mtime_ns: int, _siblings: tuple[int, ...]) -> HfModel:
    path = Path(path_str)
    top = _load_json(path)
    text = top.get("text_config")
    if text is not None and not isinstance(text, dict):
        raise ConfigError(
            KEY, str(path), f"'text_config' must be a mapping (the text tower's config); got {_shown(text)!r}"
        )
    cfg = {**text} if isinstance(text, dict) else top
    # The architecture whose config class transformers builds the text tower with, and that
    # class's defaults for the fields the file leaves out (sim/hf_defaults.py).
    model_type = str(
        cfg.get("model_type") or (TEXT_TOWERS.get(str(top.get("model_type"))) if cfg is not top else None) or ""
    )
    if not model_type and cfg is not top:
        model_type = str(top.get("model_type") or "")
    defaults = defaults_for(model_type)
    if model_type in LEGACY_TYPES:
        legacy = _legacy_names(path, cfg, model_type, defaults)
        top, cfg = (legacy, legacy) if cfg is top else (top, legacy)
    _refuse_unsupported(path, top, cfg)

    def field(name: str, default=None):
        v = cfg.get(name)
        if v is None and cfg is not top:
            v = top.get(name)
        if v is None and name not in cfg and name not in top:
            v = defaults.get(name)
        return default if v is None else v

    def whole(name: str, minimum: int = 1, maximum: int | None = None, purpose: str = "") -> int:
        v = field(name)
        if v is None:
            raise ConfigError(KEY, str(path), f"a decoder-only transformer config.json with '{name}' ({_DENSE_ONLY})")
        return _int(path, field, name, minimum, purpose, maximum)

    # At most model.layers' cap: a per-layer layout is built before any capacity check.
    layers = whole("num_hidden_layers", maximum=MAX_LAYERS, purpose=" (the cap of model.layers)")
    hidden, heads = whole("hidden_size"), whole("num_attention_heads")
    kv_heads = whole("num_key_value_heads") if field("num_key_value_heads") is not None else heads
    mla = _mla(path, field)
    if mla is not None:
        head_dim = mla.nope_dim + mla.rope_dim  # the query/key head width attention computes with
    elif field("head_dim") is not None:
        head_dim = whole("head_dim")
    elif hidden % heads:
        raise ConfigError(
            KEY, str(path), f"'head_dim', or a hidden_size ({hidden}) divisible by num_attention_heads ({heads})"
        )
    else:
        head_dim = hidden // heads
    check_kv_heads(heads, kv_heads, KEY, str(path), "num_attention_heads", "num_key_value_heads")
    intermediate, vocab = whole("intermediate_size"), whole("vocab_size")
    max_position = whole("max_position_embeddings") if field("max_position_embeddings") is not None else 4096
    context = _context(path, field, model_type, str(top.get("model_type") or ""))
    tied = field("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ConfigError(KEY, str(path), f"'tie_word_embeddings' must be true or false; got {_shown(tied)!r}")
    # The text tower's own keys over its class's defaults (a key given as null stays null).
    arch = {**defaults, **cfg}
    layer_types, window = _attention_layout(path, arch, layers, model_type)

    weight16 = _dtype16(path, field("torch_dtype") or field("dtype"))
    moe = _moe(path, field, layers, intermediate)
    # A vision-language model may declare its quantisation with the text tower it applies to.
    qtop = top if isinstance(top.get("quantization_config"), dict) or cfg is top else cfg
    if _mxfp4(qtop):
        # gpt-oss: MXFP4 routed experts, everything else (attention, router, embeddings) 16-bit.
        if moe is None:
            raise ConfigError(
                KEY,
                str(path),
                "quantization_config: mxfp4 weights outside mixture-of-experts layers not supported yet "
                "(the mxfp4 experts of a mixture-of-experts model are)",
            )
        moe = replace(moe, expert_dtype="mxfp4")
    wq, kq, qsrc = _quantisation(path, qtop)
    block: tuple[int, int] | None = None
    if wq == "w4a16":
        # Kimi K2.5: 4-bit integer routed experts, everything else (attention, shared experts, dense
        # MLPs) 16-bit, as gpt-oss's MXFP4 experts are.
        if moe is None or not _experts_only(qtop.get("quantization_config") or {}, moe, layers):
            raise ConfigError(
                KEY,
                str(path),
                "quantization_config: 4-bit integer weights outside the routed experts of a mixture-of-experts "
                "model not supported yet (int4 routed experts with 16-bit attention, as Kimi K2.5's, are)",
            )
        moe = replace(moe, expert_dtype="w4a16")
        wq = None
    if wq == "fp8" and _block_scaled(qtop):
        # Block-scaled fp8 runs kernels of its own (DeepGEMM, TensorRT-LLM's block-scale GEMMs and
        # fused MoE), timed apart from per-tensor fp8 ones: each engine prices them from its block
        # table where it has one, from its per-tensor table where it does not (sim/cost/profile_model.py).
        wq = "fp8_block"
        block = _weight_block(path, qtop)
        if moe is not None:
            moe = replace(moe, expert_dtype="fp8_block")
    params, vision = _param_count(
        path, arch, top, layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, tied, model_type, moe, mla
    )
    notes = [f"Hugging Face config {path.name}"]
    warnings: list[str] = []
    kept = 0
    if wq is not None and wq not in _DTYPE16.values():
        # ModelOpt checkpoints keep the modules their exclusion list names in 16 bits (NVIDIA's NVFP4
        # DeepSeek-V3.1: every attention projection but o_proj; Kimi-K2.6: attention, shared experts
        # and layer 0), and the engines load them so: weight memory counts them at 2 bytes.
        patterns = _excluded_patterns(path, qtop)
        dense = _dense_layers(path, field, layers) if moe is not None else set()
        nextn = field("num_nextn_predict_layers")
        kept, covered, unmapped = _unquantized(
            patterns,
            layers,
            nextn if isinstance(nextn, int) and not isinstance(nextn, bool) and nextn > 0 else 0,
            vision > 0,
            lambda i: _layer_modules(
                model_type, arch, hidden, heads, kv_heads, head_dim, intermediate, i in dense, moe, mla
            ),
        )
        if kept:
            notes.append(f"{kept / 1e9:.2f}B weights left unquantised ({', '.join(covered)}) counted in 16 bits")
        if unmapped:
            shown = ", ".join(unmapped[:3]) + (f" and {len(unmapped) - 3} more" if len(unmapped) > 3 else "")
            warnings.append(
                f"{path.name}: {len(unmapped)} quantisation exclusion pattern(s) kvsim cannot map to the "
                f"model's weights ({shown}) are counted at the checkpoint's {wq}, so their 16-bit weights "
                "are understated"
            )
    vc = top.get("vision_config")
    if cfg is not top or (isinstance(vc, dict) and vc):
        notes.append(
            ("text tower of a vision-language model" if cfg is not top else "vision-language model")
            + (f"; vision encoder {vision / 1e9:.2f}B params counted" if vision else "; vision encoder not counted")
        )
        if not vision:
            kind = vc.get("model_type") if isinstance(vc, dict) else None
            warnings.append(
                f"{path.name}: vision encoder"
                + (f" ({kind})" if kind else "")
                + " not counted in params (kvsim counts Qwen2.5-VL and Qwen3-VL encoders only), so the "
                "memory left for KV is overstated by its weights; --set model.params=N gives the whole count"
            )
    if qsrc is not None:
        notes.append(f"quantisation from {qsrc.name}")
        if _block_scaled(qtop):
            notes.append("block-scaled fp8 weights (each engine's block-fp8 GEMMs where it timed them)")
    if mla is not None:
        notes.append(f"multi-head latent attention: {mla.latent_width} cached values per token and layer")
    if moe is not None:
        notes.append(
            f"mixture of experts: {moe.experts_per_token} of {moe.experts} experts per token on "
            f"{moe.moe_layers} of {layers} layers" + (f", {moe.expert_dtype} experts" if moe.expert_dtype else "")
        )
    if field("num_nextn_predict_layers"):
        notes.append("multi-token-prediction layers not counted (loaded only for speculative decoding)")
    spec = ModelSpec(
        name=label_for(path),
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        params=float(params),
        vocab=vocab,
        max_position=max_position,
        sliding_window=window,
        source="; ".join(notes),
        layer_types=layer_types,
        qk_norm=model_type.startswith(QK_NORM_TYPES),
        moe=moe,
        mla=mla,
        tied_embeddings=tied,
        unquantized_params=float(kept),
        weight_block=block,
    )
    weight = wq or weight16
    return HfModel(spec, weight, kq or weight16, path, qsrc, tuple(warnings), context)


def _load_json(path: Path) -> dict:
    """The file's JSON object: a bounded UTF-8 file, nested at most ``MAX_NESTING`` levels (sim/inputs.py)."""
    from sim.inputs import load_json, read_text

    doc = load_json(read_text(path, KEY, "config.json file"), KEY, str(path))
    if not isinstance(doc, dict):
        raise ConfigError(KEY, str(path), "a JSON object (a Hugging Face config.json)")
    return doc


def _shown(value):
    """``value`` for an error line: lists, mappings and strings longer than 40 characters cut short."""
    if isinstance(value, (list, dict, str)) and len(str(value)) > 40:
        return str(value)[:37] + "..."
    return value


# --- context length ---------------------------------------------------------------------------

#: ``rope_type``s whose factor vLLM does not stretch the context by (``_get_and_verify_max_len``):
#: Llama 3's and Phi-3's (``su`` is ``longrope``'s old name) already count it in
#: ``max_position_embeddings``.
UNSCALED_ROPE = ("su", "longrope", "llama3")


def _context(path: Path, field, model_type: str, top_type: str) -> int | None:
    """The model's context as vLLM derives its largest ``max_model_len`` from a config
    (``_get_and_verify_max_len``): ``max_position_embeddings`` (GPT-2's ``n_positions``; the
    architecture's default where the file leaves it out, :mod:`sim.hf_defaults`), replaced by a
    ``model_max_length`` the config gives (Command-R); then, unless the model is a Gemma-3 (whose
    131,072 counts its linear factor already), times the ``rope_scaling`` (transformers 5's
    ``rope_parameters``, per layer type or not) ``factor`` of every type but ``llama3``,
    ``longrope`` and ``su``, YaRN's counted from the ``original_max_position_embeddings`` in its
    block (else one beside it, else the length above, as transformers 5 fills it in): Qwen2.5 with YaRN
    factor 4 over 32,768 serves 131,072, Qwen3's 40,960 positions with the same block 131,072 too,
    Llama-3.1 131,072. ``None`` where the config gives no length (vLLM assumes 2048; kvsim does not
    check what it does not know)."""
    positions = field("max_position_embeddings")
    if positions is None:
        return None
    positions = _int(path, field, "max_position_embeddings", 1)
    if field("model_max_length") is not None:
        positions = _int(path, field, "model_max_length", 1, " (the context vLLM reads over max_position_embeddings)")
    key = "rope_scaling" if field("rope_scaling") else "rope_parameters"
    rope = field(key)
    if not rope or "gemma3" in model_type or "gemma3" in top_type:
        return positions
    if not isinstance(rope, dict):
        raise ConfigError(
            KEY, str(path), f"'{key}' must be a mapping (rope_type, factor, ...) or null; got {_shown(rope)!r}"
        )
    # transformers 5 nests one mapping per layer type (Gemma-3's full_attention, sliding_attention).
    nested = not ({"rope_type", "type", "factor"} & set(rope)) and all(
        isinstance(v, dict) or v is None for v in rope.values()
    )
    parts = [(f"{key}.{name}", v) for name, v in rope.items() if v is not None] if nested else [(key, rope)]
    base: float = positions
    factor: float = 1.0
    for where, rp in parts:
        kind = str(rp.get("rope_type") or rp.get("type") or "default")
        if kind in UNSCALED_ROPE:
            continue
        f = factor if rp.get("factor") is None else rp["factor"]  # "default" has none
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not f > 0:
            raise ConfigError(KEY, str(path), f"'{where}.factor' must be a number > 0; got {_shown(f)!r}")
        factor = float(f)
        if kind == "yarn":
            original = rp.get("original_max_position_embeddings", field("original_max_position_embeddings"))
            if original is not None:
                if isinstance(original, bool) or not isinstance(original, int) or original < 1:
                    raise ConfigError(
                        KEY,
                        str(path),
                        f"'{where}.original_max_position_embeddings' must be an integer >= 1; got {_shown(original)!r}",
                    )
                base = original
    return int(base * factor)


# --- GPT-2, GPTBigCode and Falcon names -------------------------------------------------------

#: GPT2Config's and GPTBigCodeConfig's names (their ``attribute_map``) -> the names kvsim reads.
_GPT2_NAMES = {
    "n_layer": "num_hidden_layers",
    "n_embd": "hidden_size",
    "n_head": "num_attention_heads",
    "n_positions": "max_position_embeddings",
}


def _legacy_names(path: Path, cfg: dict, model_type: str, defaults: dict) -> dict:
    """``cfg`` with a GPT-2, GPTBigCode or Falcon config's fields under the names kvsim reads, as
    transformers' GPT2Config, GPTBigCodeConfig and FalconConfig read them:

    * gpt2, gpt_bigcode: ``n_layer, n_embd, n_head, n_positions``; ``n_inner`` (null or absent:
      ``4 × n_embd``, GPT2Block/GPTBigCodeBlock); KV heads: GPT-2 the query heads, GPTBigCode
      one when ``multi_query`` (default true), else the query heads.
    * falcon: ``ffn_hidden_size`` (null or absent: ``4 × hidden_size``); KV heads:
      ``num_kv_heads`` (default the query heads) with ``new_decoder_architecture``, else one when
      ``multi_query`` (default true), else the query heads (FalconAttention).

    A field named both ways keeps the name kvsim reads; a malformed one is refused by its own name."""
    out = dict(cfg)

    def value(key: str, std: str):
        name = std if std in cfg else key
        v = cfg.get(name)
        if v is None and key not in cfg and std not in cfg:
            v = defaults.get(std, defaults.get(key))
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(KEY, str(path), f"'{name}' must be an integer >= 1; got {_shown(cfg.get(name))!r}")
        return v

    def flag(key: str, default: bool) -> bool:
        v = cfg.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise ConfigError(KEY, str(path), f"'{key}' must be true or false; got {_shown(v)!r}")
        return v

    if model_type == "falcon":
        hidden, heads = value("hidden_size", "hidden_size"), value("num_attention_heads", "num_attention_heads")
        ffn = value("ffn_hidden_size", "intermediate_size")
        if flag("new_decoder_architecture", False):
            kv = value("num_kv_heads", "num_key_value_heads") or heads
        else:
            kv = 1 if flag("multi_query", True) else heads
    else:
        for key, std in _GPT2_NAMES.items():
            if std not in cfg and value(key, std) is not None:
                out[std] = value(key, std)
        hidden, heads = value("n_embd", "hidden_size"), value("n_head", "num_attention_heads")
        ffn = value("n_inner", "intermediate_size")
        kv = 1 if model_type == "gpt_bigcode" and flag("multi_query", True) else heads
    if out.get("intermediate_size") is None and hidden is not None:
        out["intermediate_size"] = ffn or 4 * hidden
    if "num_key_value_heads" not in cfg and kv is not None:
        out["num_key_value_heads"] = kv
    return out


# --- what is not modelled -------------------------------------------------------------------

_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
_TOPK_KEYS = ("num_experts_per_tok", "experts_per_token", "top_k_experts", "moe_topk")
_SSM = "state-space (mamba) layers"
#: Fields that show layers other than attention, in the order they are named: the layout first
#: (which layers attend), then any ``mamba_*`` shape field (see :func:`_refuse_unsupported`).
_LINEAR_KEYS = {
    "linear_attn_config": "linear-attention layers",
    "attn_type_list": "linear-attention layers",
    "layers_block_type": _SSM,
    "hybrid_override_pattern": _SSM,
    "attn_layer_period": _SSM,  # Jamba: attention on every attn_layer_period-th layer, mamba on the rest
    "attn_layer_offset": _SSM,
    "attn_layer_indices": _SSM,  # Bamba, Falcon-H1: the attention layers, mamba on the rest
    "mamba_num_heads": _SSM,
    "ssm_cfg": _SSM,
}


def _refuse(path: Path, field: str, value, what: str):
    raise ConfigError(KEY, str(path), f"{field}={_shown(value)!r}: {what} not supported yet ({_DENSE_ONLY})")


def _linear_layers(path: Path, key: str, value) -> str | None:
    """What of ``value`` (a :data:`_LINEAR_KEYS` field) is not full attention: ``""`` when every layer
    it lists attends in full, ``"k of n"`` when some do not, ``None`` where the field's presence alone
    says the model has such layers (its convention names no all-attention form kvsim reads).

    * ``attn_type_list`` (MiniMax-Text-01, MiniMax-M2): one entry per layer, 0 lightning (linear)
      attention, 1 softmax (full) attention, as vLLM's ``minimax_text_01`` reads it; MiniMax-M2.5/M2.7
      list 1 on all 62 layers.
    * ``linear_attn_config`` (Kimi Linear, Kimi-K3): ``kda_layers`` lists the linear (KDA) layers."""
    if key == "attn_type_list":
        if not isinstance(value, list) or any(isinstance(t, bool) or t not in (0, 1) for t in value):
            raise ConfigError(
                KEY,
                str(path),
                f"'attn_type_list' must list 0 (linear attention) or 1 (full attention) per layer; "
                f"got {_shown(value)!r}",
            )
        linear = value.count(0)
        return f"{linear} of {len(value)}" if linear else ""
    if key == "linear_attn_config" and isinstance(value, dict) and isinstance(value.get("kda_layers"), list):
        kda = value["kda_layers"]
        return f"{len(kda)} (linear_attn_config.kda_layers)" if kda else ""
    return None


def _refuse_unsupported(path: Path, top: dict, cfg: dict) -> None:
    """One ConfigError for the first feature kvsim does not model (in either config level)."""
    levels = [cfg] if cfg is top else [cfg, top]

    def first(key: str):
        for level in levels:
            v = level.get(key)
            if v not in (None, False, 0, "", [], {}):
                return v
        return None

    if first("block_configs") is not None:
        blocks = first("block_configs")
        noop = sum(1 for b in blocks if isinstance(b, dict) and (b.get("attention") or {}).get("no_op"))
        mults = sorted(
            float(m)
            for m in {(b.get("ffn") or {}).get("ffn_mult") for b in blocks if isinstance(b, dict)}
            if isinstance(m, (int, float))
        )
        what = (
            (
                f"per-layer block shapes ({noop} of {len(blocks)} layers without attention, FFN multipliers "
                f"{mults[0]}-{mults[-1]}; one shape per layer is modelled) are"
            )
            if mults
            else "per-layer block shapes are"
        )
        raise ConfigError(KEY, str(path), f"block_configs: {what} not supported yet ({_DENSE_ONLY})")
    if first("attention_chunk_size") is not None:
        _refuse(path, "attention_chunk_size", first("attention_chunk_size"), "chunked local attention is")
    if first("sparse_attention_config") is not None:
        _refuse(path, "sparse_attention_config", first("sparse_attention_config"), "sparse attention is")
    if first("index_topk") is not None:
        _refuse(path, "index_topk", first("index_topk"), "sparse attention over an indexer's top-k tokens is")
    if first("q_lora_rank") is not None and first("kv_lora_rank") is None:
        _refuse(path, "q_lora_rank", first("q_lora_rank"), "compressed attention without a kv_lora_rank latent is")
    types = first("layer_types")
    if types is not None:
        if not isinstance(types, list):
            raise ConfigError(
                KEY,
                str(path),
                f"'layer_types' must be a list with one type per layer ({FULL} or {SLIDING}); got {_shown(types)!r}",
            )
        odd = sorted({str(t) for t in types} - {FULL, SLIDING})
        # Name the kind that is not attention: Granite-4.0-H lists "mamba" and "attention" layers.
        ssm = [t for t in odd if "mamba" in t.lower() or "ssm" in t.lower()]
        linear = [t for t in odd if "linear" in t.lower()]
        if odd:
            shown = (ssm or linear or odd)[0]
            kind = _SSM if ssm else "linear-attention layers" if linear else f"'{shown}' layers"
            _refuse(path, "layer_types", shown, f"{kind} are")
    for key, what in _LINEAR_KEYS.items():
        value = first(key)
        if value is None:
            continue
        which = _linear_layers(path, key, value)
        if which is None:
            _refuse(path, key, value, f"{what} are")
        elif which:
            _refuse(path, key, value, f"{which} {what} are")
    mamba = next((k for level in levels for k in level if k.startswith("mamba_") and first(k) is not None), None)
    if mamba is not None:  # Jamba, Bamba, Falcon-H1, Zamba: the state-space layers' shape
        _refuse(path, mamba, first(mamba), f"{_SSM} are")
    for key, base in (("global_head_dim", "head_dim"), ("num_global_key_value_heads", "num_key_value_heads")):
        v = first(key)
        if v is not None and v != first(base):
            _refuse(path, key, v, f"a {base} that differs between full and sliding layers ({first(base)}) is")
    if first("num_kv_shared_layers"):
        _refuse(path, "num_kv_shared_layers", first("num_kv_shared_layers"), "KV caches shared across layers are")
    if first("is_encoder_decoder"):
        _refuse(path, "is_encoder_decoder", True, "encoder-decoder models read from config.json are")


def _int(path: Path, field, key: str, minimum: int, purpose: str = "", maximum: int | None = None) -> int:
    """The config's integer ``key`` (``field`` reads it), at least ``minimum`` (and at most
    ``maximum`` where given), else a ConfigError naming it."""
    v = field(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum or (maximum is not None and v > maximum):
        what = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ConfigError(KEY, str(path), f"'{key}' must be an integer {what}{purpose}; got {_shown(v)!r}")
    return v


def _whole(path: Path, doc: dict, key: str, minimum: int, purpose: str = "") -> int:
    """``doc[key]``, an integer at least ``minimum``, else a ConfigError naming ``key`` and its value."""
    return _int(path, doc.get, key, minimum, purpose)


# --- mixture of experts ---------------------------------------------------------------------


def _moe(path: Path, field, layers: int, intermediate: int) -> MoeSpec | None:
    """The config's mixture-of-experts feed-forward (module docstring), ``None`` for a dense model."""

    def count(key: str, minimum: int) -> int:
        return _int(path, field, key, minimum)

    e_key = next((k for k in _MOE_KEYS if field(k) not in (None, 0)), None)
    if e_key is None:
        return None
    experts = count(e_key, 1)
    k_key = next((k for k in _TOPK_KEYS if field(k) is not None), None)
    if k_key is None:
        raise ConfigError(
            KEY, str(path), f"the experts each token is routed to ({' or '.join(_TOPK_KEYS)}) beside {e_key}"
        )
    top_k = count(k_key, 1)
    if top_k > experts:
        raise ConfigError(KEY, str(path), f"'{k_key}' ({top_k}) at most {e_key} ({experts})")
    width = count("moe_intermediate_size", 1) if field("moe_intermediate_size") is not None else intermediate
    shared = 0
    if field("shared_expert_intermediate_size"):
        shared = count("shared_expert_intermediate_size", 0)
    elif field("n_shared_experts"):
        each = count("share_expert_dim", 1) if field("share_expert_dim") is not None else width
        shared = count("n_shared_experts", 0) * each
    elif field("shared_intermediate_size"):
        shared = count("shared_intermediate_size", 0)
    dense = _dense_layers(path, field, layers)
    if len(dense) >= layers:
        return None  # every layer dense: the experts are never used
    return MoeSpec(experts, top_k, width, layers - len(dense), shared)


def _dense_layers(path: Path, field, layers: int) -> set[int]:
    """Indices of the layers of a mixture-of-experts model that keep the dense MLP."""

    def count(key: str, minimum: int) -> int:
        return _int(path, field, key, minimum)

    dense: set[int] = set()
    first_dense = field("first_k_dense_replace")
    if first_dense:
        dense.update(range(min(count("first_k_dense_replace", 0), layers)))
    only = field("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise ConfigError(KEY, str(path), f"'mlp_only_layers' must be a list of layer indices; got {only!r}")
    dense.update(i for i in only if 0 <= i < layers)
    step = field("decoder_sparse_step")
    if step not in (None, 0, 1):
        step = count("decoder_sparse_step", 1)
        dense.update(i for i in range(layers) if (i + 1) % step)
    return dense


# --- multi-head latent attention ------------------------------------------------------------


def _mla(path: Path, field) -> MlaSpec | None:
    """The config's multi-head latent attention (``kv_lora_rank`` and its head widths), else ``None``."""
    if field("kv_lora_rank") in (None, 0):
        return None

    def width(key: str) -> int:
        return _int(path, field, key, 1, " for multi-head latent attention")

    q = field("q_lora_rank")
    return MlaSpec(
        width("kv_lora_rank"),
        width("qk_rope_head_dim"),
        width("qk_nope_head_dim"),
        width("v_head_dim"),
        0 if q in (None, 0) else width("q_lora_rank"),
    )


# --- attention layout -----------------------------------------------------------------------


def _attention_layout(path: Path, cfg: dict, layers: int, model_type: str) -> tuple[tuple[str, ...], int | None]:
    """(per-layer types, window): ``()`` when every layer is alike (sliding iff a window is returned)."""
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False or window in (None, 0):
        window = None
    elif isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ConfigError(KEY, str(path), f"'sliding_window' must be a token count >= 1 or null; got {window!r}")
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ConfigError(
                KEY,
                str(path),
                f"'layer_types' must list one type per layer ({layers}); got "
                f"{len(types) if isinstance(types, list) else type(types).__name__}",
            )
        t = tuple(str(x) for x in types)
    elif window is None:
        return (), None
    elif cfg.get("sliding_window_pattern") is not None:
        # Gemma-3, Cohere2: every pattern-th layer attends globally, the others slide (layer i is
        # full attention when (i + 1) % pattern == 0, as transformers derives layer_types).
        n = _whole(path, cfg, "sliding_window_pattern", 1, " (every n-th layer attends globally)")
        t = tuple(FULL if (i + 1) % n == 0 else SLIDING for i in range(layers))
    elif cfg.get("use_sliding_window") and cfg.get("max_window_layers") is not None:
        # Qwen2/3: the first max_window_layers layers attend globally, the rest slide.
        n = _whole(path, cfg, "max_window_layers", 0, " (the layers from the first that attend globally)")
        t = tuple(FULL if i < n else SLIDING for i in range(layers))
    elif model_type == "gemma2":
        t = tuple(SLIDING if i % 2 == 0 else FULL for i in range(layers))
    else:
        return (), window  # Mistral: a window on every layer
    if SLIDING in t and window is None:
        raise ConfigError(KEY, str(path), "'sliding_window' (tokens) for its sliding_attention layers")
    if SLIDING not in t:
        return (), None
    if FULL not in t:
        return (), window
    return t, window


# --- dtypes ---------------------------------------------------------------------------------

_DTYPE16 = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    # Served in 16 bits: engines cast fp32 checkpoints down (vLLM's dtype "auto").
    "float32": "bf16",
    "float": "bf16",
}


def _dtype16(path: Path, name) -> str:
    if name is None:
        return "bf16"
    try:
        return _DTYPE16[str(name).removeprefix("torch.")]
    except KeyError:
        raise ConfigError(KEY, str(path), f"torch_dtype bfloat16, float16 or float32; got {name!r}") from None


def _quant_files(path: Path) -> list[Path]:
    if path.name == "config.json":
        return [path.parent / "hf_quant_config.json"]
    if path.name.endswith(_SUFFIX):
        return [path.with_name(path.name[: -len(_SUFFIX)] + _QUANT_SUFFIX), path.parent / "hf_quant_config.json"]
    return [path.parent / "hf_quant_config.json"]


def _quantisation(path: Path, top: dict) -> tuple[str | None, str | None, Path | None]:
    """(weight dtype, KV dtype, file) from ``quantization_config`` and/or a sibling hf_quant_config.json."""
    found: list[tuple[str | None, str | None, Path]] = []
    qc = top.get("quantization_config")
    if qc is not None and not isinstance(qc, dict):
        raise ConfigError(
            KEY, str(path), f"'quantization_config' must be a mapping (quant_method, ...); got {_shown(qc)!r}"
        )
    if isinstance(qc, dict) and qc:
        found.append((*_read_quant(path, qc, "quantization_config"), path))
    for q in _quant_files(path):
        if q.is_file():
            doc = _load_json(q)
            section = doc.get("quantization", doc)
            if isinstance(section, dict):
                found.append((*_read_quant(q, section, "quantization"), q))
            break
    if not found:
        return None, None, None
    weight = next((w for w, _, _ in found if w), None)
    kv = next((k for _, k, _ in found if k), None)
    for w, k, src in found:
        if (w and w != weight) or (k and k != kv):
            raise ConfigError(
                KEY,
                str(src),
                f"the same dtypes as {found[0][2].name} (weights {weight}, KV {kv}); got weights {w}, KV {k}",
            )
    return weight, kv, found[0][2]


def _mxfp4(top: dict) -> bool:
    qc = top.get("quantization_config")
    return isinstance(qc, dict) and str(qc.get("quant_method") or "").lower() == "mxfp4"


def _read_quant(path: Path, qc: dict, where: str) -> tuple[str | None, str | None]:
    """(weight dtype, KV dtype) one quantisation section declares; ConfigError for the ones kvsim lacks."""
    method = str(qc.get("quant_method") or "").lower()
    algo = str(qc.get("quant_algo") or "").lower()
    weight: str | None = None
    if method == "mxfp4":
        pass  # the experts only (ModelSpec.moe.expert_dtype); the other weights keep the 16-bit dtype
    elif method in ("fp8", "fbgemm_fp8") or algo == "fp8":
        weight = "fp8"
    elif algo == "nvfp4":
        weight = "nvfp4"  # NVIDIA Model Optimizer's NVFP4 checkpoints (hf_quant_config.json)
    elif method == "compressed-tensors" or "config_groups" in qc:
        groups = qc.get("config_groups") or {}
        if not isinstance(groups, dict):
            raise ConfigError(
                KEY,
                str(path),
                f"'{where}.config_groups' must be a mapping of group names to schemes ({{\"group_0\": "
                f'{{"weights": {{"num_bits": 8, "type": "float"}}}}}}); got {_shown(groups)!r}',
            )
        for name, group in groups.items():
            group = group or {}
            w = group.get("weights") if isinstance(group, dict) else group
            if not isinstance(group, dict) or not isinstance(w or {}, dict):
                raise ConfigError(
                    KEY,
                    str(path),
                    f"'{where}.config_groups.{name}' must be a mapping with a 'weights' mapping "
                    f"(num_bits, type); got {_shown(w)!r}",
                )
            w = w or {}
            if w.get("num_bits") == 8 and w.get("type") == "float":
                weight = "fp8"
            elif w.get("num_bits") == 4 and w.get("type") == "int" and not group.get("input_activations"):
                weight = "w4a16"  # weight-only: the caller checks that only routed experts carry it
            else:
                raise ConfigError(
                    KEY,
                    str(path),
                    f"{where}.config_groups weights {w.get('num_bits')}-bit "
                    f"{w.get('type')}: only fp8 weights are supported yet",
                )
    elif method or algo:
        raise ConfigError(
            KEY,
            str(path),
            f"{where}: quantisation {algo or method!r} not supported yet (fp8 or nvfp4 weights, fp8 KV cache)",
        )
    kv: str | None = None
    scheme = qc.get("kv_cache_scheme", qc.get("kv_cache_quant_algo"))
    if isinstance(scheme, dict):
        if scheme.get("num_bits") == 8 and scheme.get("type") == "float":
            kv = "fp8"
        else:
            raise ConfigError(
                KEY,
                str(path),
                f"{where}.kv_cache_scheme {scheme.get('num_bits')}-bit {scheme.get('type')}: "
                "only an fp8 KV cache is supported yet",
            )
    elif scheme:
        if str(scheme).lower() != "fp8":
            raise ConfigError(KEY, str(path), f"{where}: KV-cache quantisation {scheme!r} not supported yet (fp8 only)")
        kv = "fp8"
    return weight, kv


#: Module names of one decoder layer, as the Hugging Face implementations of DeepSeek-V3-style and
#: Qwen-MoE-style models name them, that a quantisation's ``ignore`` list is matched against.
_MODULES = {
    "attention": "model.layers.1.self_attn.q_proj",
    "dense": "model.layers.0.mlp.gate_proj",
    "shared": "model.layers.1.mlp.shared_experts.gate_proj",
    "expert": "model.layers.1.mlp.experts.0.gate_proj",
}


def _ignored(ignore: list, module: str) -> bool:
    """Whether compressed-tensors' ``ignore`` list (names, or ``re:`` patterns) leaves ``module`` unquantised."""
    for item in ignore:
        item = str(item)
        if item.startswith("re:"):
            try:
                if re.match(item[3:], module):
                    return True
            except re.error:
                continue  # a pattern Python cannot compile matches nothing
        if item == module or module.endswith("." + item):
            return True
    return False


def _experts_only(qc: dict, moe: MoeSpec, layers: int) -> bool:
    """Whether ``qc``'s quantised linear layers are the routed experts alone: attention, the shared
    experts and any dense MLP layers are in its ``ignore`` list."""
    ignore = qc.get("ignore") or []
    return (
        not _ignored(ignore, _MODULES["expert"])
        and _ignored(ignore, _MODULES["attention"])
        and (not moe.shared_intermediate or _ignored(ignore, _MODULES["shared"]))
        and (moe.moe_layers >= layers or _ignored(ignore, _MODULES["dense"]))
    )


def _excluded_patterns(path: Path, top: dict) -> list[str]:
    """The module-name patterns a ModelOpt quantisation leaves in 16 bits: ``ignore`` in a
    ``quantization_config`` whose ``quant_method`` is ``modelopt`` (or that carries ModelOpt's
    ``quant_algo``), and ``exclude_modules`` in it or in the sibling hf_quant_config.json."""
    out: list[str] = []
    sections: list[tuple[Path, str, dict]] = []
    qc = top.get("quantization_config")
    if isinstance(qc, dict) and (str(qc.get("quant_method") or "").lower() == "modelopt" or "quant_algo" in qc):
        sections.append((path, "quantization_config", qc))
    for q in _quant_files(path):
        if q.is_file():
            doc = _load_json(q)
            section = doc.get("quantization", doc)
            if isinstance(section, dict):
                sections.append((q, "quantization", section))
            break
    for src, where, section in sections:
        for key in ("exclude_modules", "ignore"):
            names = section.get(key)
            if names is None:
                continue
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ConfigError(
                    KEY,
                    str(src),
                    f"'{where}.{key}' must be a list of module names or glob patterns "
                    f'("model.layers.*.self_attn*"); got {_shown(names)!r}',
                )
            out.extend(n for n in names if n not in out)
    return out


#: How the Hugging Face implementations name a decoder layer's modules, under each of these prefixes
#: (a vision-language model's text tower is ``language_model``).
_LAYER_PREFIXES = ("model.layers.{i}.", "language_model.model.layers.{i}.", "model.language_model.layers.{i}.")
#: Weights kvsim counts in 16 bits already, or does not count: a pattern naming only these changes nothing.
_OUTSIDE_LAYERS = tuple(
    f"{pre}{name}"
    for pre in ("", "language_model.", "model.language_model.")
    for name in ("lm_head", "model.embed_tokens", "embed_tokens")
)
_VISION_NAMES = tuple(
    f"{pre}{tower}.blocks.0.attn.qkv"
    for pre in ("", "model.")
    for tower in ("visual", "vision_tower", "vision_model", "mm_projector", "multi_modal_projector")
)


def _glob(pattern: str) -> str:
    """A ModelOpt exclusion pattern as a regular expression: ``*`` any run of characters, the rest literal."""
    return ".*".join(re.escape(part) for part in pattern.split("*"))


def _layer_modules(
    model_type: str,
    cfg: dict,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    dense: bool,
    moe: MoeSpec | None,
    mla: MlaSpec | None,
) -> list[tuple[str, tuple[str, ...], int]]:
    """One decoder layer's linear weights: (group, names the implementations give the module, weights),
    the counts :func:`_param_count` sums (norms left out: a few kB a layer)."""
    if mla is not None:
        q_out = heads * (mla.nope_dim + mla.rope_dim)
        q = (
            [("self_attn.q_a_proj", hidden * mla.q_lora_rank), ("self_attn.q_b_proj", mla.q_lora_rank * q_out)]
            if mla.q_lora_rank
            else [("self_attn.q_proj", hidden * q_out)]
        )
        attn = q + [
            ("self_attn.kv_a_proj_with_mqa", hidden * mla.latent_width),
            ("self_attn.kv_b_proj", mla.kv_lora_rank * heads * (mla.nope_dim + mla.v_dim)),
            ("self_attn.o_proj", heads * mla.v_dim * hidden),
        ]
    else:
        bias = 1 if cfg.get("attention_bias") or model_type.startswith("qwen2") else 0
        attn = [
            ("self_attn.q_proj", (hidden + bias) * heads * head_dim),
            ("self_attn.k_proj", (hidden + bias) * kv_heads * head_dim),
            ("self_attn.v_proj", (hidden + bias) * kv_heads * head_dim),
            ("self_attn.o_proj", heads * head_dim * hidden),
        ]
    out: list[tuple[str, tuple[str, ...], int]] = [("attention", (name,), n) for name, n in attn]
    projections = ("gate_proj", "up_proj", "down_proj") if gated_mlp(model_type) else ("up_proj", "down_proj")
    if dense or moe is None:
        return out + [("dense MLP", (f"mlp.{p}",), hidden * intermediate) for p in projections]
    out.append(("routers", ("mlp.gate", "block_sparse_moe.gate"), moe.experts * hidden))
    if moe.shared_intermediate:
        out += [
            ("shared experts", (f"mlp.shared_experts.{p}", f"mlp.shared_expert.{p}"), hidden * moe.shared_intermediate)
            for p in ("gate_proj", "up_proj", "down_proj")
        ]
    if moe.expert_dtype is None:  # experts quantised apart keep the dtype the config gives them
        each = moe.experts * hidden * moe.expert_intermediate
        out += [
            ("routed experts", (f"mlp.experts.0.{p}", f"block_sparse_moe.experts.0.{w}"), each)
            for p, w in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2"))
        ]
    return out


def _unquantized(
    patterns: list[str],
    layers: int,
    extra_layers: int,
    vision_counted: bool,
    modules,
) -> tuple[int, list[str], list[str]]:
    """(weights the ``patterns`` keep in 16 bits, the groups they cover, the patterns kvsim cannot map).

    ``modules(i)`` lists layer ``i``'s linear weights (:func:`_layer_modules`); a routed expert's names
    stand for all of them. A pattern that matches only the LM head or embeddings (16-bit already), the
    ``extra_layers`` past the last (multi-token prediction, not counted) or an uncounted vision
    encoder changes nothing; one that matches none of these, or a counted vision encoder's names, is
    returned as unmapped (its weights stay at the checkpoint's dtype)."""
    if not patterns:
        return 0, [], []
    combined = re.compile("|".join(f"(?P<p{k}>{_glob(p)})" for k, p in enumerate(patterns)))
    hit: set[str] = set()
    groups: list[str] = []
    kept = 0
    for i in range(layers):
        prefixes = [pre.format(i=i) for pre in _LAYER_PREFIXES]
        for group, names, n in modules(i):
            match = next((m for pre in prefixes for name in names if (m := combined.fullmatch(pre + name))), None)
            if match is not None:
                assert match.lastgroup is not None
                hit.add(match.lastgroup)
                kept += n
                if group not in groups:
                    groups.append(group)
    known = list(_OUTSIDE_LAYERS) + ([] if vision_counted else list(_VISION_NAMES))
    for i in range(layers, layers + extra_layers):
        known += [pre.format(i=i) + names[0] for pre in _LAYER_PREFIXES for _, names, _ in modules(layers - 1)]
    unmapped = []
    for k, p in enumerate(patterns):
        if f"p{k}" in hit:
            continue
        rx = re.compile(_glob(p))
        if not any(rx.fullmatch(name) for name in known):
            unmapped.append(p)
    return kept, groups, unmapped


def _block_scaled(top: dict) -> bool:
    qc = top.get("quantization_config")
    return isinstance(qc, dict) and bool(qc.get("weight_block_size"))


def _weight_block(path: Path, top: dict) -> tuple[int, int]:
    """``(block_n, block_k)`` of a block-scaled checkpoint's ``weight_block_size``: which tensor-parallel
    degrees vLLM loads it at depends on them (:func:`sim.catalog.block_fp8_shard_problem`)."""
    size = top["quantization_config"]["weight_block_size"]
    if (
        not isinstance(size, list)
        or len(size) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)
    ):
        raise ConfigError(
            KEY,
            str(path),
            f"quantization_config.weight_block_size as two positive integers [block_n, block_k]; got {_shown(size)!r}",
        )
    return size[0], size[1]


# --- parameters -----------------------------------------------------------------------------


#: ``model_type`` prefixes of models that RMS-normalise each query and key head (a ``head_dim``
#: weight each, and two more kernels per layer in the step price: ``ModelSpec.qk_norm``).
QK_NORM_TYPES = ("qwen3", "gemma3")


def _param_count(
    path: Path,
    cfg: dict,
    top: dict,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    vocab: int,
    tied: bool,
    model_type: str,
    moe: MoeSpec | None = None,
    mla: MlaSpec | None = None,
) -> tuple[int, int]:
    """(all weights, of which vision encoder) counted from the shapes; a mixture-of-experts layer
    counts every routed expert, the shared experts and its router (``experts × hidden``). ``cfg``:
    the text tower's keys over its architecture's defaults; ``top``: the whole file."""
    embed = vocab * hidden * (1 if tied else 2)
    attn = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    if mla is not None:
        q_out = heads * (mla.nope_dim + mla.rope_dim)
        q = hidden * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * q_out if mla.q_lora_rank else hidden * q_out
        kv = hidden * mla.latent_width + mla.kv_lora_rank + mla.kv_lora_rank * heads * (mla.nope_dim + mla.v_dim)
        attn = q + kv + heads * mla.v_dim * hidden
    if cfg.get("attention_bias") or model_type.startswith("qwen2"):
        attn += (heads + 2 * kv_heads) * head_dim  # Q/K/V biases (Qwen2 always has them)
    # Gate, up, down; up and down alone where the architecture's MLP has no gate (sim/hf_defaults.py).
    mlp = (3 if gated_mlp(model_type) else 2) * hidden * intermediate
    norms = 2 * hidden + (2 * head_dim if model_type.startswith(QK_NORM_TYPES) else 0)
    final_norm = hidden
    if model_type in LEGACY_TYPES:
        # GPT-2, GPTBigCode, Falcon: LayerNorms with a bias (Falcon-7B's parallel attention has
        # one per layer, its new_decoder_architecture and sequential layouts two), biases on
        # every linear layer unless Falcon's `bias` is false, learned positions for GPT-2's kind.
        parallel = cfg.get("parallel_attn", True) and not cfg.get("new_decoder_architecture")
        norms = 2 * hidden * (1 if model_type == "falcon" and parallel else 2)
        final_norm = 2 * hidden
        if model_type != "falcon" or cfg.get("bias"):
            attn += (heads + 2 * kv_heads) * head_dim + hidden
            mlp += intermediate + hidden
        if LEGACY_TYPES[model_type]:
            embed += int(cfg.get("max_position_embeddings") or 0) * hidden
    text = embed + layers * (attn + norms) + final_norm
    if moe is None:
        text += layers * mlp
    else:
        per_moe = moe.experts * int(moe.expert_params(hidden)) + 3 * hidden * moe.shared_intermediate
        text += (layers - moe.moe_layers) * mlp + moe.moe_layers * (per_moe + moe.experts * hidden)
    vision = _vision_params(path, top.get("vision_config"), str(top.get("model_type") or ""))
    return text + vision, vision


def _vision_params(path: Path, vc, top_type: str = "") -> int:
    """A Qwen-VL vision encoder's weights: patch (and Qwen3-VL's position) embeddings, ViT blocks,
    patch mergers; 0 for an encoder of another shape (``vision_config`` without ``depth``,
    ``hidden_size`` and ``intermediate_size``: SigLIP, Pixtral, CLIP, MoonViT are not counted).

    Qwen2.5-VL (``fullatt_block_indexes``, or a ``qwen2_5_vl`` model): RMSNorms, a gated MLP with
    biases, a patch embedding without bias, no position embeddings (transformers'
    ``Qwen2_5_VisionTransformerPretrainedModel``). Qwen3-VL: LayerNorms, a two-matrix MLP with
    biases, a patch embedding with bias, learned position embeddings, DeepStack mergers."""
    if not isinstance(vc, dict) or any(vc.get(k) is None for k in ("depth", "hidden_size", "intermediate_size")):
        return 0

    def whole(key: str, default: int | None = None, minimum: int = 1) -> int:
        v = vc.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ConfigError(
                KEY, str(path), f"'vision_config.{key}' must be an integer >= {minimum}; got {_shown(v)!r}"
            )
        return v

    h, i, depth = whole("hidden_size"), whole("intermediate_size"), whole("depth")
    channels = whole("in_channels", vc.get("in_chans", 3))
    patch_in = channels * whole("temporal_patch_size", 1) * whole("patch_size", 14) ** 2
    merged = whole("spatial_merge_size", 2) ** 2 * h
    out = whole("out_hidden_size", h)
    if "fullatt_block_indexes" in vc or top_type.startswith("qwen2_5"):
        block = (4 * h * h + 4 * h) + (3 * h * i + 2 * i + h) + 2 * h  # attention, gated MLP, two RMSNorms
        merger = merged * merged + merged + merged * out + out + h  # RMSNorm, two linear layers
        return depth * block + patch_in * h + merger
    block = (4 * h * h + 4 * h) + (2 * h * i + i + h) + 4 * h  # attention, MLP (with biases), two LayerNorms
    pos = whole("num_position_embeddings", 0, 0) * h
    merger = merged * merged + merged + merged * out + out + 2 * h
    deepstack = vc.get("deepstack_visual_indexes") or []
    if not isinstance(deepstack, list):
        raise ConfigError(
            KEY,
            str(path),
            f"'vision_config.deepstack_visual_indexes' must be a list of layers; got {_shown(deepstack)!r}",
        )
    return depth * block + patch_in * h + h + pos + (1 + len(deepstack)) * merger


# --- scenarios ------------------------------------------------------------------------------


def apply_to_scenario(sc) -> None:
    """Resolve a validated scenario's ``model.hf_config`` in place: the file must exist and parse;
    ``model.name`` becomes the config's label unless the scenario gave one; ``weight_dtype`` and
    ``kv_dtype`` the scenario leaves unset come from the config (so the resolved scenario written
    to a run directory names them and reruns identically). Explicit values always win."""
    from sim.catalog import MODELS

    m = sc.model
    hf = read_hf_config(resolve_hf_config(m.hf_config, sc.base_dir))
    given = m.model_fields_set
    if "params" not in given:  # an explicit count replaces the one the warnings are about
        for line in hf.warnings:
            log.warning("%s", line)
    if "name" in given and m.name is not None and m.name != hf.spec.name:
        if m.name in MODELS or m.name == "custom":
            raise ConfigError(
                "model.name",
                m.name,
                f"a label, not a catalog model, when model.hf_config is given "
                f"({m.hf_config}): the config is the model. Drop model.name "
                "(kvsim run --model replaces the whole model section)",
            )
    else:
        m.name = hf.spec.name
    if "weight_dtype" not in given:
        m.weight_dtype = hf.weight_dtype
    if "kv_dtype" not in given:
        m.kv_dtype = hf.kv_dtype


def scenario_model(sc) -> ModelSpec:
    """The model of a scenario with ``model.hf_config``: the config's shape, explicit dims applied."""
    from dataclasses import fields, replace

    m = sc.model
    hf = read_hf_config(resolve_hf_config(m.hf_config, sc.base_dir))
    spec = hf.spec
    if spec.moe is not None and spec.moe.expert_dtype is not None and m.weight_dtype != hf.weight_dtype:
        # A weight dtype the scenario names over the checkpoint's (an NVFP4 build of an fp8 release):
        # the experts are served in it too, not in the format the config declares for them.
        spec = replace(spec, moe=replace(spec.moe, expert_dtype=None))
    if spec.unquantized_params and m.weight_dtype != hf.weight_dtype:
        # Another build of the model: the modules this checkpoint leaves in 16 bits are not known to be its.
        spec = replace(spec, unquantized_params=0.0)
    dims = {
        f.name: getattr(m, f.name)
        for f in fields(ModelSpec)
        if f.name != "name" and getattr(m, f.name, None) is not None
    }
    label = m.name or spec.name
    return replace(spec, **dims, name=label + ("*" if dims else ""))
