"""End-to-end serving benchmarks: read them, simulate every run as kvsim sees it, and score it.

A benchmark row is one closed-loop run on a real server: ``concurrency`` clients each send a
request of ``isl`` prompt and ``osl`` output tokens and send the next when it finishes; the
benchmark reports the mean time to first token and time per output token. Two formats are read:

* CSV with ``model, gpu, engine, tp, isl, osl, concurrency, ttft_ms, tpot_ms`` and optional
  ``weights`` (``bf16``, ``fp16``, ``fp8``, ``fp8_block``, ``nvfp4``, ``mxfp4``, ``w4a16``; unset: the checkpoint's, as a
  shipped or given config declares them, else bf16), ``kv`` (the KV cache's dtype, ``bf16``,
  ``fp16`` or ``fp8``; unset: the engine's default, :func:`default_kv`), ``engine_version``, ``source_id``: the
  layout of ``calibration/data/serving-bench/silicon_dense_train.csv``. ``model`` is a Hugging
  Face id kvsim knows, a catalog model, or a ``config.json`` path (relative: to the CSV's folder);
  it is checked when the file is read;
* the JSON ``vllm bench serve --save-result`` (or SGLang's ``bench_serving``) writes: one file,
  one run per line (``--append-result``, ``.jsonl``), or a folder of them (other JSON skipped):
  the model id (or ``--model``), ``max_concurrency`` (a run at a finite ``request_rate`` or
  ramped up is refused: not a closed loop), the mean TTFT/TPOT and the token totals give a row;
  the engine is the one its ``backend`` names unless the command line names one; the GPU and
  tensor parallelism come from the command line (the file does not record them).

:func:`row_scenario` turns a row into a kvsim scenario (closed loop, fixed lengths, the engine
preset of the row's engine with its server defaults, the benchmark's clients), :func:`simulate_row`
runs it and averages TTFT and TPOT over the requests after each client's warm-up requests, as
benchmark clients do; :func:`score` gives per-row and per-group errors. No torch.
"""

from __future__ import annotations

import csv
import difflib
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from sim.catalog import GPUS, find_gpu
from sim.config import APART_SPREAD_CYCLES
from sim.engine_presets import ENGINE_BLOCK_SIZE, default_kv, get_preset, normalize_engine
from sim.errors import ConfigError, quote
from sim.hf_config import HfModel, read_hf_config, resolve_hf_config
from sim.model_ids import known_ids, section_of

#: The training file shipped with kvsim (aiconfigurator-core 0.12.0, Apache-2.0).
TRAINING_FILE = Path(__file__).resolve().parent / "data" / "serving-bench" / "silicon_dense_train.csv"

REQUIRED = ("model", "gpu", "engine", "tp", "isl", "osl", "concurrency", "ttft_ms", "tpot_ms")
#: The other columns kvsim reads (any other is left alone).
OPTIONAL = (
    "weights",
    "kv",
    "engine_version",
    "source_id",
    "max_num_seqs",
    "max_num_batched_tokens",
    "mixed_batches",
    "cuda_graph_max_batch",
    "requests",
    "start_spread_cycles",
    "kv_cache_tokens",
    "cached_prompt_tokens",
    "schedule_ahead",
)
WEIGHTS = ("bf16", "fp16", "fp8", "fp8_block", "nvfp4", "mxfp4", "w4a16")
#: Weights that name a checkpoint's quantised routed experts (the rest 16-bit), with the model that
#: publishes them; a row may give them only for a checkpoint that declares them.
EXPERT_WEIGHTS = {"mxfp4": "gpt-oss", "w4a16": "Kimi K2.5"}
KV_DTYPES = ("bf16", "fp16", "fp8")
ENGINES = ("vllm", "sglang", "trtllm")

#: Benchmark system names (aiconfigurator's) and catalog names of GPUs.
GPU_IDS = {
    "h100_sxm": "H100-SXM-80GB",
    "h200_sxm": "H200-SXM-141GB",
    "a100_sxm": "A100-SXM-80GB",
    "b200_sxm": "B200-SXM-180GB",
    "gb200_sxm": "GB200-186GB",
    "b300_sxm": "B300-SXM-288GB",
    "gb300_sxm": "GB300-288GB",
    "l40s": "L40S",
}


#: Other spellings of the weights and KV-cache dtypes (Hugging Face ``torch_dtype`` names, FP8's format).
DTYPE_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float8": "fp8",
    "fp8_e4m3": "fp8",
    "e4m3": "fp8",
    "fp8_e4m3fn": "fp8",
    "e4m3fn": "fp8",
    "float8_e4m3fn": "fp8",
    # E5M2 (vLLM's --kv-cache-dtype fp8_e5m2, torch's float8_e5m2) holds a byte a value too, priced as fp8.
    "fp8_e5m2": "fp8",
    "float8_e5m2": "fp8",
    "e5m2": "fp8",
    "fp8_static": "fp8",
    "fp8_dynamic": "fp8",
    "fp8_per_tensor": "fp8",
    "fp8-block": "fp8_block",
    "fp8_blockwise": "fp8_block",
    "fp4": "nvfp4",
    "w4a16_mxfp4": "mxfp4",
    # The engines' "auto": weights as the checkpoint has them, the KV cache as the engine makes it of
    # them (:func:`default_kv`): what an empty cell means.
    "auto": "",
}


def _spellings(allowed: Iterable[str]) -> str:
    """The other spellings :data:`DTYPE_ALIASES` reads as one of ``allowed``, for an error message."""
    keep = set(allowed)
    return ", ".join(k for k, v in DTYPE_ALIASES.items() if v in keep)


def normalize_gpu(name: str) -> str | None:
    """The benchmark system name (:data:`GPU_IDS`) or catalog GPU that ``name`` spells, or ``None``.

    A system name in any case is itself; a catalog name in any case is the catalog's; another
    spelling :func:`sim.catalog.find_gpu` matches (``H100``, ``NVIDIA H100 80GB HBM3``) is the
    system name of its card where there is one (``A100-SXM4-40GB`` is the catalog's ``A100-40GB``:
    the system ``a100_sxm`` is the 80 GB part).
    """
    s = name.strip()
    if s in GPU_IDS or s in GPUS:
        return s  # before the case-blind match: ``L40S`` (catalog) and ``l40s`` (system) differ only in case
    for k in GPU_IDS:
        if k.lower() == s.lower():
            return k
    found = find_gpu(s)
    if found is None or found.lower() == s.lower():
        return found
    return _SYSTEM_OF.get(found, found)


#: The benchmark system name of each catalog GPU that has one.
_SYSTEM_OF = {gpu: system for system, gpu in GPU_IDS.items()}


@dataclass(frozen=True)
class BenchRow:
    """One measured closed-loop run. Times in milliseconds, as benchmarks report them."""

    model: str
    gpu: str
    engine: str
    tp: int
    isl: int
    osl: int
    concurrency: int
    ttft_ms: float
    tpot_ms: float
    weights: str = "bf16"
    #: The KV cache's dtype; ``""``: the engine's default for the weights (:func:`default_kv`).
    kv: str = ""
    engine_version: str = ""
    source: str = ""
    #: The most requests the server ran at once (vLLM ``--max-num-seqs``, SGLang
    #: ``--max-running-requests``, TensorRT-LLM ``max_batch_size``) where the run set one below the
    #: concurrency; ``None``: the engine's default. Clients beyond it wait in the server's queue,
    #: and their TTFT counts the wait.
    max_num_seqs: int | None = None
    #: The server's token budget per iteration (vLLM ``--max-num-batched-tokens``, TensorRT-LLM
    #: ``max_num_tokens``, SGLang ``--max-prefill-tokens`` plus the running decodes) where the run
    #: set one; ``None``: the engine's default.
    max_num_batched_tokens: int | None = None
    #: Whether prefill chunks share iterations with decodes (SGLang ``--enable-mixed-chunk``);
    #: ``None``: the engine's default (vLLM and TensorRT-LLM mix, SGLang does not).
    mixed_batches: bool | None = None
    #: The largest batch the server replays as a CUDA graph where the run set one (vLLM
    #: ``cuda_graph_sizes``, SGLang ``--cuda-graph-bs``, TensorRT-LLM ``cuda_graph_config``);
    #: ``None``: the engine's default.
    cuda_graph_max_batch: int | None = None
    #: Requests the benchmark sent in all (a vLLM result's ``completed``); ``None``: the clients'
    #: default (:class:`Clients`).
    requests: int | None = None
    #: How far apart the clients started, in request cycles: each client's first request at a
    #: uniform random offset in that many request cycles (a benchmark that ramps its clients up or
    #: measures after they have drifted apart: 1, fully spread); ``None``: the clients' default
    #: (:class:`Clients`: all together, as aiperf, genai-perf and ``vllm bench serve`` start them).
    start_spread_cycles: float | None = None
    #: The server's KV capacity per replica in tokens, as it reported it (vLLM's log line "GPU KV
    #: cache size: N tokens", SGLang's ``max_total_num_tokens``, TensorRT-LLM's KV cache manager's
    #: blocks × tokens per block); ``None``: derived from the GPU's memory
    #: (``gpu.kv_cache_tokens``). Clients the KV cache cannot hold wait, and their TTFT counts it.
    kv_cache_tokens: int | None = None
    #: Tokens at the front of every prompt that are the same in every request the benchmark sent (a
    #: shared prefix, such as a system prompt or a prefix-repetition dataset), which the engine's
    #: prefix cache serves after the first request: only the rest of each prompt is prefilled.
    #: ``None``: every prompt distinct.
    cached_prompt_tokens: int | None = None
    #: Whether the server formed each iteration's batch while the one before it ran (TensorRT-LLM's
    #: overlap scheduler, SGLang's overlap schedule, vLLM ``--async-scheduling``;
    #: ``engine.schedule_ahead``); ``None``: the engine preset's (off).
    schedule_ahead: bool | None = None
    #: Where the row was read: ``FILE: row N`` (N the file's line, as a spreadsheet numbers it) or
    #: ``FILE: result``; not part of the run, so two rows alike but for it are the same run.
    origin: str = field(default="", compare=False)

    @property
    def group(self) -> str:
        """The (model, GPU, engine) group it belongs to: the unit left out in leave-one-group-out."""
        return f"{self.model}/{self.gpu}/{self.engine}"

    @property
    def cycle_ms(self) -> float:
        """One request's measured time from send to last token: TTFT + (osl − 1) × TPOT."""
        return self.ttft_ms + (self.osl - 1) * self.tpot_ms


# --- reading ---------------------------------------------------------------------------------


def _bad(path: Path, where: str, column: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{path}: {where}, {column}", value, allowed)


#: A number as benchmark files write one: ASCII digits, a point, an exponent (Python's ``float``
#: would also take ``1_024`` and other scripts' digits, which no benchmark tool writes).
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|infinity|nan)", re.IGNORECASE | re.ASCII)


def _float(raw: Any) -> float:
    """``raw`` as a number (ValueError if it is not written as one)."""
    text = str(raw).strip()
    if raw is None or not _NUMBER.fullmatch(text):
        raise ValueError(text)
    return float(text)


def _int(path: Path, where: str, row: dict, col: str, lo: int = 1, hi: int = 1 << 24) -> int:
    raw = row.get(col)
    try:
        v = _float(raw)
    except ValueError:
        raise _bad(path, where, col, raw, f"an integer in [{lo}, {hi}]") from None
    if not math.isfinite(v) or v != int(v) or not lo <= v <= hi:
        raise _bad(path, where, col, raw, f"an integer in [{lo}, {hi}]")
    return int(v)


#: The times a row may give, in milliseconds: a microsecond to a day.
MS_RANGE = (1e-3, 8.64e7)


def _ms(path: Path, where: str, row: dict, col: str) -> float:
    raw = row.get(col)
    lo, hi = MS_RANGE
    allowed = f"milliseconds, a number in [{lo:g}, {hi:.0f}] (a day)"
    try:
        v = _float(raw)
    except ValueError:
        raise _bad(path, where, col, raw, allowed) from None
    if not math.isfinite(v) or not lo <= v <= hi:
        raise _bad(path, where, col, raw, allowed)
    return v


def _row(path: Path, where: str, d: dict) -> BenchRow:
    engine = normalize_engine(d.get("engine", ""))
    if engine not in ENGINES:
        raise _bad(path, where, "engine", d.get("engine"), f"one of {', '.join(ENGINES)}")
    weights = str(d.get("weights") or "").strip().lower()
    weights = DTYPE_ALIASES.get(weights, weights)
    if weights and weights not in WEIGHTS:
        raise _bad(
            path,
            where,
            "weights",
            d.get("weights"),
            f"one of {', '.join(WEIGHTS)}, or empty or auto for the checkpoint's (also read: {_spellings(WEIGHTS)})",
        )
    kv = str(d.get("kv") or "").strip().lower()
    kv = DTYPE_ALIASES.get(kv, kv)
    if kv and kv not in KV_DTYPES:
        raise _bad(
            path,
            where,
            "kv",
            d.get("kv"),
            f"one of {', '.join(KV_DTYPES)}, or empty or auto for the engine's default (also read: "
            f"{_spellings(KV_DTYPES)})",
        )
    model = str(d.get("model", "")).strip()
    if not model:
        raise _bad(path, where, "model", d.get("model"), "a Hugging Face id or a kvsim catalog model")
    if model.lower().endswith(".json") and not (path.parent / Path(model).expanduser()).is_file():
        # A path, not an id: "not a model kvsim knows" and the list of its ids would not say what is wrong.
        raise _bad(path, where, "model", model, f"a config.json file that exists (relative paths from {path.parent})")
    try:
        section = resolve_model(model, base_dir=path.parent)
        # The checkpoint's config is read whatever the row's weights: a config kvsim cannot read is said
        # here, with the file and row, and not when the row is simulated.
        hf = checkpoint_config(section)
    except ConfigError as exc:
        why = exc.allowed if exc.key == "serving_bench.model" else f"{exc.key}: {exc.allowed}"
        raise _bad(path, where, "model", model, why) from None
    if section.get("hf_config") and Path(section["hf_config"]).is_absolute():
        model = section["hf_config"]  # a config.json path, made absolute: the row is simulated from anywhere
    experts = hf.spec.moe.expert_dtype if hf is not None and hf.spec.moe is not None else None
    if not weights:
        # A row that gives no weights means its checkpoint's (quantised experts: gpt-oss, Kimi K2.5), else bf16.
        weights = checkpoint_weights(section, hf, model)
    if weights in EXPERT_WEIGHTS and experts != weights:
        raise _bad(
            path,
            where,
            "weights",
            d.get("weights"),
            f"one of {', '.join(w for w in WEIGHTS if w not in EXPERT_WEIGHTS)}: {weights} only for a checkpoint "
            f"whose config declares {weights.upper()} routed experts ({EXPERT_WEIGHTS[weights]}), "
            f"which {model} does not",
        )
    gpu_given = str(d.get("gpu", "")).strip()
    gpu = normalize_gpu(gpu_given)
    if gpu is None:
        raise _bad(path, where, "gpu", gpu_given, f"one of {', '.join(GPU_IDS)} or a catalog GPU ({', '.join(GPUS)})")
    tp = _int(path, where, d, "tp", 1, 8)
    if tp not in (1, 2, 4, 8):
        raise _bad(path, where, "tp", d.get("tp"), "1, 2, 4 or 8")
    isl = _int(path, where, d, "isl")
    osl = _int(path, where, d, "osl")
    kv_tokens = _opt_int(path, where, d, "kv_cache_tokens", 1, 1 << 34)
    if kv_tokens is not None and kv_tokens < isl + osl:
        raise _bad(
            path, where, "kv_cache_tokens", d.get("kv_cache_tokens"), f"at least isl + osl = {isl + osl} (one request)"
        )
    cached = _opt_int(path, where, d, "cached_prompt_tokens", 0, 1 << 24)
    if cached is not None and cached >= isl:
        raise _bad(
            path,
            where,
            "cached_prompt_tokens",
            d.get("cached_prompt_tokens"),
            f"an integer in [0, {isl - 1}]: fewer than the prompt's isl tokens (its last token is always computed)",
        )
    return BenchRow(
        model=model,
        gpu=gpu,
        engine=engine,
        tp=tp,
        isl=isl,
        osl=osl,
        concurrency=_int(path, where, d, "concurrency", 1, 65536),
        ttft_ms=_ms(path, where, d, "ttft_ms"),
        tpot_ms=_ms(path, where, d, "tpot_ms"),
        weights=weights,
        kv=kv,
        engine_version=str(d.get("engine_version") or ""),
        source=str(d.get("source_id") or where),
        max_num_seqs=_opt_int(path, where, d, "max_num_seqs", 1, 1 << 20),
        max_num_batched_tokens=_budget(path, where, d, engine, isl),
        mixed_batches=_flag(path, where, d, "mixed_batches"),
        cuda_graph_max_batch=_opt_int(path, where, d, "cuda_graph_max_batch", 0, 1 << 16),
        requests=_opt_int(path, where, d, "requests"),
        start_spread_cycles=_opt_cycles(path, where, d, "start_spread_cycles"),
        kv_cache_tokens=kv_tokens,
        cached_prompt_tokens=cached or None,
        schedule_ahead=_flag(path, where, d, "schedule_ahead"),
        origin=f"{path}: {where}",
    )


def checkpoint_config(section: dict) -> HfModel | None:
    """The config of the checkpoint a row names, or ``None`` for a catalog model."""
    return read_hf_config(resolve_hf_config(section["hf_config"])) if section.get("hf_config") else None


def checkpoint_weights(section: dict, hf: HfModel | None, ident: str | None = None) -> str:
    """The weights of the checkpoint a model ``section`` (:func:`resolve_model`) names, as ``kvsim
    run --model`` runs it: its config's (``hf``: :func:`checkpoint_config`; quantised routed experts
    by their dtype), else the format the section brings for a quantised id of a catalog shape
    (``nvidia/Llama-3.1-8B-Instruct-FP8``: :data:`sim.model_ids.CHECKPOINT_FORMATS`), else the
    format the id's own tags name (``ident``: ``RedHatAI/Llama-3.1-8B-Instruct-FP8-dynamic`` is fp8,
    :func:`sim.model_ids.model_of_id`), else bf16. Its KV cache is not taken along: a row's follows
    its engine (:func:`default_kv`)."""
    experts = hf.spec.moe.expert_dtype if hf is not None and hf.spec.moe is not None else None
    if experts in EXPERT_WEIGHTS:
        return str(experts)
    given = section.get("weight_dtype")
    if given is None and ident:
        # A variant id resolves to its shape's config (bf16): its own tags name its format.
        from sim.model_ids import model_of_id

        tagged = model_of_id(ident)
        given = tagged.get("weight_dtype") if tagged is not None else None
    if given is None and hf is not None:
        given = hf.weight_dtype
    return given if given in WEIGHTS else "bf16"


def _opt_int(path: Path, where: str, d: dict, col: str, lo: int = 1, hi: int = 1 << 24) -> int | None:
    """An optional integer column: ``None`` where the row leaves it empty."""
    return _int(path, where, d, col, lo, hi) if str(d.get(col) or "").strip() else None


#: The largest start spread a row may give, in request cycles (``workload.arrival.start_spread_cycles``).
MAX_SPREAD_CYCLES = 100.0


def _opt_cycles(path: Path, where: str, d: dict, col: str) -> float | None:
    """An optional number of request cycles in [0, :data:`MAX_SPREAD_CYCLES`]: ``None`` where empty."""
    raw = d.get(col)
    if not str(raw or "").strip():
        return None
    allowed = f"request cycles, a number in [0, {MAX_SPREAD_CYCLES:g}] (or empty: the clients start together)"
    try:
        v = _float(raw)
    except ValueError:
        raise _bad(path, where, col, raw, allowed) from None
    if not math.isfinite(v) or not 0 <= v <= MAX_SPREAD_CYCLES:
        raise _bad(path, where, col, raw, allowed)
    return v


def _budget(path: Path, where: str, d: dict, engine: str, isl: int) -> int | None:
    v = _opt_int(path, where, d, "max_num_batched_tokens")
    if v is None:
        return None
    preset = get_preset(engine)
    if preset is not None and not preset.chunked_prefill and v <= isl:
        raise _bad(
            path,
            where,
            "max_num_batched_tokens",
            d.get("max_num_batched_tokens"),
            f"more than the prompt ({isl} tokens): {engine} does not split a prompt over iterations",
        )
    return v


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _flag(path: Path, where: str, d: dict, col: str) -> bool | None:
    v = str(d.get(col) or "").strip().lower()
    if not v:
        return None
    if v in _TRUE or v in _FALSE:
        return v in _TRUE
    raise _bad(path, where, col, d.get(col), "true or false (or empty for the engine's default)")


#: Names other tools give the required columns, for a header that lacks one (a hint, not read as it).
COLUMN_NAMES_ELSEWHERE = {
    "model": ("model_id", "model_name", "model_path"),
    "gpu": ("system", "hardware", "gpu_type", "device"),
    "engine": ("backend", "framework"),
    "tp": ("tensor_parallel_size", "tensor_parallel", "tp_size", "tensor_parallelism", "tensor_parallel_degree"),
    "isl": ("input_len", "input_length", "input_tokens", "prompt_len", "prompt_tokens", "random_input_len"),
    "osl": ("output_len", "output_length", "output_tokens", "max_tokens", "random_output_len"),
    "concurrency": ("max_concurrency", "num_clients", "clients", "concurrent_requests"),
    "ttft_ms": ("mean_ttft_ms", "ttft", "avg_ttft_ms"),
    "tpot_ms": ("mean_tpot_ms", "tpot", "avg_tpot_ms", "mean_itl_ms", "itl_ms"),
}


def _squash(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _near_column(column: str, names: list[str]) -> str | None:
    """The one of ``names`` (header cells kvsim does not read) that looks like ``column``: the same
    letters and digits (``TTFT (ms)``), a name other tools use (:data:`COLUMN_NAMES_ELSEWHERE`:
    ``tensor_parallel_size``), or a close spelling; ``None``."""
    want = _squash(column)
    elsewhere = {_squash(n) for n in COLUMN_NAMES_ELSEWHERE.get(column, ())}
    for n in names:
        if _squash(n) == want or _squash(n) in elsewhere:
            return n
    squashed = {_squash(n): n for n in names if _squash(n)}
    close = difflib.get_close_matches(want, list(squashed), n=1, cutoff=0.8)
    return squashed[close[0]] if close else None


def read_csv(path: Path, problems: list[str] | None = None) -> list[BenchRow]:
    """The file's rows. A row with a value kvsim cannot read or simulate (a model, GPU or engine it
    does not know, a malformed number) is a ConfigError naming file, row, column and value; with
    ``problems``, that message is appended there instead and the other rows are read."""
    try:
        # Line endings as written (read_text makes every CR a LF); the byte-order mark a spreadsheet's
        # "CSV UTF-8" export begins with is not part of the first column's name.
        text = path.read_bytes().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("serving_bench", str(path), f"a readable UTF-8 CSV file ({type(exc).__name__})") from None
    # A CR LF file with cells appended after each line's CR (awk or sed on a Windows-saved CSV) would
    # split every line in two: each row read without the appended columns, and the columns lost.
    stray = re.search(r"\r(?!\n|$)", text) if "\r\n" in text else None  # (CR alone ending every line reads)
    if stray:
        line = text.count("\n", 0, stray.start()) + 1
        raise ConfigError(
            f"{path}: line {line}",
            repr(text[max(0, stray.start() - 20) : stray.end() + 20]),
            "one line ending per line; a carriage return inside the line (cells appended after a CR LF "
            "line's CR?): convert the file to one kind of line ending (e.g. tr -d '\\r')",
        )
    reader = csv.reader(text.splitlines())
    given = [c.strip() for c in next(reader, [])]
    # Names as a spreadsheet may write them: in any case, padded (``Model``, `` TTFT_ms``).
    header = [c.lower() for c in given]
    columns = f"columns {', '.join(REQUIRED)} (optional: {', '.join(OPTIONAL)})"
    for c in REQUIRED + OPTIONAL:
        at = [i for i, h in enumerate(header) if h == c]
        if len(at) > 1:
            # Read as a dict, the last copy would win and the others be dropped unsaid.
            raise ConfigError(
                f"{path}: header, {c}",
                given[at[1]],
                f"each column once: {c} is columns {' and '.join(str(i + 1) for i in at)} "
                f"({', '.join(repr(given[i]) for i in at)})",
            )
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raw = ",".join(given)
        sep = next((s for s in (";", "\t", "|") if s in raw), None)
        hint = f"; the header is one column holding {sep!r}: kvsim reads comma-separated files" if sep else ""
        others = [g for g, h in zip(given, header) if h not in REQUIRED + OPTIONAL]
        said = []
        for c in missing:
            like = _near_column(c, others)
            unit = ", in milliseconds" if c.endswith("_ms") else ""
            said.append(f"{c} (did you mean {like}? kvsim reads it as {c}{unit})" if like else c)
        raise ConfigError(f"{path}: header", raw, f"{columns}; missing {', '.join(said)}{hint}")
    for g, c in zip(given, header):
        near = [] if c in REQUIRED + OPTIONAL else difflib.get_close_matches(c, REQUIRED + OPTIONAL, n=1, cutoff=0.8)
        if near:
            # A misspelt optional column would be read as absent: the run simulated at the engine's defaults.
            raise ConfigError(f"{path}: header", g, f"did you mean {near[0]}? ({columns}; any other is left alone)")
    rows = []
    while True:
        start = reader.line_num + 1
        cells = next(reader, None)
        if cells is None:
            break
        where = f"row {start}"
        if not any(c.strip() for c in cells):
            continue  # a spreadsheet's empty row (",,,,"), like a blank line
        try:
            if len(cells) != len(header):
                raise _bad(path, where, "cells", len(cells), f"one per column of the header: {len(header)}")
            rows.append(_row(path, where, dict(zip(header, cells))))
        except ConfigError as exc:
            if problems is None:
                raise
            problems.append(str(exc))
    if not rows and not problems:
        raise ConfigError(str(path), "no rows", "at least one benchmark row")
    return rows


#: Keys only a benchmark result has (vllm bench serve, SGLang bench_serving): a JSON file in a folder
#: without any of them (a model's config.json, a server's arguments) is not one, and is skipped.
RESULT_KEYS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "ttfts", "mean_tpot_ms")
#: What a result file is, for the errors about one.
RESULT_FILE = "a JSON object written by vllm bench serve --save-result (or SGLang's bench_serving)"


def engine_of_backend(backend: Any) -> str | None:
    """The engine a result's ``backend`` names, or ``None``: the benchmark clients' names of the
    servers kvsim has presets for (:data:`sim.analysis.bench_compare.BACKEND_ENGINES`, which
    ``kvsim compare`` reads too), beside the engine column's own spellings (:func:`normalize_engine`).
    Any other (``openai``, ``openai-chat``, ``tgi``) says how requests were sent, not which engine
    served them."""
    from sim.analysis.bench_compare import BACKEND_ENGINES

    if not isinstance(backend, str):
        return None
    key = backend.strip().lower()
    engine = BACKEND_ENGINES.get(key, normalize_engine(key))
    return engine if engine in ENGINES else None


@dataclass
class ReadNotes:
    """What reading result files passed over without an error, said once per kind by :meth:`lines`:
    files that are not benchmark results (skipped), and results whose ``backend`` names no engine
    (simulated as vLLM)."""

    not_results: list[Path] = field(default_factory=list)
    backends: dict[str, list[Path]] = field(default_factory=dict)

    def lines(self, where: Path) -> list[str]:
        out = []
        if self.not_results:
            n = len(self.not_results)
            traces = sum(f.name.endswith(".pytorch.json") for f in self.not_results)
            out.append(
                f"{n} file{'s' if n > 1 else ''} of {where} {'are not benchmark results' if n > 1 else 'is not a benchmark result'}, "
                f"skipped: {', '.join(f.name for f in self.not_results)} (no {', '.join(RESULT_KEYS)}"
                + ("; *.pytorch.json: vLLM's torch-trace side files" if traces else "")
                + ")"
            )
        for backend, files in self.backends.items():
            named = str(files[0]) if len(files) == 1 else f"{len(files)} files of {where}"
            out.append(
                f"{named}: backend {backend} names no engine kvsim has a preset for ({', '.join(ENGINES)}): "
                "simulated as vllm; --engine names the server's"
            )
        return out


def _closed_loop_rate(path: Path, doc: dict) -> bool:
    """Whether ``doc``'s ``request_rate`` is absent or infinite, read as kvsim compare reads it
    (:func:`sim.analysis.bench_results.parse_request_rate`: ``"inf"`` as vLLM writes it, or JSON's
    ``Infinity`` as SGLang does); a rate that rule refuses is not a closed loop either."""
    from sim.analysis.bench_results import parse_request_rate

    try:
        return parse_request_rate(path, doc, "request_rate", None) in (None, math.inf)
    except ConfigError:
        return False


def result_documents(path: Path) -> list[tuple[str, Any]]:
    """The JSON documents of a result file with where each is: the file's one (``result``), or one
    per line (``line N``: ``vllm bench serve --append-result``, SGLang's ``bench_serving`` JSONL)
    where the file holds several, each line an object of its own."""
    from sim.analysis.bench_results import MAX_RESULT_BYTES, json_documents
    from sim.inputs import load_json, read_text

    # Bounded: size, UTF-8 and nesting (deep nesting would overflow the parser's recursion), one line each.
    text = read_text(path, "serving_bench", "JSON file", MAX_RESULT_BYTES)
    try:
        return [("result", load_json(text, "serving_bench", str(path)))]
    except ConfigError:
        lines = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip()]
        try:
            # Bounded as the whole was (nesting): the first line alone an object says one run per line.
            one_per_line = len(lines) > 1 and isinstance(load_json(lines[0][1], "serving_bench", str(path)), dict)
        except ConfigError:
            one_per_line = False
        if not one_per_line:
            raise

    def one_run(ln: str, n: int) -> Any:
        # checked line by line, so a line that is not an object is said before a later broken line
        doc = load_json(ln, f"{path}: line {n}", ln.strip()[:60])
        if not isinstance(doc, dict):
            raise ConfigError(
                f"{path}: line {n}",
                type(doc).__name__,
                f"{RESULT_FILE}: a file of several runs holds one object per line",
            )
        return doc

    return [(f"line {n}", doc) for n, doc in json_documents(text, one_per_line=True, parse=one_run)]


def _is_result(doc: Any) -> bool:
    return isinstance(doc, dict) and any(k in doc for k in RESULT_KEYS)


def _not_a_result(path: Path, where: str, doc: Any) -> ConfigError:
    kind = "a list" if isinstance(doc, list) else f"an object without {', '.join(RESULT_KEYS)}"
    if not isinstance(doc, (list, dict)):
        kind = f"a JSON {type(doc).__name__}"
    trace = " (vLLM's torch-trace side file: read the .json beside it)" if path.name.endswith(".pytorch.json") else ""
    return ConfigError(
        str(path) if where == "result" else f"{path}: {where}",
        "not a benchmark result",
        f"{RESULT_FILE}; this is {kind}{trace}",
    )


def _result_row(
    path: Path,
    where: str,
    doc: dict,
    *,
    gpu: str | None = None,
    tp: int | None = None,
    engine: str | None = None,
    weights: str | None = None,
    kv: str | None = None,
    model: str | None = None,
    kv_cache_tokens: int | None = None,
    notes: ReadNotes | None = None,
) -> BenchRow:
    """One run of a result file (``doc``, found at ``where``) as a row; see :func:`read_vllm_result`."""
    conc = doc.get("max_concurrency")
    if conc is None:
        raise _bad(
            path,
            where,
            "max_concurrency",
            None,
            "a closed-loop run (vllm bench serve --max-concurrency N); open-loop results: kvsim compare",
        )
    completed = doc.get("completed")
    if not isinstance(completed, (int, float)) or completed <= 0:
        raise _bad(path, where, "completed", completed, "a positive request count")
    for col in ("total_input_tokens", "total_output_tokens", "mean_ttft_ms", "mean_tpot_ms"):
        if not isinstance(doc.get(col), (int, float)) or isinstance(doc.get(col), bool):
            raise _bad(path, where, col, doc.get(col), "a number (vllm bench serve --save-result writes it)")
    if not _closed_loop_rate(path, doc):
        # Requests sent at a rate, at most max_concurrency at a time, are not a closed loop of that many
        # clients: each waits for its send time, not for the client's last request.
        raise _bad(
            path,
            where,
            "request_rate",
            doc["request_rate"],
            "inf: a closed-loop run (vllm bench serve --max-concurrency N) has request_rate inf; a run at a rate "
            "is open-loop, which kvsim compare replays",
        )
    if doc.get("ramp_up_strategy"):
        raise _bad(
            path,
            where,
            "ramp_up_strategy",
            doc["ramp_up_strategy"],
            "null: a closed-loop run starts its clients at once; a ramped-up run's sends are kvsim compare's "
            "to replay (from its start_times)",
        )
    if gpu is None:
        raise ConfigError("--gpu", None, f"the GPU {path.name} ran on (the file does not record it; kvsim list gpus)")
    if tp is None:
        raise ConfigError(
            "--tp", None, f"the tensor-parallel degree {path.name} ran at: 1, 2, 4 or 8 (the file does not record it)"
        )
    ident = model or doc.get("model_id") or doc.get("tokenizer_id")
    if not isinstance(ident, str) or not ident.strip():
        raise _bad(
            path,
            where,
            "model_id",
            doc.get("model_id"),
            "the model the run served (the file names none: SGLang's bench_serving does not write it); pass "
            "--model ID (a Hugging Face id, a kvsim catalog model or a config.json path)",
        )
    backend = doc.get("backend")
    run_on = engine if engine is not None else (engine_of_backend(backend) or "vllm")
    d = {
        "model": ident,
        "gpu": gpu,
        "engine": run_on,
        "tp": tp,
        "isl": round(doc["total_input_tokens"] / completed),
        "osl": round(doc["total_output_tokens"] / completed),
        "concurrency": conc,
        "ttft_ms": doc["mean_ttft_ms"],
        "tpot_ms": doc["mean_tpot_ms"],
        "weights": weights or "",
        "kv": kv or "",
        # A result records its client (backend), not the engine's version.
        "engine_version": "",
        "source_id": path.name if where == "result" else f"{path.name} {where}",
        "requests": int(completed),
        "kv_cache_tokens": kv_cache_tokens or "",
    }
    row = _row(path, where, d)
    if engine is None and engine_of_backend(backend) is None and notes is not None:
        files = notes.backends.setdefault(quote(backend), [])
        if path not in files:
            files.append(path)
    return row


def _model_argument(model: str | None) -> str | None:
    """``--model`` as given, or made absolute where it is a path from the working directory (a row's
    own model is read relative to its file)."""
    if model is None:
        return None
    p = Path(model).expanduser()
    return str(p.resolve()) if p.exists() else model


def read_vllm_results(
    path: Path,
    problems: list[str] | None = None,
    notes: ReadNotes | None = None,
    *,
    gpu: str | None = None,
    tp: int | None = None,
    engine: str | None = None,
    weights: str | None = None,
    kv: str | None = None,
    model: str | None = None,
    kv_cache_tokens: int | None = None,
) -> list[BenchRow]:
    """Every run of a result file (one, or one per line: :func:`result_documents`) as a row
    (:func:`read_vllm_result`). With ``problems``, a run that cannot be read is a line there and the
    others are read; a file that cannot be read at all is a ConfigError."""
    args = dict(gpu=gpu, tp=tp, engine=engine, weights=weights, kv=kv, model=model, kv_cache_tokens=kv_cache_tokens)
    return _runs(path, result_documents(path), problems, notes, args)


def _runs(
    path: Path, docs: list[tuple[str, Any]], problems: list[str] | None, notes: ReadNotes | None, args: dict
) -> list[BenchRow]:
    """The rows of a result file's documents (:func:`read_vllm_results`)."""
    args = {**args, "model": _model_argument(args.get("model"))}
    rows = []
    for where, doc in docs:
        try:
            if not _is_result(doc):
                raise _not_a_result(path, where, doc)
            rows.append(_result_row(path, where, doc, notes=notes, **args))
        except ConfigError as exc:
            if problems is None or exc.key in ("--gpu", "--tp"):
                raise  # the command line is missing what every result file needs
            problems.append(str(exc))
    return rows


def read_vllm_result(
    path: Path,
    *,
    gpu: str | None = None,
    tp: int | None = None,
    engine: str | None = None,
    weights: str | None = None,
    kv: str | None = None,
    model: str | None = None,
    kv_cache_tokens: int | None = None,
    notes: list[str] | None = None,
) -> BenchRow:
    """One ``vllm bench serve --save-result`` JSON file (or SGLang ``bench_serving``'s) as a row:
    a closed loop at ``max_concurrency``; a run at a finite ``request_rate`` or ramped up is not one,
    and is refused. ``gpu``, ``tp``, ``weights``, ``kv`` and ``kv_cache_tokens`` say what the file
    does not record; ``model`` fills or replaces its ``model_id``; ``engine`` replaces the one its
    ``backend`` names (``None``: that one, vLLM where it names none, which ``notes`` hears)."""
    seen = ReadNotes()
    (where, doc), *more = result_documents(path)
    if more:
        raise ConfigError(str(path), f"{len(more) + 1} runs", "one run (read_bench reads a file of several)")
    if not _is_result(doc):
        raise _not_a_result(path, where, doc)
    row = _result_row(
        path,
        where,
        doc,
        gpu=gpu,
        tp=tp,
        engine=engine,
        weights=weights,
        kv=kv,
        model=_model_argument(model),
        kv_cache_tokens=kv_cache_tokens,
        notes=seen,
    )
    if notes is not None:
        notes.extend(seen.lines(path))
    return row


#: The suffixes of the files :func:`read_bench` reads in a folder.
BENCH_SUFFIXES = (".csv", ".json", ".jsonl")


def read_bench(
    path: str | Path, problems: list[str] | None = None, notes: list[str] | None = None, **vllm_args
) -> list[BenchRow]:
    """Rows of a CSV file, a result JSON (vLLM's or SGLang's; one run, or one per line), or a folder
    of them (``vllm_args``: see :func:`read_vllm_result`). With ``problems``, a row or result that
    cannot be read or simulated is a one-line message appended there (file, row, column, value and
    what is allowed) and the rest are read; a file or folder that cannot be read at all is a
    ConfigError, and so is one where no row is left. ``notes`` hears, one line each, what was passed
    over without an error: a folder's JSON files that are not benchmark results (skipped, vLLM's
    ``*.pytorch.json`` side files among them), results whose ``backend`` names no engine."""
    p = Path(path)
    seen = ReadNotes()
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix.lower() in BENCH_SUFFIXES and f.is_file())
        if not files:
            raise ConfigError("serving_bench", str(p), "a folder holding .csv or .json (or .jsonl) benchmark results")
        rows = [r for f in files for r in _read_one(f, problems, vllm_args, seen, in_folder=True)]
    elif not p.is_file():
        raise ConfigError("serving_bench", str(p), "a CSV file, a vllm bench serve JSON file, or a folder of them")
    else:
        rows = _read_one(p, problems, vllm_args, seen, in_folder=False)
    said = seen.lines(p)
    if notes is not None:
        notes.extend(said)
    if not rows and problems:
        raise none_left(p, problems)
    if not rows and seen.not_results:
        raise ConfigError(str(p), "no benchmark result", f"a folder holding benchmark results; {said[0]}")
    return rows


def none_left(path: Path, problems: list[str]) -> ConfigError:
    """The error for a file or folder none of whose rows kvsim can simulate: how many, and the first reason."""
    n = len(problems)
    more = f" (and {n - 1} more)" if n > 1 else ""
    first = problems[0].removeprefix(f"{path}: ")
    return ConfigError(
        str(path), f"{n} row{'s' if n > 1 else ''}, none that kvsim can simulate", f"at least one; {first}{more}"
    )


def _read_one(p: Path, problems: list[str] | None, vllm_args: dict, seen: ReadNotes, in_folder: bool) -> list[BenchRow]:
    if p.suffix.lower() == ".csv":
        return read_csv(p, problems)
    if in_folder and p.name.lower().endswith(".pytorch.json"):
        seen.not_results.append(p)  # vLLM's torch-trace side file of the result beside it (as kvsim compare skips it)
        return []
    try:
        docs = result_documents(p)
    except ConfigError as exc:
        if problems is None:
            raise
        problems.append(str(exc))
        return []
    if len(docs) == 1 and not _is_result(docs[0][1]):
        if not in_folder:
            raise _not_a_result(p, *docs[0])  # the whole input: not a row left out
        seen.not_results.append(p)  # a model's config.json, a server's arguments: not a run
        return []
    return _runs(p, docs, problems, seen, vllm_args)


def completion_gap_ratios(rows: Iterable[BenchRow], max_concurrency: int = 32) -> dict[tuple[str, int, int], float]:
    """Median TTFT ÷ (request cycle ÷ concurrency) per (group, concurrency, osl), over rows of at
    most ``max_concurrency`` clients; the cycle is TTFT + (osl − 1) × TPOT, so cycle ÷ c is the mean
    time between two completions. A server's TTFT set by prefill and queueing does not depend on the
    output length, and the ratio halves as the output doubles; a ratio near 1 at every output length
    says each request waited for another one to finish (docs/calibration.md, mis-measured groups)."""
    by: dict[tuple[str, int, int], list[float]] = {}
    for r in rows:
        if r.concurrency > max_concurrency:
            continue
        by.setdefault((r.group, r.concurrency, r.osl), []).append(r.ttft_ms / (r.cycle_ms / r.concurrency))
    return {k: float(np.median(v)) for k, v in sorted(by.items())}


def ttft_follows_completions(rows: Iterable[BenchRow], max_concurrency: int = 32) -> dict[str, list[int]]:
    """Per group, the concurrencies at which its TTFT follows the time between completions instead
    of the server (:func:`completion_gap_ratios`): runs of two or more output lengths (the longest
    at least twice the shortest) whose ratio at the longest output is still at least 0.9 and has
    fallen by less than 45 % from the shortest. A TTFT set by prefill and queueing keeps the ratio
    falling with the output (by half per doubling); none of the groups measured on servers alone
    comes near these bounds (docs/calibration.md)."""
    by: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for (group, c, osl), r in completion_gap_ratios(rows, max_concurrency).items():
        by.setdefault((group, c), []).append((osl, r))
    out: dict[str, list[int]] = {}
    for (group, c), pts in sorted(by.items()):
        (short, r_short), (long, r_long) = min(pts), max(pts)
        if long >= 2 * short and r_long >= 0.9 and r_long >= 0.55 * r_short:
            out.setdefault(group, []).append(c)
    return out


def hold_back_flagged(
    rows: Iterable[BenchRow], flagged: dict[str, list[int]] | None = None
) -> tuple[list[BenchRow], dict[str, list[int]]]:
    """``rows`` with the runs :func:`ttft_follows_completions` flags (``flagged``, when the caller
    has them already) given ``max_num_seqs`` = concurrency − 1 (where they set none, or one no
    lower than the concurrency): the benchmark
    as if one request always waited for another to finish, the explanation docs/calibration.md
    gives for those runs. Also returns what was held back, ``{group: [concurrency, ...]}``. The flag
    reads the runs' own measured TTFT, so a prediction made this way is not blind to the group it
    treats."""
    rows = list(rows)
    if flagged is None:
        flagged = ttft_follows_completions(rows)
    out: list[BenchRow] = []
    held: dict[str, set[int]] = {}
    for r in rows:
        unset = r.max_num_seqs is None or r.max_num_seqs >= r.concurrency
        if unset and r.concurrency >= 2 and r.concurrency in flagged.get(r.group, ()):
            r = replace(r, max_num_seqs=r.concurrency - 1)
            held.setdefault(r.group, set()).add(r.concurrency)
        out.append(r)
    return out, {g: sorted(cs) for g, cs in sorted(held.items())}


#: Tokens aiconfigurator's generator adds to the prompt length (and the concurrency) for an
#: aggregated server's token budget; :func:`aiconfigurator_server` keeps them for SGLang only.
AIC_BUDGET_EXTRA = 1500
#: The first SGLang version whose aiconfigurator command line turns mixed chunks on.
AIC_SGLANG_MIXED_FROM = "0.5.6"


#: A run id as aiconfigurator-core's collector names an aggregated run:
#: ``…_agg_{isl}x{osl}_c{concurrency}_tp{tp}_ep…`` (some ids leave the concurrency out, ``_c_``).
AIC_RUN_ID = re.compile(r"_agg_(\d+)x(\d+)_c(\d*)_tp(\d+)(?!\d)")


def aiconfigurator_run(row: BenchRow) -> bool:
    """Whether ``row.source`` names an aiconfigurator-core collector run of the row's own prompt and
    output lengths, concurrency (where the id gives one) and GPU count: a run its generator deployed
    (:func:`aiconfigurator_server`), as every run of the shipped training file was."""
    m = AIC_RUN_ID.search(row.source)
    if m is None:
        return False
    isl, osl, conc, tp = m.groups()
    return (int(isl), int(osl), int(tp)) == (row.isl, row.osl, row.tp) and (not conc or int(conc) == row.concurrency)


def aiconfigurator_server(row: BenchRow) -> BenchRow:
    """``row`` with the server settings of an aggregated (one-replica) deployment that
    aiconfigurator-core benchmarked at ``concurrency`` clients, where the row sets none: at most
    ``concurrency`` requests running (vLLM ``max-num-seqs``, SGLang ``max-running-requests``,
    TensorRT-LLM ``max_batch_size``), CUDA graphs for every batch up to ``concurrency``, SGLang's
    mixed chunks from version 0.5.6 (the first whose command-line template passes
    ``--enable-mixed-chunk``), and a token budget per iteration: SGLang ``max-prefill-tokens``
    ``isl + 1500`` beside the running decodes, as the generator writes it; vLLM and TensorRT-LLM
    one prompt beside the decodes (``concurrency + isl``), which is how their runs behave, not
    the generator's ``concurrency + isl + 1500``; and vLLM's batches formed one iteration ahead
    (async scheduling). The last two are read from the runs (docs/calibration.md, "How the
    shipped runs were served")."""
    from .tables import version_key

    mixed = row.mixed_batches
    v = row.engine_version
    # An unnumbered version (empty, a build tag) says nothing about which template ran.
    if (
        mixed is None
        and row.engine == "sglang"
        and v[:1].isdigit()
        and version_key(v) >= version_key(AIC_SGLANG_MIXED_FROM)
    ):
        mixed = True
    return replace(
        row,
        max_num_seqs=row.max_num_seqs if row.max_num_seqs is not None else row.concurrency,
        max_num_batched_tokens=row.max_num_batched_tokens
        if row.max_num_batched_tokens is not None
        else row.concurrency + row.isl + (AIC_BUDGET_EXTRA if row.engine == "sglang" else 0),
        mixed_batches=mixed,
        schedule_ahead=True if row.schedule_ahead is None and row.engine == "vllm" else row.schedule_ahead,
        cuda_graph_max_batch=row.cuda_graph_max_batch if row.cuda_graph_max_batch is not None else row.concurrency,
    )


#: A group whose runs need the GPU computing this many times their wall time is faster than its
#: engine's kernels can be (:func:`faster_than_kernels`); the shipped file's consistent groups
#: reach a median of 1.02 at most.
BUSY_LIMIT = 1.25


def _priced_steps(
    rows: Iterable[BenchRow], profile: str | None = None, host: bool = False
) -> list[tuple[float, float] | None]:
    """Per row, at its engine's own kernel prices (with its preset's host time where ``host``, else
    none): what one prompt adds to an iteration of the other clients' decodes (its own iteration
    where the engine runs prefills apart), and the decode iteration of all ``concurrency`` clients
    at the mean KV length (seconds; ``None`` where the profile cannot price the row)."""
    from sim.config import scenario_from_dict
    from sim.cost.model import BatchShape
    from sim.engine.deployment import Deployment, with_engine_defaults

    idle = None if host else {"host_s": 0.0, "host_per_seq_s": 0.0}
    models: dict[tuple, Any] = {}
    out: list[tuple[float, float] | None] = []
    for r in rows:
        # Everything of the row that reaches the cost model or the batching: its CUDA-graph sizes
        # (the served runs capture up to their concurrency) and whether prompts mix with decodes.
        key = (r.model, r.gpu, r.engine, r.weights, r.kv, r.tp, r.cuda_graph_max_batch, r.mixed_batches)
        try:
            if key not in models:
                # The engine's own batching where the row leaves it unset (vLLM and TensorRT-LLM mix).
                sc = with_engine_defaults(scenario_from_dict(row_scenario(r, engine=idle, profile=profile)))
                models[key] = (Deployment.from_scenario(sc).make_cost_model(sc), bool(sc.scheduler.mixed_batches))
        except ConfigError:
            models[key] = (None, True)
        cm, mixed = models[key]
        if cm is None:
            out.append(None)
            continue
        c, kv = r.concurrency, r.isl + r.osl // 2
        others = (c - 1) * kv
        cached = r.cached_prompt_tokens or 0
        chunk = [(r.isl - cached, cached)]
        prefill = cm.step_time_s(BatchShape(chunk, c - 1 if mixed else 0, others if mixed else 0))
        if mixed and c > 1:
            prefill -= cm.step_time_s(BatchShape([], c - 1, others))
        out.append((prefill, cm.step_time_s(BatchShape([], c, c * kv))))
    return out


def gpu_shares(rows: Iterable[BenchRow], profile: str | None = None) -> list[tuple[float, float] | None]:
    """Per row, the shares of its wall time the GPU must spend on prefills and on decode iterations
    to deliver the measured throughput at the row's engine's own kernel prices, host and front-end
    time left out: ``(prefill, decode)``. Prefill: per second, the request rate (concurrency ÷
    request cycle) times one prompt's prefill, priced as the time it adds to an iteration of the
    other requests' decodes (its own iteration where the engine runs prefills apart). Decode: the
    decode iterations of all clients (rate × (osl − 1) ÷ concurrency) at the mean KV length.
    ``None`` where the profile cannot price the row."""
    rows = list(rows)
    out: list[tuple[float, float] | None] = []
    for r, steps in zip(rows, _priced_steps(rows, profile)):
        if steps is None:
            out.append(None)
            continue
        prefill, decode = steps
        rate = r.concurrency / (r.cycle_ms / 1e3)
        out.append((rate * prefill, rate * (r.osl - 1) / r.concurrency * decode))
    return out


def prompt_costs(rows: Iterable[BenchRow], profile: str | None = None) -> list[tuple[float, float] | None]:
    """Per row, what one prompt adds to the iteration the other clients decode in, measured and
    priced (seconds): measured from the run's request cycle, whose ``osl`` iterations carry
    ``concurrency`` prompts, as (cycle ÷ osl − the decode iteration at the row's price) ÷
    (concurrency ÷ osl); priced at the engine's own kernels and its preset's host time
    (:func:`_priced_steps`). A measured cost well above the price at short prompts and equal to it
    at long ones is a floor on an iteration with a prompt (``engine.eager_host_per_layer_s``).
    ``None`` where the profile cannot price the row."""
    rows = list(rows)
    out: list[tuple[float, float] | None] = []
    for r, steps in zip(rows, _priced_steps(rows, profile, host=True)):
        if steps is None:
            out.append(None)
            continue
        prefill, decode = steps
        per_iteration = r.cycle_ms / 1e3 / r.osl
        out.append(((per_iteration - decode) / (r.concurrency / r.osl), prefill))
    return out


def implied_gpu_busy(
    rows: Iterable[BenchRow], profile: str | None = None, shares: list[tuple[float, float] | None] | None = None
) -> list[float | None]:
    """Per row, the share of its wall time the GPU must compute to deliver the measured throughput
    (:func:`gpu_shares`, prefill and decode together; ``shares`` when already computed for
    ``rows``). A closed loop can keep the GPU busy at most all the time (1); more says the
    measurement is faster than the kernels can be (cached prefixes, prompts shorter than ``isl``,
    speculative decoding). ``None`` where the profile cannot price the row."""
    return [None if x is None else x[0] + x[1] for x in (gpu_shares(rows, profile) if shares is None else shares)]


#: Fewest rows, and narrowest spread of prefill shares, over which :func:`tpot_error_split` fits a line.
SPLIT_MIN_ROWS = 6
SPLIT_MIN_SPREAD = 0.1


def _line(
    pts: list[tuple[float, float]], min_rows: int, spread_ok: Callable[[np.ndarray], bool]
) -> tuple[np.ndarray, float, float] | None:
    """Least-squares line through ``pts`` (x, y): (the x values, slope, intercept), or ``None``
    with fewer than ``min_rows`` points or x values that ``spread_ok`` finds too alike."""
    if len(pts) < min_rows:
        return None
    x, y = np.array(pts).T
    if not spread_ok(x):
        return None
    slope, intercept = np.polyfit(x, y, 1)
    return x, float(slope), float(intercept)


def tpot_error_split(results: list[RowResult], shares: dict[BenchRow, tuple[float, float] | None]) -> dict[str, dict]:
    """Where a group's TPOT error comes from: a least-squares line through its rows' relative TPOT
    errors against their prefill share of wall time (``shares``: :func:`gpu_shares` by row). Its
    intercept is the error of runs that are all decode (decode iterations mispriced: host time,
    decode kernels, all-reduce); its slope, how the error moves as prefills take over the GPU
    (prefills mispriced, or batched differently from the server). Per group and
    per tensor-parallel size within it, where at least :data:`SPLIT_MIN_ROWS` rows spread their
    prefill shares over :data:`SPLIT_MIN_SPREAD` or more: ``{"decode": intercept, "per_prefill":
    slope, "rows": n, "prefill_share": [lowest, highest]}``."""

    def line(pts: list[tuple[float, float]]) -> dict | None:
        fit = _line(pts, SPLIT_MIN_ROWS, lambda x: x.max() - x.min() >= SPLIT_MIN_SPREAD)
        if fit is None:
            return None
        x, slope, intercept = fit
        return {
            "decode": round(intercept, 4),
            "per_prefill": round(slope, 4),
            "rows": len(pts),
            "prefill_share": [round(float(x.min()), 3), round(float(x.max()), 3)],
        }

    by: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for r in results:
        sh = shares.get(r.row)
        if sh is None or r.tpot_err is None:
            continue
        by.setdefault(r.row.group, {}).setdefault(r.row.tp, []).append((sh[0], r.tpot_err))
    out: dict[str, dict] = {}
    for g, tps in sorted(by.items()):
        whole = line([p for pts in tps.values() for p in pts])
        if whole is None:
            continue
        per_tp = {str(tp): fit for tp, pts in sorted(tps.items()) if (fit := line(pts)) is not None}
        out[g] = {**whole, "by_tp": per_tp}
    return out


#: Fewest runs, and least ratio of the longest prefill to the shortest, over which
#: :func:`ttft_vs_prefill` fits a line.
TTFT_LINE_MIN_ROWS = 4
TTFT_LINE_MIN_RATIO = 1.5


def ttft_vs_prefill(results: list[RowResult], shares: dict[BenchRow, tuple[float, float] | None]) -> dict[str, dict]:
    """What sets TTFT where a group's server is least loaded: a least-squares line through the mean
    TTFT of its runs at its lowest concurrency against one prompt's prefill at the engine's kernel
    prices (the time it adds to an iteration of the other clients' decodes: :func:`gpu_shares`'
    prefill share × request cycle ÷ concurrency), measured and simulated. An intercept near zero and a
    slope above 1 say prompts wait behind others' prefills (clients arriving together); a large
    intercept and a slope near 1, a fixed front end. Per group with at least
    :data:`TTFT_LINE_MIN_ROWS` such runs whose prefills span a ratio of
    :data:`TTFT_LINE_MIN_RATIO` or more: ``{"concurrency": c, "runs": n, "prefill_ms": [shortest,
    longest], "measured": {"intercept_ms": a, "per_prefill": b}, "simulated": {...} or None}``
    (``None``: too few of the runs simulated)."""

    def line(pts: list[tuple[float, float]]) -> dict | None:
        fit = _line(pts, TTFT_LINE_MIN_ROWS, lambda x: x.max() >= TTFT_LINE_MIN_RATIO * x.min())
        return None if fit is None else {"intercept_ms": round(fit[2], 1), "per_prefill": round(fit[1], 3)}

    by: dict[str, list[tuple[BenchRow, float, float | None]]] = {}
    for r in results:
        sh = shares.get(r.row)
        if sh is None:
            continue
        w = r.row
        by.setdefault(w.group, []).append((w, sh[0] * w.cycle_ms / w.concurrency, r.ttft_ms))
    out: dict[str, dict] = {}
    for g, pts in sorted(by.items()):
        c = min(w.concurrency for w, _, _ in pts)
        low = [(w, p, s) for w, p, s in pts if w.concurrency == c and p > 0]
        measured = line([(p, w.ttft_ms) for w, p, _ in low])
        if measured is None:
            continue
        xs = [p for _, p, _ in low]
        out[g] = {
            "concurrency": c,
            "runs": len(low),
            "prefill_ms": [round(min(xs), 1), round(max(xs), 1)],
            "measured": measured,
            "simulated": line([(p, s) for _, p, s in low if s is not None]),
        }
    return out


#: Least lowest concurrency, and most growth of TTFT per prefill there, at which a group's clients
#: cannot have started together (:func:`clients_apart`). Four clients arriving at once wait for
#: one another's prompts in the first wave if nowhere else: 1.15 prefills per prefill at least over
#: 10 requests each, 2 to 2.5 when they stay in step. Clients a request cycle apart still meet now
#: and then, a prompt waiting for another's prefill and, where batches are formed ahead, for the
#: iteration after it: kvsim's own TensorRT-LLM runs give 1.28-1.34 so, 1.8 with the clients
#: together (3 requests each). The shipped groups: 0.98 for the flagged one, 3.5 and more for the others.
APART_MIN_CONCURRENCY = 4
APART_MAX_PER_PREFILL = 1.5


def clients_apart(rows: Iterable[BenchRow], shares: dict[BenchRow, tuple[float, float] | None]) -> dict[str, dict]:
    """Groups whose clients did not start together: at their lowest concurrency (at least
    :data:`APART_MIN_CONCURRENCY`), the measured TTFT grows by less than
    :data:`APART_MAX_PER_PREFILL` per unit of one prompt's prefill (:func:`ttft_vs_prefill`'s
    measured line): prompts do not wait for one another, not even in a first wave. A benchmark that
    ramps its clients up (aiperf ``--concurrency-ramp-duration``, ``vllm bench serve
    --ramp-up-strategy``) or leaves out its first requests does this; nothing in a row records it.
    ``{group: {"concurrency": c, "per_prefill": slope}}``."""
    lines = ttft_vs_prefill([RowResult(r, None, None) for r in rows], shares)
    return {
        g: {"concurrency": v["concurrency"], "per_prefill": v["measured"]["per_prefill"]}
        for g, v in lines.items()
        if v["concurrency"] >= APART_MIN_CONCURRENCY and v["measured"]["per_prefill"] < APART_MAX_PER_PREFILL
    }


#: A run waits for KV (:func:`kv_capacity_evidence`) when its TTFT is at least this many times that of
#: the same prompt length and concurrency at the shortest output; it holds its clients' KV when under
#: :data:`KV_HOLDS_RATIO`. Without a KV limit a closed loop's TTFT does not grow with the output
#: length (the shipped Qwen3-32B runs: 0.86-1.17 times); waiting for KV multiplies it (1.57-5.4).
KV_WAITS_RATIO = 1.5
KV_HOLDS_RATIO = 1.2


def _derived_kv_tokens(row: BenchRow, profile: str | None) -> int | None:
    """The KV capacity kvsim derives for ``row``'s deployment (tokens; ``None`` when it cannot)."""
    from sim.config import scenario_from_dict
    from sim.engine.deployment import derived_kv_cache_tokens

    try:
        return derived_kv_cache_tokens(scenario_from_dict(row_scenario(row, profile=profile)))
    except ConfigError:
        return None


def kv_capacity_evidence(rows: Iterable[BenchRow], profile: str | None = None) -> dict[str, dict]:
    """What a file's runs say of the KV capacity their server held, beside the one kvsim derives.

    Per group, tensor-parallel size and weight dtype: runs of one prompt length and concurrency at
    several output lengths, each compared with the shortest. A closed loop's TTFT does not depend on
    the output length unless its requests wait for KV, which needs ``concurrency × (isl + osl)``
    tokens when every client's request is at its full length (what TensorRT-LLM reserves on
    admission; vLLM and SGLang preempt or queue near it). Runs whose TTFT grows
    :data:`KV_WAITS_RATIO` times or more wait; under :data:`KV_HOLDS_RATIO` they fit. The capacity lies
    between the most tokens a fitting run needs (``holds_up_to``; ``None``: no such run) and the
    fewest a waiting run needs (``waits_from``). Reported where some run waits and the two are
    consistent (a group whose TTFT grows with the output for another reason, waiting for a
    completion, has waiting runs below fitting ones and is left out), and, where a group waits at
    several tensor-parallel sizes, where more GPUs wait at more tokens: their memory holds more KV,
    and a wait that does not move with it (a token stream's ceiling) is not for KV. ``derived``: the capacity
    kvsim derives from the GPU's memory for the first waiting run (``gpu.kv_cache_tokens`` replaces
    it). ``{"<group> tp<N> <weights>": {...}}``."""
    series: dict[tuple, list[BenchRow]] = {}
    for r in rows:
        if r.kv_cache_tokens is not None or r.cached_prompt_tokens:
            continue  # a pinned capacity or a shared prefix: the demand is not c × (isl + osl)
        series.setdefault((r.group, r.tp, r.weights, r.kv, r.isl, r.concurrency), []).append(r)
    holds: dict[tuple, list[int]] = {}
    waits: dict[tuple, list[BenchRow]] = {}
    for key, runs in series.items():
        runs.sort(key=lambda r: r.osl)
        base = runs[0]
        for r in runs[1:]:
            ratio = r.ttft_ms / base.ttft_ms
            need = r.concurrency * (r.isl + r.osl)
            if ratio >= KV_WAITS_RATIO:
                waits.setdefault(key[:4], []).append(r)
            elif ratio < KV_HOLDS_RATIO:
                holds.setdefault(key[:4], []).append(need)
    found: dict[tuple, tuple[int | None, int, BenchRow, list[BenchRow]]] = {}
    for key, waiting in waits.items():
        first = min(waiting, key=lambda r: (r.concurrency * (r.isl + r.osl), r.isl))
        hi = first.concurrency * (first.isl + first.osl)
        lo = max(holds.get(key, []), default=None)
        if lo is None or lo < hi:
            found[key] = (lo, hi, first, waiting)
    by_group: dict[tuple, list[tuple[int, int]]] = {}
    for (group, tp, weights, kv), (_, hi, _, _) in found.items():
        by_group.setdefault((group, weights, kv), []).append((tp, hi))
    not_kv = {g for g, pts in by_group.items() if any(a[1] >= b[1] for a, b in zip(sorted(pts), sorted(pts)[1:]))}
    out: dict[str, dict] = {}
    for key, (lo, hi, first, waiting) in sorted(found.items(), key=lambda kv: str(kv[0])):
        group, tp, weights, kv = key
        if (group, weights, kv) in not_kv:
            continue
        out[kv_key(first)] = {
            "holds_up_to": lo,
            "waits_from": hi,
            "derived": _derived_kv_tokens(first, profile),
            "waiting_runs": sorted(
                {f"{r.isl}/{r.osl} c{r.concurrency}" for r in waiting},
                key=lambda s: (int(s.split(" c")[1]), s),
            ),
        }
    return out


def kv_key(row: BenchRow) -> str:
    """The key :func:`kv_capacity_evidence` files ``row``'s deployment under."""
    return f"{row.group} tp{row.tp} {row.weights}"


def kv_from_runs(rows: Iterable[BenchRow], evidence: dict[str, dict]) -> tuple[list[BenchRow], dict[str, int]]:
    """``rows`` with the KV capacity their runs imply (:func:`kv_capacity_evidence`, ``evidence``)
    where a row sets none, and the capacity given to each deployment so treated: the middle of the
    bracket where it has both ends; one with only an upper end (every run waits) is left as it is,
    since nothing bounds it below. Like the other treatments it reads the runs' own measured TTFT,
    so a prediction made with it is not blind to the group it treats."""
    given = {k: (v["holds_up_to"] + v["waits_from"]) // 2 for k, v in evidence.items() if v["holds_up_to"] is not None}
    out: list[BenchRow] = []
    used: dict[str, int] = {}
    for r in rows:
        k = kv_key(r)
        if k in given and r.kv_cache_tokens is None and not r.cached_prompt_tokens:
            r = replace(r, kv_cache_tokens=given[k])
            used[k] = given[k]
        out.append(r)
    return out, dict(sorted(used.items()))


def spread_flagged(rows: Iterable[BenchRow], flagged: dict[str, dict]) -> tuple[list[BenchRow], list[str]]:
    """``rows`` with the runs of the groups :func:`clients_apart` flags (``flagged``) given a start
    spread of :data:`APART_SPREAD_CYCLES` where they set none, and the groups so treated. The flag
    reads the runs' own measured TTFT, so a prediction made this way is not blind to the group it
    treats."""
    out: list[BenchRow] = []
    spread: set[str] = set()
    for r in rows:
        if r.group in flagged and r.start_spread_cycles is None:
            r = replace(r, start_spread_cycles=APART_SPREAD_CYCLES)
            spread.add(r.group)
        out.append(r)
    return out, sorted(spread)


def tp_scaling(results: list[RowResult]) -> dict[str, list[dict]]:
    """What a larger GPU count buys, measured and simulated: per group, per pair of its
    tensor-parallel sizes (each with the next larger one it was run at) and per concurrency, the
    median over prompt and output lengths run at both sizes of TPOT at the smaller size ÷ TPOT at
    the larger (above 1: the larger size shortens the step). ``{group: [{"tp": [small, large],
    "concurrency": c, "runs": n, "measured": gain, "simulated": gain}]}``, rows the simulation could
    not run left out."""
    tpot: dict[tuple[str, int, int, int], dict[int, tuple[float, float]]] = {}
    run_at: dict[str, set[int]] = {}
    for r in results:
        w = r.row
        run_at.setdefault(w.group, set()).add(w.tp)
        if r.tpot_ms is not None:
            tpot.setdefault((w.group, w.isl, w.osl, w.concurrency), {})[w.tp] = (w.tpot_ms, r.tpot_ms)
    sizes = {g: sorted(tps) for g, tps in run_at.items()}
    gains: dict[tuple[str, int, int, int], list[tuple[float, float]]] = {}
    for (g, _isl, _osl, c), by_tp in tpot.items():
        tps = sizes[g]
        for lo, hi in zip(tps, tps[1:]):
            if lo in by_tp and hi in by_tp:
                (m_lo, s_lo), (m_hi, s_hi) = by_tp[lo], by_tp[hi]
                gains.setdefault((g, lo, hi, c), []).append((m_lo / m_hi, s_lo / s_hi))
    out: dict[str, list[dict]] = {}
    for (g, lo, hi, c), pts in sorted(gains.items()):
        m, s = np.median(np.array(pts), axis=0)
        out.setdefault(g, []).append(
            {
                "tp": [lo, hi],
                "concurrency": c,
                "runs": len(pts),
                "measured": round(float(m), 3),
                "simulated": round(float(s), 3),
            }
        )
    return out


def faster_than_kernels(
    rows: Iterable[BenchRow], profile: str | None = None, busy: list[float | None] | None = None
) -> dict[str, float]:
    """Groups whose runs are faster than their engine's kernels allow: median
    :func:`implied_gpu_busy` (``busy``, when already computed for ``rows``) above
    :data:`BUSY_LIMIT`, by group."""
    rows = list(rows)
    by: dict[str, list[float]] = {}
    for r, b in zip(rows, implied_gpu_busy(rows, profile) if busy is None else busy):
        if b is not None:
            by.setdefault(r.group, []).append(b)
    return {g: round(float(np.median(v)), 2) for g, v in sorted(by.items()) if np.median(v) > BUSY_LIMIT}


def runs_faster_than_kernels(
    rows: Iterable[BenchRow], busy: list[float | None], fast: dict[str, float]
) -> dict[str, list[dict]]:
    """Single runs faster than their engine's kernels allow in groups :func:`faster_than_kernels`
    does not flag as a whole (``fast``): :func:`implied_gpu_busy` (``busy``, in row order) above
    :data:`BUSY_LIMIT`. By group, in row order, each run's ``isl``, ``osl``, ``concurrency``, ``tp``
    and ``implied_gpu_busy``. Such a run did not serve what its row says (cached prefixes, shorter
    prompts, speculative decoding): no server model reaches it."""
    out: dict[str, list[dict]] = {}
    for r, b in zip(rows, busy):
        if b is not None and b > BUSY_LIMIT and r.group not in fast:
            out.setdefault(r.group, []).append(
                {"isl": r.isl, "osl": r.osl, "concurrency": r.concurrency, "tp": r.tp, "implied_gpu_busy": round(b, 3)}
            )
    return out


#: Prompt tokens :func:`cache_flagged` rounds a cached share down to: the engines' KV block.
CACHE_BLOCK_TOKENS = 16


def least_cached_share(
    rows: Iterable[BenchRow], shares: list[tuple[float, float] | None], fast: dict[str, float]
) -> dict[str, float]:
    """For each group :func:`faster_than_kernels` flags (``fast``), the least share of every prompt
    that must have come from the prefix cache for its runs to be possible at all: the median over
    its runs of the share that brings the GPU time they need (:func:`gpu_shares`, ``shares`` in row
    order) down to their wall time, ``1 − (1 − decode) ÷ prefill``, within [0, 1]. A lower bound:
    a server also spends time off the GPU, so its runs needed more of their prompts cached."""
    by: dict[str, list[float]] = {}
    for r, x in zip(rows, shares):
        if r.group in fast and x is not None and x[0] > 0:
            by.setdefault(r.group, []).append(min(max(1.0 - (1.0 - x[1]) / x[0], 0.0), 1.0))
    return {g: round(float(np.median(v)), 2) for g, v in sorted(by.items())}


def cache_flagged(rows: Iterable[BenchRow], share: dict[str, float]) -> tuple[list[BenchRow], list[str]]:
    """``rows`` with the prompts of each group in ``share`` (:func:`least_cached_share`) that much
    served from the prefix cache (``cached_prompt_tokens``, rounded down to
    :data:`CACHE_BLOCK_TOKENS`) where a run sets none, and the groups so treated. The share is read
    from the runs' own measured times, so a prediction made this way is not blind to the group it
    treats."""
    out: list[BenchRow] = []
    cached: set[str] = set()
    for r in rows:
        s = share.get(r.group)
        if s and r.cached_prompt_tokens is None:
            n = min(int(s * r.isl) // CACHE_BLOCK_TOKENS * CACHE_BLOCK_TOKENS, r.isl - 1)
            if n:
                r = replace(r, cached_prompt_tokens=n)
                cached.add(r.group)
        out.append(r)
    return out, sorted(cached)


# --- rows as scenarios -----------------------------------------------------------------------


def resolve_model(ident: str, base_dir: str | Path | None = None) -> dict:
    """The scenario ``model`` section for a Hugging Face id or catalog name (shipped configs first),
    or a ``config.json`` path (or a folder holding one; relative: to ``base_dir``, ``scenarios/``
    or the working directory), given as an absolute path (:func:`sim.model_ids.section_of`)."""
    section = section_of(ident, base_dir, absolute=True)
    if section is None:
        raise ConfigError(
            "serving_bench.model",
            ident,
            f"{known_ids()}; for another model, write its config.json path (absolute, or relative to the "
            "benchmark file) in the model column",
        )
    return section


@dataclass(frozen=True)
class Clients:
    """How the benchmark's clients run: ``requests_per_client`` requests each, the first ``warmup``
    of each client's left out of the means. The
    defaults are the benchmarks behind the shipped file as aiconfigurator-core runs them: aiperf /
    genai-perf ``--request-count`` and SGLang's ``bench_serving --num-prompts`` of 10 × concurrency,
    every request in the means (vLLM's ``bench serve`` likewise counts every request of
    ``--num-prompts``, which a vLLM result's ``completed`` gives: :attr:`BenchRow.requests`). A row
    without its own ``start_spread_cycles`` starts its clients this many request cycles apart (0:
    together, whatever a preset's scenario default; ``None``: the preset's); ``validate`` and
    ``calibrate`` give every row its own first (:func:`calibration.serving_report.clients_rows`). Each
    request's client and front-end jitter (``client_cv``) is the engine preset's unless set here."""

    requests_per_client: int = 10
    warmup: int = 0
    start_spread_cycles: float | None = 0.0
    client_cv: float | None = None


def row_scenario(
    row: BenchRow,
    clients: Clients = Clients(),
    *,
    engine: dict | None = None,
    profile: str | None = None,
    seed: int = 0,
) -> dict:
    """The kvsim scenario (raw mapping) of one benchmark row.

    ``engine`` holds ``engine.*`` overrides (fitted terms); the scheduler keys are left unset so
    the engine preset's server defaults apply, except the token budget, raised to fit one prompt
    where the engine cannot chunk it.
    """
    model = resolve_model(row.model)
    gpu = GPU_IDS.get(row.gpu, row.gpu)
    kv = row.kv or default_kv(row.engine, row.weights, gpu)
    # fp16 weights cost what bf16 ones do (two bytes, the same tensor-core rate); the profiles price bf16.
    # A checkpoint's quantised experts (MXFP4, W4A16) take their dtype from its config, its other weights are bf16.
    model.update({"weight_dtype": "bf16" if row.weights in ("fp16", *EXPERT_WEIGHTS) else row.weights, "kv_dtype": kv})
    n = row.requests if row.requests is not None else row.concurrency * (clients.requests_per_client + clients.warmup)
    spread = row.start_spread_cycles if row.start_spread_cycles is not None else clients.start_spread_cycles
    sc: dict = {
        "name": "serving-bench",
        "seed": seed,
        "model": model,
        "gpu": {
            "name": gpu,
            "tensor_parallel": row.tp,
            **({"kv_cache_tokens": row.kv_cache_tokens} if row.kv_cache_tokens is not None else {}),
        },
        "workload": {
            "num_requests": n,
            "max_model_len": row.isl + row.osl,
            "arrival": {
                "kind": "closed_loop",
                "concurrency": row.concurrency,
                **({"start_spread_cycles": spread} if spread is not None else {}),
                **({"client_cv": clients.client_cv} if clients.client_cv is not None else {}),
            },
            "lengths": {"kind": "fixed", "prompt_tokens": row.isl, "output_tokens": row.osl},
        },
        "allocator": {"kind": "paged", "block_size": ENGINE_BLOCK_SIZE.get(row.engine, 16)},
        "engine": {
            "kind": row.engine,
            **({"graph_max_tokens": row.cuda_graph_max_batch} if row.cuda_graph_max_batch is not None else {}),
            **({"schedule_ahead": row.schedule_ahead} if row.schedule_ahead is not None else {}),
            **(engine or {}),
        },
        "cost_model": {"profile": profile or "auto"},
    }
    if row.cached_prompt_tokens:
        # One shared prefix in front of every prompt; the first request computes it, the others find it
        # in the prefix cache (the engines' default: vLLM's automatic prefix caching, SGLang's radix
        # cache, TensorRT-LLM's KV block reuse).
        sc["workload"]["lengths"]["prompt_tokens"] = row.isl - row.cached_prompt_tokens
        sc["workload"]["prefix"] = {"fraction": 1.0, "prefix_tokens": row.cached_prompt_tokens, "groups": 1}
        sc["allocator"]["prefix_caching"] = {"enabled": True}
    preset = get_preset(row.engine)
    if preset is not None and not preset.chunked_prefill and row.isl + row.concurrency > preset.max_num_batched_tokens:
        # Without chunked prefill a prompt joins an iteration whole, beside every running decode:
        # with the default budget an 8192-token prompt would wait until no request decodes, one
        # request at a time, where the measured runs (TTFT 1.2 s at isl 8192, c 4, one H200)
        # show none of that. Benchmarks set the budget from the longest input they send.
        sc["scheduler"] = {"max_num_batched_tokens": row.isl + row.concurrency}
    if row.max_num_seqs is not None:
        sc.setdefault("scheduler", {})["max_num_seqs"] = row.max_num_seqs
    if row.max_num_batched_tokens is not None:
        sc.setdefault("scheduler", {})["max_num_batched_tokens"] = row.max_num_batched_tokens
    if row.mixed_batches is not None:
        sc.setdefault("scheduler", {})["mixed_batches"] = row.mixed_batches
    return sc


@dataclass
class RowResult:
    """A row's measured and simulated means (ms) and relative errors ((sim − meas) / meas)."""

    row: BenchRow
    ttft_ms: float | None
    tpot_ms: float | None
    error: str | None = None
    calibrated: bool = True
    extra: dict = field(default_factory=dict)

    @property
    def ttft_err(self) -> float | None:
        return None if self.ttft_ms is None else self.ttft_ms / self.row.ttft_ms - 1.0

    @property
    def tpot_err(self) -> float | None:
        return None if self.tpot_ms is None else self.tpot_ms / self.row.tpot_ms - 1.0

    def to_json(self) -> dict:
        return {
            **asdict(self.row),
            "group": self.row.group,
            "sim_ttft_ms": self.ttft_ms,
            "sim_tpot_ms": self.tpot_ms,
            "ttft_rel_err": self.ttft_err,
            "tpot_rel_err": self.tpot_err,
            "error": self.error,
            "cost_model_calibrated": self.calibrated,
            **self.extra,
        }


def simulate_row(
    row: BenchRow,
    clients: Clients = Clients(),
    *,
    engine: dict | None = None,
    profile: str | None = None,
    seed: int = 0,
) -> RowResult:
    """Simulate one row; means over requests after each client's warm-up (request ids at or above
    ``concurrency × warmup``: a closed loop hands out ids in send order)."""
    from sim.config import scenario_from_dict
    from sim.engine.cluster import simulate

    try:
        sc = scenario_from_dict(row_scenario(row, clients, engine=engine, profile=profile, seed=seed))
        res = simulate(sc)
    except ConfigError as exc:
        return RowResult(row, None, None, error=str(exc))
    t = res.requests.to_pydict()
    ids = np.asarray(t["id"])
    keep = (ids >= row.concurrency * clients.warmup) & (np.asarray(t["status"]) == "completed")
    if not keep.any():
        return RowResult(row, None, None, error="no request completed after the warm-up")
    first, arr, fin = (np.asarray(t[k])[keep] for k in ("first_token_s", "arrival_s", "finish_s"))
    gen = np.asarray(t["generated_tokens"])[keep]
    ttft = float(np.mean(first - arr)) * 1e3
    multi = gen > 1
    tpot = float(np.mean((fin - first)[multi] / (gen[multi] - 1))) * 1e3 if multi.any() else None
    return RowResult(
        row,
        ttft,
        tpot,
        calibrated=bool(res.summary.get("cost_model_calibrated")),
        extra={"preemptions": res.summary.get("preemptions", 0)},
    )


def setup_error(row: BenchRow) -> str | None:
    """Why ``row`` cannot be simulated whatever the engine's terms (its model's weights do not fit
    its GPUs, say), or ``None``: its scenario and deployment are built, nothing is simulated."""
    from sim.config import scenario_from_dict
    from sim.engine.deployment import Deployment

    try:
        Deployment.from_scenario(scenario_from_dict(row_scenario(row, Clients())))
    except ConfigError as exc:
        return str(exc)
    return None


# --- scoring ---------------------------------------------------------------------------------


def error_stats(errs: list[float | None]) -> dict:
    """Median and p90 |error| (rows without one are left out), share within 10 % and 20 %, signed bias (median signed error)."""
    e = np.asarray([x for x in errs if x is not None and math.isfinite(x)], dtype=np.float64)
    if e.size == 0:
        return {"n": 0}
    a = np.abs(e)
    return {
        "n": int(e.size),
        "median_abs": float(np.median(a)),
        "p90_abs": float(np.percentile(a, 90)),
        "within_10": float(np.mean(a <= 0.10)),
        "within_20": float(np.mean(a <= 0.20)),
        "bias": float(np.median(e)),
    }


def score(results: list[RowResult]) -> dict:
    """Per (model, GPU, engine) group and overall: TTFT and TPOT error statistics, failed rows."""
    groups: dict[str, list[RowResult]] = {}
    for r in results:
        groups.setdefault(r.row.group, []).append(r)
    out: dict[str, Any] = {
        "groups": {},
        "overall": {
            "ttft": error_stats([r.ttft_err for r in results]),
            "tpot": error_stats([r.tpot_err for r in results]),
            "rows": len(results),
            "failed": sum(r.error is not None for r in results),
        },
    }
    for g, rs in sorted(groups.items()):
        out["groups"][g] = {
            "ttft": error_stats([r.ttft_err for r in rs]),
            "tpot": error_stats([r.tpot_err for r in rs]),
            "rows": len(rs),
            "failed": sum(r.error is not None for r in rs),
        }
    return out
