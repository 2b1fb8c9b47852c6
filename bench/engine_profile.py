"""Where the reference engine's iteration time goes, against the same forward without its cache.

For a handful of batch shapes (a whole prompt, a prompt chunk after cached context, decodes, decodes
with a chunk) on the paged and static layouts: the engine's ``execute`` (one forward through its KV
cache, as a validation replay runs it) timed with the device synchronised, beside the model's plain
causal forward over the same number of new tokens (:meth:`calibration.engine.Transformer.reference_logits`:
no cache, no block tables, one causal SDPA per layer). Their difference is what the engine adds per
iteration beyond the kernels a profile prices. With ``--profile`` (and ``--static-profile``, as
``kvsim validate`` writes them), each shape is also priced by that profile's kernel curves alone, CPU
step overhead zeroed (what the validation's engine-overhead fit measures the engine against): the
engine's time over that price says whether the curves, each timed in isolation with its own launch,
under- or over-price a forward whose launches overlap its kernels. Then the torch profiler's top
operators by device time (CUDA) or CPU time for the widest prefill, to name what that difference is
made of.

    python -m bench.engine_profile --device cuda --model llama-3.1-8b --kernels sdpa --out runs/bench/engine.json
    python -m bench.engine_profile --device cpu --model tiny-llama      # the same on this CPU (seconds)
    python -m bench.engine_profile --device cpu --profile cpu-reference  # with the kernel curves' price
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from .common import console, table, write_json

#: (name, [(ctx, new) per prefill chunk], decodes, decode KV length) per device; the first, the widest
#: prefill, is the one the profiler dissects
SHAPES = {
    "cuda": (
        ("prefill 1536", [(0, 1536)], 0, 0),
        ("prefill 512", [(0, 512)], 0, 0),
        ("chunk 1024 after 512", [(512, 1024)], 0, 0),
        ("decode 16 x 1024", [], 16, 1024),
        ("decode 16 + chunk 512", [(0, 512)], 16, 1024),
    ),
    "cpu": (
        ("prefill 256", [(0, 256)], 0, 0),
        ("chunk 128 after 128", [(128, 128)], 0, 0),
        ("decode 8 x 256", [], 8, 256),
        ("decode 8 + chunk 128", [(0, 128)], 8, 256),
    ),
}


#: tokens per KV block, the engines' and the kernel price's
BLOCK = 16


def _engine(model, allocator: str, device: str, kernels: str, dtype: str, net=None):
    from calibration.engine import Engine, EngineConfig

    cfg = EngineConfig(
        model=model,
        # static reserves max_model_len per request: room for the 17 requests of the widest batch
        num_blocks=2048 if device == "cuda" else 1024,
        block_size=BLOCK,
        max_num_seqs=32,
        max_num_batched_tokens=4096,
        allocator=allocator,
        max_model_len=1600 if device == "cuda" else 300,
        dtype=dtype,
        device=device,
        kernels=kernels,
    )
    return Engine(cfg, model=net)


def _admit(engine, rid: int, tokens: int) -> None:
    from calibration.engine import NO_SPACE, OVERFLOW

    r = engine.mem.admit(rid, tokens)
    if r in (NO_SPACE, OVERFLOW):
        raise RuntimeError(f"request {rid} of {tokens} tokens does not fit the {engine.cfg.allocator} layout ({r})")


def _items(engine, chunks, decodes: int, decode_kv: int, vocab: int):
    """Requests placed in the engine's memory so that ``execute`` runs exactly this batch."""
    from calibration.engine import EngineRequest

    engine.reset()
    items = []
    rid = 0
    for _ in range(decodes):
        r = EngineRequest(rid, 0.0, [rid % vocab] * decode_kv, 8)
        _admit(engine, r.id, decode_kv)
        r.computed, r.generated = decode_kv - 1, 1
        items.append((r, 1))
        rid += 1
    for c, n in chunks:
        r = EngineRequest(rid, 0.0, [(rid + 7 * i) % vocab for i in range(c + n)], 8)
        _admit(engine, r.id, c + n)
        r.computed = c
        items.append((r, n))
        rid += 1
    return items


def _timed(fn, sync, reps: int) -> float:
    fn()
    fn()
    sync()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def _top_ops(fn, device: str, n: int = 15) -> list[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    fn()
    with profile(activities=acts) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        dev_us = getattr(e, "self_device_time_total", None)
        if dev_us is None:
            dev_us = getattr(e, "self_cuda_time_total", 0.0)
        rows.append(
            {"op": e.key, "calls": e.count, "self_device_ms": dev_us / 1e3, "self_cpu_ms": e.self_cpu_time_total / 1e3}
        )
    key = "self_device_ms" if device == "cuda" else "self_cpu_ms"
    rows.sort(key=lambda r: -r[key])
    return rows[:n]


def _churn(engine, decodes: int, kv0: int, vocab: int, sync, reps: int) -> list[float]:
    """``execute`` of a decode batch whose KV length grows by a block per call, so every call's padded
    shape is new (as in a replay, where lengths grow each iteration): seconds per call."""
    out = []
    for k in range(reps):
        items = _items(engine, [], decodes, kv0 + BLOCK * k + 1, vocab)
        sync()
        t = time.perf_counter()
        engine.execute(items)
        sync()
        out.append(time.perf_counter() - t)
    return out


def priced_ms(cost, chunks, decodes: int, decode_kv: int) -> float:
    """One batch priced by ``cost`` (:func:`calibration.kernels.engine_overhead.kernel_cost`: a profile's
    kernel curves alone, no CPU step overhead), milliseconds."""
    from sim.cost.model import BatchShape

    return cost.step_time_s(BatchShape([(n, c) for c, n in chunks], decodes, decodes * decode_kv)) * 1e3


def measure(
    device: str,
    model_name: str,
    kernels: str,
    dtype: str,
    reps: int = 5,
    cudnn_sdpa: bool = False,
    progress=print,
    profile: str | None = None,
    static_profile: str | None = None,
) -> dict:
    """Every shape timed on both layouts and as a plain forward; with ``profile`` (a built-in name or a
    profile JSON, ``static_profile`` for the static layout, else the same) also priced by its kernels."""
    from calibration.engine import Transformer
    from calibration.kernels import import_torch
    from calibration.kernels.engine_overhead import kernel_cost
    from sim.catalog import get_model
    from sim.cost.profile import load_profile

    torch = import_torch()
    if device == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(cudnn_sdpa)

    model = get_model(model_name)
    costs = {}
    if profile:
        costs = {
            a: kernel_cost(load_profile(p), model, a, BLOCK)
            for a, p in (("paged", profile), ("static", static_profile or profile))
        }
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    net = Transformer(model, dtype, device, 0)
    progress(f"{model.name} weights ({dtype}) on {device} in {time.perf_counter() - t0:.1f} s")
    out: dict = {
        "device": device,
        "model": model.name,
        "kernels": kernels,
        "dtype": dtype,
        "cudnn_sdpa": cudnn_sdpa and device == "cuda",
        "profile": profile,
        "static_profile": static_profile or profile,
        "rows": [],
    }
    if device == "cuda":
        out["gpu"] = torch.cuda.get_device_name(0)
    out["torch"] = torch.__version__
    engines = {a: _engine(model, a, device, kernels, dtype, net) for a in ("paged", "static")}
    vocab = model.vocab
    with torch.inference_mode():
        for name, chunks, decodes, kv in SHAPES[device]:
            new = sum(n for _, n in chunks) + decodes
            plain = _timed(lambda new=new: net.reference_logits([i % vocab for i in range(new)]), sync, reps)
            row = {"shape": name, "new_tokens": new, "plain_forward_ms": plain * 1e3}
            for alloc, eng in engines.items():
                items = _items(eng, chunks, decodes, kv, vocab)
                row[f"{alloc}_ms"] = _timed(lambda eng=eng, items=items: eng.execute(items), sync, reps) * 1e3
                if costs:
                    row[f"{alloc}_priced_ms"] = priced_ms(costs[alloc], chunks, decodes, kv)
            out["rows"].append(row)
            progress(
                f"{name}: plain {row['plain_forward_ms']:.2f} ms, paged {row['paged_ms']:.2f} ms, "
                f"static {row['static_ms']:.2f} ms"
            )
        for alloc, eng in engines.items():
            calls = _churn(eng, 16 if device == "cuda" else 8, 512 if device == "cuda" else 96, vocab, sync, 12)
            out[f"churn_{alloc}_ms"] = [c * 1e3 for c in calls]
            progress(
                f"{alloc} decode, a new KV length each call: median {statistics.median(calls) * 1e3:.2f} ms, "
                f"first {calls[0] * 1e3:.2f} ms"
            )
        name, chunks, decodes, kv = SHAPES[device][0]  # the widest prefill
        for alloc, eng in engines.items():
            items = _items(eng, chunks, decodes, kv, vocab)
            out[f"top_ops_{alloc}"] = {"shape": name, "ops": _top_ops(lambda e=eng, i=items: e.execute(i), device)}
        new = sum(n for _, n in chunks)
        out["top_ops_plain"] = {
            "shape": name,
            "ops": _top_ops(lambda: net.reference_logits([i % vocab for i in range(new)]), device),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--model", default=None, help="catalog model (default: llama-3.1-8b on cuda, tiny-llama on cpu)")
    ap.add_argument("--kernels", default="sdpa", help="the paged layout's attention backend (default sdpa)")
    ap.add_argument("--dtype", default=None, help="bf16 on cuda, fp32 on cpu by default")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--cudnn-sdpa", action="store_true", help="let torch pick cuDNN's SDPA on CUDA (kvsim turns it off)"
    )
    ap.add_argument("--profile", help="price each shape by this profile's kernels too (built-in name or JSON)")
    ap.add_argument("--static-profile", help="the static layout's profile (default: --profile)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench/engine_profile.json"))
    a = ap.parse_args(argv)
    model = a.model or ("llama-3.1-8b" if a.device == "cuda" else "tiny-llama")
    dtype = a.dtype or ("bf16" if a.device == "cuda" else "fp32")
    res = measure(
        a.device,
        model,
        a.kernels,
        dtype,
        a.reps,
        a.cudnn_sdpa,
        progress=console.print,
        profile=a.profile,
        static_profile=a.static_profile,
    )
    priced = "paged_priced_ms" in res["rows"][0]
    cols = ["shape", "new tokens", "plain ms", "paged ms", "static ms", "paged/plain"]
    if priced:
        cols += ["paged / priced", "static / priced"]
    rows = []
    for r in res["rows"]:
        row = [
            r["shape"],
            r["new_tokens"],
            f"{r['plain_forward_ms']:.2f}",
            f"{r['paged_ms']:.2f}",
            f"{r['static_ms']:.2f}",
            f"{r['paged_ms'] / r['plain_forward_ms']:.2f}",
        ]
        if priced:
            row += [f"{r['paged_ms'] / r['paged_priced_ms']:.2f}", f"{r['static_ms'] / r['static_priced_ms']:.2f}"]
        rows.append(row)
    table(f"engine execute vs plain forward ({res['model']}, {res['device']}, {res['kernels']})", cols, rows)
    key = "self_device_ms" if a.device == "cuda" else "self_cpu_ms"
    for which in ("paged", "static", "plain"):
        top = res[f"top_ops_{which}"]
        table(
            f"top ops, {which}: {top['shape']} ({key})",
            ["op", "calls", key],
            [[o["op"][:70], o["calls"], f"{o[key]:.3f}"] for o in top["ops"]],
        )
    path = write_json(a.out.parent, a.out.stem, res)
    console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
