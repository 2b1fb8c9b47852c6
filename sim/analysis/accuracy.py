"""How far kvsim's latencies may be from a real server's, as a plan states it.

Every absolute figure a plan gives (goodput, GPU count, TTFT and TPOT at the operating point)
carries the error of the cost model and the engine preset against real servers. That error was
measured once, on the closed-loop benchmark runs shipped in calibration/data/serving-bench
(H100 and H200; Qwen3-32B, Llama-3.1-8B and -70B; vLLM, SGLang, TensorRT-LLM), by predicting each
(model, GPU, engine) group from terms fitted without it: :data:`LEAVE_ONE_GROUP_OUT` holds those
figures as docs/calibration.md ("Accuracy against real servers") tables them, and a test keeps the
two equal. Reproduce: ``kvsim validate --serving-bench builtin --logo --workers 2 --max-evals 60``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GroupError:
    """One (model, GPU, engine) group's leave-one-group-out median |error| (fractions)."""

    #: The group as docs/calibration.md names it (``model/gpu/engine`` of the benchmark file).
    label: str
    #: Catalog model and GPU names and the weight dtype the group's runs served.
    model: str
    weights: str
    gpu: str
    engine: str
    rows: int
    ttft: float
    tpot: float
    #: Why the group's runs look mis-measured (docs/calibration.md, "Groups that look
    #: mis-measured"); empty when they do not.
    flagged: str = ""


#: Leave-one-group-out over the shipped benchmark file, per group (docs/calibration.md table).
LEAVE_ONE_GROUP_OUT = (
    GroupError("Qwen/Qwen3-32B/h100_sxm/sglang", "qwen3-32b", "bf16", "H100-SXM-80GB", "sglang", 84, 0.116, 0.052),
    GroupError("Qwen/Qwen3-32B/h100_sxm/trtllm", "qwen3-32b", "bf16", "H100-SXM-80GB", "trtllm", 180, 0.097, 0.072),
    GroupError("Qwen/Qwen3-32B/h100_sxm/vllm", "qwen3-32b", "bf16", "H100-SXM-80GB", "vllm", 93, 0.084, 0.093),
    GroupError(
        "meta-llama/Llama-3.1-70B/h200_sxm/trtllm",
        "llama-3.1-70b",
        "bf16",
        "H200-SXM-141GB",
        "trtllm",
        72,
        0.632,
        0.068,
        "clients that cannot have started together",
    ),
    GroupError(
        "meta-llama/Llama-3.1-8B-Instruct/h100_sxm/trtllm",
        "llama-3.1-8b",
        "bf16",
        "H100-SXM-80GB",
        "trtllm",
        177,
        0.296,
        0.044,
    ),
    GroupError(
        "meta-llama/Llama-3.1-8B-Instruct/h200_sxm/sglang",
        "llama-3.1-8b",
        "bf16",
        "H200-SXM-141GB",
        "sglang",
        46,
        0.302,
        0.082,
    ),
    GroupError(
        "nvidia/Llama-3.1-8B-Instruct-FP8/h200_sxm/vllm",
        "llama-3.1-8b",
        "fp8",
        "H200-SXM-141GB",
        "vllm",
        21,
        1.339,
        1.099,
        "faster than its own kernels",
    ),
)
#: Over all 673 rows: median |error| of TTFT and TPOT (fractions).
ALL_ROWS = (0.177, 0.065)
DOC = "docs/calibration.md, Accuracy against real servers"


def _pct(x: float) -> str:
    return f"{x * 100:.1f} %"


def _group_name(g: GroupError) -> str:
    return g.model + (f" {g.weights}" if g.weights != "bf16" else "") + f" on {g.gpu}"


def _group_figures(g: GroupError) -> str:
    text = f"{_pct(g.ttft)} / {_pct(g.tpot)}"
    return text + (f" (looks mis-measured: {g.flagged})" if g.flagged else "")


def accuracy_line(model: str, weights: str, gpu: str, engine: str, calibrated: bool, terms_file: str | None) -> str:
    """What a plan's absolute figures may be off by, for the served ``model`` (catalog name) with
    ``weights`` on ``gpu`` (catalog name) behind ``engine`` (a preset name, after ``auto``
    resolved), priced by a calibrated profile or not, with the engine terms of ``terms_file``
    (``engine.terms_file``) or the preset's."""
    advice = (
        "goodput and GPU counts carry this error, the order of the candidates (which share most of it) less; "
        "to narrow it, fit the engine terms on runs of your own server (kvsim calibrate --from-serving-bench) "
        "and pin the KV capacity it logs (gpu.kv_cache_tokens)"
    )
    if not calibrated:
        return (
            "latencies come from the uncalibrated roofline prior, which no server measurement checks: treat "
            "goodput and GPU counts as a first guess and calibrate the GPU (kvsim calibrate; docs/calibration.md)"
        )
    if engine == "reference":
        return (
            "the reference engine is kvsim's own torch engine (no serving framework): kvsim validate compares "
            "against it; a real server adds host, front-end and scheduling time that this plan does not price"
        )
    overall = (
        f"on measured H100/H200 benchmark runs the engine presets predict a (model, GPU, engine) group they were "
        f"not fitted on with a median error of {_pct(ALL_ROWS[0])} on TTFT and {_pct(ALL_ROWS[1])} on TPOT ({DOC})"
    )
    if terms_file:
        return (
            f"engine terms from {terms_file}; {overall}. Your terms' own error is what kvsim validate "
            f"--serving-bench reports on the runs they were fitted on; {advice}"
        )
    own = [g for g in LEAVE_ONE_GROUP_OUT if g.engine == engine]
    same = [g for g in own if (g.model, g.weights, g.gpu) == (model, weights, gpu)]
    if same:
        where = (
            f"{engine} serving {_group_name(same[0])} is one of those groups: {_group_figures(same[0])} (TTFT / TPOT)"
        )
    else:
        groups = "; ".join(f"{_group_name(g)}: {_group_figures(g)}" for g in own)
        where = (
            f"{engine} serving {model} {weights} on {gpu} is not one of those groups"
            + (f" ({engine}'s groups, TTFT / TPOT: {groups})" if own else "")
            + "; expect the overall figures or worse"
        )
    return f"{overall}; {where}. {advice[0].upper()}{advice[1:]}"
