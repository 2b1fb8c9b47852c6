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
from functools import cache, lru_cache
from pathlib import Path

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
_TAGS = frozenset("instruct chat hf it base thinking fp8 fp4 nvfp4 dynamic static pertensor block bf16 kv".split())
#: Name parts of quantizations kvsim cannot price (weight-only integer formats, GGUF, bitsandbytes):
#: an id carrying one names a shape (:func:`model_key` drops them) but resolves to no model
#: (:func:`format_problem` says why), as a config declaring one is refused (``sim.hf_config``).
_UNPRICED_TAGS = frozenset(
    "awq gptq int4 int8 w4a16 w8a16 w4a8 w8a8 gguf bnb 4bit 8bit exl2 hqq aqlm marlin squeezellm eetq".split()
)
_DATE = re.compile(r"\d{4}")


def model_key(ident: str) -> str:
    """A model id reduced to what fixes its shape: the name without its organisation, in lower case,
    without the parts that name a tuning, a quantization or a dated re-release of the same weights
    (``-Instruct``, ``-FP8``, ``-FP8-Dynamic``, ``-Instruct-2507`` …, wherever they stand: Mixtral
    writes ``-Instruct-v0.1``) and with ``Meta-Llama`` written ``Llama``:
    ``nvidia/Llama-3.1-405B-Instruct-FP8`` and ``meta-llama/Meta-Llama-3.1-405B`` are both
    ``llama-3.1-405b``."""
    parts = _name_parts(ident)
    k = "-".join(
        p for i, p in enumerate(parts) if not (i and (p in _TAGS or p in _UNPRICED_TAGS or _DATE.fullmatch(p)))
    )
    return SAME_SHAPE.get(k, k)


def _name_parts(ident: str) -> list[str]:
    """The hyphen-separated parts of an id's name, without its organisation, in lower case, with
    ``Meta-Llama`` written ``Llama``."""
    return str(ident).strip().rsplit("/", 1)[-1].lower().replace("_", "-").removeprefix("meta-").split("-")


#: Name parts that say how the weights are quantized: an id that shares them exactly with a shipped
#: config of its shape is that checkpoint's format (``Qwen3-235B-A22B-Instruct-2507-FP8`` is
#: block-scaled fp8 as ``Qwen3-235B-A22B-FP8`` is).
_QUANT_TAGS = frozenset("fp8 fp4 nvfp4 dynamic static pertensor block kv".split())


def quant_tags(ident: str) -> frozenset[str]:
    """The quantisation words in a model id's name (``fp8``, ``dynamic``, ``kv``…; empty when none)."""
    return frozenset(_name_parts(ident)) & _QUANT_TAGS


def _org(ident: str) -> str:
    """The organisation of an id (``""`` without one), in lower case."""
    s = str(ident).strip()
    return s.rsplit("/", 1)[0].lower() if "/" in s else ""


def _tag_format(tags: frozenset[str]) -> tuple[str, str] | None:
    """(weight dtype, KV dtype) an id's quantization tags name by themselves, or ``None`` (no weight
    format among them): ``FP8`` (``-FP8-dynamic``, ``-FP8-Static`` …) per-tensor/per-channel fp8,
    ``FP8-block`` block-scaled fp8, ``FP4``/``NVFP4`` NVIDIA's 4-bit format. The KV cache stays
    16-bit unless the name says the checkpoint carries KV scales (``-FP8-KV``, Neural Magic's
    naming): a checkpoint quantizes its KV cache only with a scale for it, which most FP8 releases
    (compressed-tensors ``kv_cache_scheme: null``) do not have."""
    if tags & {"fp4", "nvfp4"}:
        weight = "nvfp4"
    elif "fp8" in tags:
        weight = "fp8_block" if "block" in tags else "fp8"
    else:
        return None
    return weight, "fp8" if "kv" in tags else "bf16"


def format_problem(ident: str) -> str | None:
    """Why an id of a shape kvsim has resolves to no model: it names a quantization kvsim cannot
    price (``Qwen/Qwen3-8B-AWQ``), or ``None``."""
    found = [p for p in _name_parts(ident)[1:] if p in _UNPRICED_TAGS]
    if not found or model_key(ident) not in _by_key():
        return None
    fmt = "-".join(found).upper()
    return (
        f"{ident}: {fmt} weights of {model_key(ident)}, a format kvsim cannot price (it prices bf16/fp16, "
        "fp8 per-tensor or block-scaled, and nvfp4 weights; bf16 or fp8 KV cache); pass --model "
        f"{model_key(ident)} to simulate the shape in bf16, or with --set model.weight_dtype=fp8 the nearest format"
    )


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


def model_of_id(ident: str, *, variants: bool = True, formats: bool = True) -> dict | None:
    """The scenario ``model`` section (``name`` of a catalog model, or ``hf_config`` of a shipped
    config) of a published id, or ``None``; ``variants``: also ids that name the same shape
    (:func:`model_key`). An id whose name carries a quantization kvsim cannot price (AWQ, GPTQ,
    INT4 …: :func:`format_problem`) is ``None``.

    ``formats``: a quantized variant runs its own format, as the id it is of does not say it: the
    format of a checkpoint of the same publisher with the same quantization tags (NVIDIA's FP8
    Llama releases quantize the KV cache too: ``nvidia/Llama-3.3-70B-Instruct-FP8`` is
    ``nvidia/Llama-3.1-70B-Instruct-FP8``'s format), else the format its tags name on the
    unquantized shape (:func:`_tag_format`: ``RedHatAI/Llama-3.1-8B-Instruct-FP8-dynamic`` is fp8
    weights and a bf16 KV cache). Without ``formats`` (a benchmark row, whose weights and KV
    columns set the format): the shipped config whose quantization tags are the id's where one is,
    else the shape's first id."""
    exact = _exact(ident)
    if exact is not None or not variants:
        return exact
    same = _by_key().get(model_key(ident))
    if not same or set(_name_parts(ident)[1:]) & _UNPRICED_TAGS:
        return None
    tags = quant_tags(ident)
    if not formats:
        quantized_alike = [i for i in same if tags and quant_tags(i) == tags]
        return _exact((quantized_alike or same)[0])
    fmt = _tag_format(tags)
    if fmt is None:
        return _exact(same[0])
    org = _org(ident)
    sibling = [i for i in same if quant_tags(i) == tags and _org(i) == org]
    if sibling:
        return _exact(sibling[0])
    # The publisher's recipe for these tags on another shape (NVIDIA's FP8 Llama releases), else the tags'.
    fmt = _publisher_format(org, tags) or fmt
    base = _exact(next((i for i in same if not quant_tags(i) and i not in CHECKPOINT_FORMATS), same[0]))
    assert base is not None  # every id of _by_key is exact
    keep = {k: v for k, v in base.items() if k not in ("weight_dtype", "kv_dtype")}
    return {**keep, "weight_dtype": fmt[0], "kv_dtype": fmt[1]}


def _publisher_format(org: str, tags: frozenset[str]) -> tuple[str, str] | None:
    """(weight dtype, KV dtype) of the checkpoints kvsim knows (:data:`CHECKPOINT_FORMATS`, shipped
    configs) that ``org`` published with exactly these quantization tags, where they all agree
    (``nvidia`` and ``FP8``: fp8 weights and KV cache), else ``None``."""
    if not org:
        return None
    found = {
        _checkpoint_format(i) for ids in _by_key().values() for i in ids if _org(i) == org and quant_tags(i) == tags
    }
    found.discard(None)
    return found.pop() if len(found) == 1 else None


@cache
def _checkpoint_format(ident: str) -> tuple[str, str] | None:
    """(weight dtype, KV dtype) of a quantized id kvsim knows exactly (``None`` for another)."""
    if not quant_tags(ident):
        return None
    if ident in CHECKPOINT_FORMATS:
        return CHECKPOINT_FORMATS[ident]
    from sim.hf_config import read_hf_config, resolve_hf_config, shipped_config

    if shipped_config(ident) is None:
        return None
    hf = read_hf_config(resolve_hf_config(ident))
    return hf.weight_dtype, hf.kv_dtype


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
    if not target or target == ident or _local_config(str(target)) or _exact(ident) is not None:
        return None
    dtypes = "bf16 weights"
    if "weight_dtype" in section:
        # A shape in the format its publisher's checkpoints with these tags have, or the one its tags name.
        dtypes = f"{section['weight_dtype']} weights" + (f", {section['kv_dtype']} KV cache" if with_kv else "")
        fmt = (section["weight_dtype"], section["kv_dtype"])
        same = sorted(
            i
            for ids in _by_key().values()
            for i in ids
            if _org(i) == _org(ident) and quant_tags(i) == quant_tags(ident) and _checkpoint_format(i) == fmt
        )
        if same:
            dtypes += f" (the format of {same[0]})"
        elif _tag_format(quant_tags(ident)) == fmt and not with_kv:
            dtypes += " (the format its name's tags give)"
        elif _tag_format(quant_tags(ident)) == fmt:
            dtypes += (
                " (the format its name's tags give; -KV: a checkpoint with a KV cache scale)"
                if section["kv_dtype"] == "fp8"
                else " (the format its name's tags give; 16-bit KV: no KV cache scale of the checkpoint is known)"
            )
        return f"{ident}: no config of it ships; simulated with the shape of {target}, {dtypes} ({hint})"
    elif section.get("hf_config"):
        from sim.hf_config import read_hf_config, resolve_hf_config

        hf = read_hf_config(resolve_hf_config(section["hf_config"]))
        dtypes = f"{hf.weights_label} weights" + (f", {hf.kv_dtype} KV cache" if with_kv else "")
    return f"{ident}: no config of it ships; simulated with the shape of {target} and its {dtypes} ({hint})"


def _local_config(target: str) -> bool:
    """Whether a section's ``hf_config`` is a local config: a ``.json`` file, or a folder holding
    one (``--model DIR/``, resolved without its slash), rather than an id matched to a shipped shape."""
    return target.endswith(".json") or Path(target).expanduser().is_dir()


def section_of(ident: str, base_dir=None, *, absolute: bool = False, formats: bool = False) -> dict | None:
    """The scenario ``model`` section for a published id or a ``config.json`` path, or ``None``:
    the id exactly (:func:`model_of_id` without variants), else a config file or a folder holding
    one (relative: to ``base_dir``, ``scenarios/`` or the working directory; written as given, or as
    an absolute path with ``absolute``), else an id of the same shape. A path wins over a same-shape
    guess, so a local config of a fine-tune is read rather than matched to its base model. ``formats``:
    a quantized variant runs its own format (:func:`model_of_id`); a benchmark row's columns set it."""
    from sim.errors import ConfigError
    from sim.hf_config import resolve_hf_config

    exact = model_of_id(ident, variants=False)
    if exact is not None:
        return exact
    try:
        path = resolve_hf_config(ident, base_dir)
    except ConfigError:
        return model_of_id(ident, formats=formats)
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
