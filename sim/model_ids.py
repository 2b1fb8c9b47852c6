"""Published model ids as shapes kvsim has.

Benchmark files and result JSONs name a model by its Hugging Face id (``meta-llama/Llama-3.1-8B-Instruct``,
``nvidia/Llama-3.1-405B-Instruct-FP8``); kvsim simulates a shape: a catalog model (``sim.catalog``) or a
shipped ``config.json`` (``scenarios/models``). :func:`model_of_id` maps one to the other: exactly
(:data:`MODEL_IDS`, a shipped config's id, a catalog name), else by :func:`model_key`, the id without
its organisation and without the tags that name a tuning or quantization of the same weights. It never
guesses across sizes or versions: an id whose key matches no shape is ``None``.
"""

from __future__ import annotations

import re
from functools import lru_cache

from sim.catalog import MODELS

#: Hugging Face ids of checkpoints whose shape is a catalog model (the FP8 variants have the same
#: shape; their format is in :data:`CHECKPOINT_FORMATS`).
MODEL_IDS = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Meta-Llama-3.1-70B": "llama-3.1-70b",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "nvidia/Llama-3.1-70B-Instruct-FP8": "llama-3.1-70b",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "Qwen/Qwen3-32B-FP8": "qwen3-32b",
    "Qwen/Qwen3-8B": "qwen3-8b",
    "Qwen/Qwen3-8B-FP8": "qwen3-8b",
    "Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b",
}

#: (weight dtype, KV cache dtype) of the quantized checkpoints in :data:`MODEL_IDS`, which run that
#: format as a shipped config's id runs its own (no config of them ships, so it is written here, the
#: same as their shipped siblings'): NVIDIA's ModelOpt FP8 Llama 3.1 releases quantize the linear
#: layers and the KV cache per tensor (``hf_quant_config.json``: ``quant_algo`` and
#: ``kv_cache_quant_algo`` FP8, as ``nvidia/Llama-3.1-70B-Instruct-FP8``'s shipped one); Qwen's
#: Qwen3 FP8 releases are block-scaled fp8 weights (``quantization_config``: ``fp8``,
#: ``weight_block_size`` [128, 128]) with a 16-bit KV cache, as ``Qwen/Qwen3-32B-FP8``'s shipped
#: config. The ids whose config ships are listed too; a test checks the two agree, and that every
#: quantized id here has its format.
CHECKPOINT_FORMATS: dict[str, tuple[str, str]] = {
    "nvidia/Llama-3.1-8B-Instruct-FP8": ("fp8", "fp8"),
    "nvidia/Llama-3.1-70B-Instruct-FP8": ("fp8", "fp8"),
    "Qwen/Qwen3-8B-FP8": ("fp8_block", "bf16"),
    "Qwen/Qwen3-32B-FP8": ("fp8_block", "bf16"),
}

#: Releases with another name and the same shape (hidden size, layers, heads, MLP, vocabulary):
#: Llama 3.3 70B is Llama 3.1 70B retrained, and Llama 3 is Llama 3.1 with a shorter context;
#: Nemotron-70B is a Llama 3.1 70B fine-tune; Mistral-7B v0.1 is the catalog's ``mistral-7b`` (its
#: 4096-token sliding window; v0.2 and later have none); DeepSeek-V3.1 is DeepSeek-V3's architecture.
SAME_SHAPE = {
    "llama-3.3-70b": "llama-3.1-70b",
    "llama-3-8b": "llama-3.1-8b",
    "llama-3-70b": "llama-3.1-70b",
    "llama-3.1-nemotron-70b": "llama-3.1-70b",
    "mistral-7b-v0.1": "mistral-7b",
    # DeepSeek-V3.1 (and its Terminus update) is DeepSeek-V3's architecture, released in the same
    # block-scaled fp8; without this its id would find only NVIDIA's NVFP4 re-release of it.
    "deepseek-v3.1": "deepseek-v3",
    "deepseek-v3.1-terminus": "deepseek-v3",
    # DeepSeek-R1's distillations are fine-tunes of these bases (Qwen2.5-Math-7B has Qwen2.5-7B's shape).
    "deepseek-r1-distill-llama-8b": "llama-3.1-8b",
    "deepseek-r1-distill-llama-70b": "llama-3.1-70b",
    "deepseek-r1-distill-qwen-7b": "qwen2.5-7b",
    "deepseek-r1-distill-qwen-14b": "qwen2.5-14b",
    "deepseek-r1-distill-qwen-32b": "qwen2.5-32b",
}
#: Name parts that say how the same weights were tuned, quantized or re-released (a date such as
#: Qwen3's ``-2507`` or DeepSeek-V3's ``-0324``), not what shape they have.
_TAGS = frozenset("instruct chat hf it base thinking fp8 fp4 nvfp4 dynamic static pertensor block bf16".split())
_DATE = re.compile(r"\d{4}")


def model_key(ident: str) -> str:
    """A model id reduced to what fixes its shape: the name without its organisation, in lower case,
    without the parts that name a tuning, a quantization or a dated re-release of the same weights
    (``-Instruct``, ``-FP8``, ``-FP8-Dynamic``, ``-Instruct-2507`` …, wherever they stand: Mixtral
    writes ``-Instruct-v0.1``) and with ``Meta-Llama`` written ``Llama``:
    ``nvidia/Llama-3.1-405B-Instruct-FP8`` and ``meta-llama/Meta-Llama-3.1-405B`` are both
    ``llama-3.1-405b``."""
    parts = _name_parts(ident)
    k = "-".join(p for i, p in enumerate(parts) if not (i and (p in _TAGS or _DATE.fullmatch(p))))
    return SAME_SHAPE.get(k, k)


def _name_parts(ident: str) -> list[str]:
    """The hyphen-separated parts of an id's name, without its organisation, in lower case, with
    ``Meta-Llama`` written ``Llama``."""
    return str(ident).strip().rsplit("/", 1)[-1].lower().replace("_", "-").removeprefix("meta-").split("-")


#: Name parts that say how the weights are quantized: an id that shares them exactly with a shipped
#: config of its shape is that checkpoint's format (``Qwen3-235B-A22B-Instruct-2507-FP8`` is
#: block-scaled fp8 as ``Qwen3-235B-A22B-FP8`` is).
_QUANT_TAGS = frozenset("fp8 fp4 nvfp4 dynamic static pertensor block".split())


def _quant_tags(ident: str) -> frozenset[str]:
    return frozenset(_name_parts(ident)) & _QUANT_TAGS


@lru_cache(maxsize=1)
def _by_key() -> dict[str, list[str]]:
    """:func:`model_key` → the ids of the shape it names, in order of preference: the shipped
    configs' ids (unquantized first), then the ids of catalog shapes, then the catalog names."""
    from sim.hf_config import shipped_models

    out: dict[str, list[str]] = {}
    for ident in [*sorted(shipped_models(), key=len), *MODEL_IDS, *MODELS]:
        out.setdefault(model_key(ident), []).append(ident)
    return out


def _exact(ident: str) -> dict | None:
    from sim.hf_config import shipped_config

    if shipped_config(ident) is not None:
        return {"name": None, "hf_config": ident}
    if ident in MODEL_IDS:
        fmt = CHECKPOINT_FORMATS.get(ident)
        return {"name": MODEL_IDS[ident], **({"weight_dtype": fmt[0], "kv_dtype": fmt[1]} if fmt else {})}
    if ident in MODELS:
        return {"name": ident}
    return None


def model_of_id(ident: str, *, variants: bool = True) -> dict | None:
    """The scenario ``model`` section (``name`` of a catalog model, or ``hf_config`` of a shipped
    config) of a published id, or ``None``; ``variants``: also ids that name the same shape
    (:func:`model_key`), as the shipped config whose quantization tags are the id's where one is,
    else the shape's first id (unquantized)."""
    exact = _exact(ident)
    if exact is not None or not variants:
        return exact
    same = _by_key().get(model_key(ident))
    if not same:
        return None
    tags = _quant_tags(ident)
    quantized_alike = [i for i in same if tags and _quant_tags(i) == tags]
    return _exact((quantized_alike or same)[0])


def model_argument(model: str) -> dict:
    """A command line's ``--model`` (:func:`sim.hf_config.model_section`), or the shape a variant id
    names where it is neither a catalog model, a path nor a shipped id
    (``Qwen/Qwen3-30B-A3B-Instruct-2507``: :func:`model_of_id`)."""
    from sim.hf_config import model_section, shipped_config

    section = model_section(model)
    if section.get("hf_config") == model and shipped_config(model) is None:
        same = model_of_id(model)
        if same is not None:
            return same
    return section


#: How a ``kvsim run`` user picks another format than the one a variant's config brings.
RUN_FORMAT_HINT = "--set model.weight_dtype=... / model.kv_dtype=... for another format"


def variant_note(ident: str, section: dict, hint: str = RUN_FORMAT_HINT, with_kv: bool = True) -> str | None:
    """One line saying which shipped shape a variant id was simulated as, and the dtypes it brings
    (a quantised re-release brings its own), or ``None`` where ``section`` is ``ident`` itself.
    ``hint`` closes the line: how to choose another format where the note is read; ``with_kv``:
    name the config's KV cache dtype too (a benchmark row's follows its engine instead)."""
    target = section.get("hf_config") or section.get("name")
    if not target or target == ident or str(target).endswith(".json") or _exact(ident) is not None:
        return None
    dtypes = "bf16 weights"
    if "weight_dtype" in section:
        # A catalog shape in the format of a quantized id of it (CHECKPOINT_FORMATS).
        dtypes = f"{section['weight_dtype']} weights" + (f", {section['kv_dtype']} KV cache" if with_kv else "")
        same = [i for i in CHECKPOINT_FORMATS if MODEL_IDS.get(i) == target and _quant_tags(i) == _quant_tags(ident)]
        if same:
            dtypes += f" (the format of {same[0]})"
    if section.get("hf_config"):
        from sim.hf_config import read_hf_config, resolve_hf_config

        hf = read_hf_config(resolve_hf_config(section["hf_config"]))
        dtypes = f"{hf.weights_label} weights" + (f", {hf.kv_dtype} KV cache" if with_kv else "")
    return f"{ident}: no config of it ships; simulated with the shape of {target} and its {dtypes} ({hint})"


def section_of(ident: str, base_dir=None, *, absolute: bool = False) -> dict | None:
    """The scenario ``model`` section for a published id or a ``config.json`` path, or ``None``:
    the id exactly (:func:`model_of_id` without variants), else a config file or a folder holding
    one (relative: to ``base_dir``, ``scenarios/`` or the working directory; written as given, or as
    an absolute path with ``absolute``), else an id of the same shape. A path wins over a same-shape
    guess, so a local config of a fine-tune is read rather than matched to its base model."""
    from sim.errors import ConfigError
    from sim.hf_config import resolve_hf_config

    exact = model_of_id(ident, variants=False)
    if exact is not None:
        return exact
    try:
        path = resolve_hf_config(ident, base_dir)
    except ConfigError:
        return model_of_id(ident)
    return {"name": None, "hf_config": str(path.resolve()) if absolute else ident}


def known_shapes() -> list[str]:
    """The shapes ids can name (their :func:`model_key`), sorted."""
    return sorted(_by_key())


def known_ids() -> str:
    """What an unknown id is told it may be (the end of a ConfigError's message)."""
    return (
        "the Hugging Face id (any organisation; -Instruct, -FP8 and like variants too) of a model kvsim "
        f"has the shape of: {', '.join(known_shapes())}"
    )
