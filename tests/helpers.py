"""Small scenarios for engine tests, and config files written for a test."""

import json
from pathlib import Path

from sim.catalog import GPUS, MODELS
from sim.config import apply_overrides, scenario_from_dict

#: tiny-llama's shape with gpt-oss's layout: 2 sliding-window (64 tokens) and 2 full-attention
#: layers; ``{"model": {"hf_config": str(TINY_MIXED)}}`` runs it in a tiny scenario.
TINY_MIXED = Path(__file__).parent / "data" / "hf" / "tiny-mixed-layout_config.json"


def tiny_scenario(kv_tokens: int = 4096, **over):
    """tiny-llama on the ``cpu`` device with about ``kv_tokens`` of KV capacity per replica."""
    m, g = MODELS["tiny-llama"], GPUS["cpu"]
    bpt = m.kv_bytes_per_token("bf16")
    act = int(g.memory_bytes * 0.9) - m.weight_bytes("bf16") - kv_tokens * bpt
    base = {
        "name": "tiny",
        "seed": 3,
        "model": {"name": "tiny-llama"},
        "gpu": {"name": "cpu", "activation_reserve_bytes": act},
        "workload": {
            "num_requests": 60,
            "max_model_len": 1024,
            "arrival": {"kind": "poisson", "rate": 20.0},
            "lengths": {"kind": "uniform", "prompt_min": 8, "prompt_max": 400, "output_min": 1, "output_max": 120},
        },
        "scheduler": {"max_num_seqs": 16, "max_num_batched_tokens": 256},
        "allocator": {"kind": "paged", "block_size": 16},
    }
    return scenario_from_dict(apply_overrides(base, over))


def trace_run(tmp_path: Path, rows: list[tuple[float, int, int]], **over):
    """A tiny scenario serving exactly ``rows`` (arrival s, prompt tokens, output tokens) on vLLM's
    preset with no front end and no client jitter, ``over`` applied: its per-request columns in
    request-id order, and the result."""
    import numpy as np

    from sim.engine.cluster import simulate

    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{a},{p},{o}\n" for a, p, o in rows))
    sc = tiny_scenario(
        **{
            "workload.num_requests": len(rows),
            "workload.arrival": {"kind": "trace", "path": str(path)},
            "workload.lengths": {"kind": "trace", "path": str(path)},
            "engine.kind": "vllm",
            "engine.frontend_s": 0.0,
            "engine.client_cv": 0.0,
            **over,
        }
    )
    res = simulate(sc)
    t = res.requests.to_pydict()
    order = np.argsort(t["id"])
    return {k: np.asarray(v)[order] for k, v in t.items()}, res


def write_config(folder: Path, cfg: dict, name: str = "m_config.json") -> Path:
    """``cfg`` written as a Hugging Face config file ``name`` in ``folder``."""
    p = folder / name
    p.write_text(json.dumps(cfg))
    return p


#: A small explorer scenario (the page's own shape): 150 requests, Llama-3.1-8B, paged.
SMALL_EXPLORER = {
    "name": "small",
    "seed": 2,
    "model": {"name": "llama-3.1-8b"},
    "workload": {
        "num_requests": 150,
        "max_model_len": 4096,
        "arrival": {"kind": "poisson", "rate": 20.0},
        "lengths": {"kind": "uniform", "prompt_min": 50, "prompt_max": 1500, "output_min": 10, "output_max": 400},
    },
    "allocator": {"kind": "paged", "block_size": 16},
}
