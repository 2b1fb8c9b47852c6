"""End-to-end serving benchmarks: the rows of a benchmark file, read and checked.

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

Simulating the rows and scoring them: :mod:`calibration.serving_runs`; how aiconfigurator-core's
generator served its runs: :mod:`calibration.served_by`; what the runs say about their benchmark
(groups that look mis-measured, where the errors come from): :mod:`calibration.serving_evidence`.
No torch.
"""

from __future__ import annotations

import csv
import difflib
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.catalog import GPUS, find_gpu
from sim.engine_presets import get_preset, normalize_engine
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
