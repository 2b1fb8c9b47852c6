"""Paged vs contiguous decode attention on every attention backend that runs on this device.

For each backend of :mod:`calibration.attention_backends` available here (``sdpa``, ``flex`` and, on
CUDA, ``flashinfer`` and ``vllm`` when installed), at one model's per-GPU attention shape: decode
attention (one query per sequence) over a paged cache at several block sizes and over a contiguous
cache, on a grid of batch × KV length, timed as ``kvsim calibrate`` times it (``calibration.kernels.Bench``:
warm-up, operand sets rotated, CUDA events on CUDA; the median of repeats over interleaved passes).
Prints one table with the backends side by side: per (batch, length, block size) the paged time and
the paged ÷ contiguous ratio, and writes every point to JSON.

A backend that is missing, cannot use a block size, or fails (a JIT build without a compiler, an
unsupported head size) is reported with its reason and the others go on.

    python -m bench attention [--quick]                  # this device (cuda if torch sees one), default model
    python -m bench.attention_backends --device cuda --model llama-3.1-8b --out runs/bench/attention.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from .common import console, table, write_json

GRIDS = {  # device: (batches, KV lengths, block sizes)
    "cuda": ((1, 8, 32, 128), (1024, 4096, 16384), (8, 16, 32, 64, 128)),
    "cpu": ((1, 4, 16), (256, 1024), (8, 16, 32)),
}
QUICK = {"cuda": ((1, 32, 128), (1024, 8192), (16, 32, 128)), "cpu": ((1, 8), (256,), (16, 32))}
DEFAULT_MODEL = {"cuda": "llama-3.1-8b", "cpu": "tiny-llama"}


def measure(
    device: str,
    model_name: str,
    quick: bool = False,
    backends: list[str] | None = None,
    passes: int = 2,
    budget_s: float | None = None,
    progress=print,
) -> dict:
    """Every point on every available backend; ``budget_s``: stop starting new backends past it."""
    from calibration import attention_backends as AB, kernels as K
    from sim.catalog import get_model
    from sim.cost.profile_model import per_gpu_heads

    model = get_model(model_name)
    h, kvh = per_gpu_heads(model, 1)
    d = model.head_dim
    batches, lengths, sizes = (QUICK if quick else GRIDS)[device]
    names = backends or list(AB.BACKENDS)
    avail = AB.availability(device)
    out: dict = {
        "device": device,
        "model": model.name,
        "shape": {"heads": h, "kv_heads": kvh, "head_dim": d},
        "batches": list(batches),
        "lengths": list(lengths),
        "block_sizes": list(sizes),
        "backends": {},
    }
    t_start = time.perf_counter()
    for name in names:
        entry: dict = {}
        out["backends"][name] = entry
        if avail.get(name) is not None:
            entry["unavailable"] = avail[name]
            progress(f"{name}: unavailable ({avail[name]})")
            continue
        if budget_s is not None and time.perf_counter() - t_start > budget_s:
            entry["unavailable"] = f"not run: the {budget_s:.0f} s budget was spent on the backends before it"
            progress(f"{name}: {entry['unavailable']}")
            continue
        t0 = time.perf_counter()
        try:
            bench = K.Bench.open(
                device, "bf16", kernels=name, repeats=7, warmup=2, target_repeat_s=0.002 if device == "cuda" else 0.0005
            )
        except Exception as exc:  # a ConfigError (dtype) or an import failure: say why, go on
            entry["unavailable"] = f"{type(exc).__name__}: {exc}"
            progress(f"{name}: {entry['unavailable']}")
            continue
        try:
            be = bench.kernels
            entry["describe"] = be.describe()
            entry["skipped_block_sizes"] = {str(bs): why for bs in sizes if (why := be.block_size_problem(bs))}
            cells = [
                (b, L, bs)
                for b in batches
                for L in lengths
                for bs in (None, *sizes)
                if bs is None or str(bs) not in entry["skipped_block_sizes"]
            ]
            bench.reserve_paged([c for c in cells if c[2]], h, kvh, d)
            setups = [
                lambda b=b, L=L, bs=bs, bench=bench: bench.decode_calls(b, L, h, kvh, d, bs) for b, L, bs in cells
            ]
            timings = bench.measure(setups, passes)
            entry["points"] = [
                {
                    "batch": b,
                    "length": L,
                    "block_size": bs or 0,
                    "median_s": t.median_s,
                    "min_s": t.min_s,
                    "repeats": t.repeats,
                }
                for (b, L, bs), t in zip(cells, timings)
            ]
            entry.update(be.stats())
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            progress(f"{name}: failed ({entry['error']})")
        finally:
            bench.close()
        entry["elapsed_s"] = round(time.perf_counter() - t0, 1)
        progress(f"{name}: {len(entry.get('points', []))} points in {entry['elapsed_s']} s")
    return out


def ratio_rows(data: dict) -> tuple[list[str], list[list]]:
    """Columns and rows of the side-by-side table: per (batch, length, block) and backend, the paged
    time (µs) and paged ÷ contiguous."""
    ran = [n for n, e in data["backends"].items() if e.get("points")]
    cols = ["batch", "KV length", "block"] + [c for n in ran for c in (f"{n} µs", f"{n} ×contig")]
    rows = []
    for b in data["batches"]:
        for L in data["lengths"]:
            for bs in data["block_sizes"]:
                row: list = [b, L, bs]
                for n in ran:
                    pts = {
                        (p["batch"], p["length"], p["block_size"]): p["median_s"] for p in data["backends"][n]["points"]
                    }
                    paged, contig = pts.get((b, L, bs)), pts.get((b, L, 0))
                    row += [
                        "-" if paged is None else paged * 1e6,
                        "-" if paged is None or not contig else round(paged / contig, 3),
                    ]
                rows.append(row)
    return cols, rows


def report(data: dict) -> None:
    cols, rows = ratio_rows(data)
    table(f"decode attention, paged vs contiguous ({data['model']} {data['shape']}, {data['device']})", cols, rows)
    for n, e in data["backends"].items():
        why = e.get("unavailable") or e.get("error")
        if why:
            console.print(f"[dim]{n}: {why}[/]")
        elif e.get("skipped_block_sizes"):
            console.print(f"[dim]{n}: block sizes skipped: {e['skipped_block_sizes']}[/]")


def _device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def run(quick: bool, out: Path) -> dict:
    """``python -m bench attention``: this device, its default model."""
    dev = _device()
    data = measure(dev, DEFAULT_MODEL[dev], quick, progress=lambda m: console.print(f"[dim]{m}[/]"))
    report(data)
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.attention_backends",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--backends", default=None, help="comma-separated subset (default: every one)")
    ap.add_argument("--budget-s", type=float, default=None, help="start no backend after this many seconds")
    ap.add_argument("--out", type=Path, default=Path("runs/bench/attention.json"))
    a = ap.parse_args(argv)
    dev = a.device or _device()
    data = measure(
        dev,
        a.model or DEFAULT_MODEL[dev],
        a.quick,
        a.backends.split(",") if a.backends else None,
        budget_s=a.budget_s,
        progress=lambda m: console.print(f"[dim]{m}[/]"),
    )
    report(data)
    path = write_json(a.out.parent, a.out.stem, data)
    console.print(f"[dim]wrote {path}[/]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
