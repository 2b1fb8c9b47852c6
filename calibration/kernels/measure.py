"""A :class:`~calibration.kernels.plan.Plan` timed point by point: the job list at one model's
TP-1 shapes, run in interleaved passes into :class:`Measurements` (one row per point, the
Parquet sidecar's rows); several runs of one plan pooled into one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

import numpy as np

from sim.catalog import ModelSpec
from sim.cost.profile_model import per_gpu_heads, shape_keys
from sim.errors import ConfigError

from .. import attention_backends as AB
from ..devices import Device
from .estimate import Estimate, Work, estimate_run, probe_rates
from .plan import REFERENCE_BLOCK_SIZE, STATIC_PREFILL, Plan
from .timing import DEVICES, POOL_ELEMS, TORCH_DTYPES, Bench, Setup, Timing, describe_device


@dataclass
class Measurements:
    """Raw timings, one dict per measured point (the Parquet sidecar's rows)."""

    rows: list[dict] = field(default_factory=list)

    def add(self, family: str, name: str, t: Timing, **coords) -> None:
        self.rows.append(
            {
                "family": family,
                "kernel": name,
                **coords,
                "median_s": t.median_s,
                "min_s": t.min_s,
                "max_s": t.max_s,
                "repeats": t.repeats,
                "inner": t.inner,
                "buffers": t.buffers,
            }
        )

    def select(self, family: str, **eq) -> list[dict]:
        return [r for r in self.rows if r["family"] == family and all(r.get(k) == v for k, v in eq.items())]

    def to_arrow(self):
        import pyarrow as pa

        keys: list[str] = []
        for r in self.rows:
            keys += [k for k in r if k not in keys]
        return pa.table({k: [r.get(k) for r in self.rows] for k in keys})


def _gemm_shapes(model: ModelSpec, dtype: str) -> dict[str, tuple[int, int]]:
    """(n, k) of each projection, from its curve key ``"NxK:dtype"``."""
    out = {}
    for proj, key in shape_keys(model, 1, dtype, dtype).gemms().items():
        n, k = (int(x) for x in key.split(":")[0].split("x"))
        out[proj] = (n, k)
    return out


def _ctx_cells(plan: Plan) -> list[tuple[int, int]]:
    """The prefill (batch, prompt length) cells within the plan's token cap."""
    return [(b, s) for b in plan.ctx_batch for s in plan.ctx_len if b * s <= plan.ctx_max_tokens]


def _gen_cells(plan: Plan, kv_tok_bytes: int) -> list[tuple[int, int]]:
    """The decode (batch, KV length) cells whose one-layer KV (``kv_tok_bytes`` a token) fits the plan's cap."""
    return [(b, s) for b in plan.gen_batch for s in plan.gen_len if b * s * kv_tok_bytes <= plan.gen_max_kv_bytes]


def _other_block_sizes(backend: AB.AttentionBackend, plan: Plan) -> list[int]:
    """The plan's block sizes besides the reference one that the backend can page with."""
    skipped = skipped_block_sizes(backend, plan)
    return [x for x in plan.block_sizes if x != REFERENCE_BLOCK_SIZE and x not in skipped]


class Job(NamedTuple):
    """One planned point: its progress label, buffer builder, row coordinates and the work of one call."""

    label: str
    setup: Callable[[], Setup]
    family: str
    kernel: str
    coords: dict
    work: Work


def plan_jobs(bench: Bench, model: ModelSpec, plan: Plan) -> list[Job]:
    """Every point of ``plan`` at ``model``'s TP-1 shapes, in timing order; nothing is allocated yet."""
    h, kvh = per_gpu_heads(model, 1)
    d = model.head_dim
    el = bench.elem
    kv_tok_bytes = 2 * kvh * d * el
    be = bench.kernels
    # the CPU sdpa backend gathers and attends one sequence at a time (attention_backends.SdpaBackend)
    per_seq = bench.ops.kind == "cpu" and be.name == "sdpa"
    jobs: list[Job] = []
    for proj, (n, k) in _gemm_shapes(model, bench.dtype_name).items():
        for m in plan.gemm_m:
            jobs.append(
                Job(
                    f"GEMM {proj} m={m}",
                    partial(bench.gemm_calls, m, n, k),
                    "gemm",
                    proj,
                    {"m": m, "n": n, "k": k},
                    Work.gemm(m, n, k, el),
                )
            )

    def prefill(b: int, s: int, kernel: str, kernels: AB.AttentionBackend | None = None) -> Job:
        backend = kernels.name if kernels is not None else be.name
        return Job(
            f"{kernel if kernels is not None else 'prefill'} b={b} s={s}",
            partial(bench.context_calls, b, s, h, kvh, d, **({"kernels": kernels} if kernels is not None else {})),
            "context_attention",
            kernel,
            {"batch": b, "length": s, "heads": h, "kv_heads": kvh, "head_dim": d, "backend": backend},
            Work.prefill(b, s, h, kvh, d, el),
        )

    jobs += [prefill(b, s, be.prefill_kernel) for b, s in _ctx_cells(plan)]
    gen_cells = _gen_cells(plan, kv_tok_bytes)
    sub_b = {plan.gen_batch[len(plan.gen_batch) // 2], plan.gen_batch[-1]}
    sub_l = {plan.gen_len[len(plan.gen_len) // 2], plan.gen_len[-1]}
    other_bs = _other_block_sizes(be, plan)

    def decode(b: int, s: int, name: str, bs: int | None, setup: Callable[[], Setup], backend: str, work: Work) -> Job:
        return Job(
            f"{name} b={b} L={s}" + (f" bs={bs}" if bs else ""),
            setup,
            "generation_attention",
            name,
            {
                "batch": b,
                "length": s,
                "heads": h,
                "kv_heads": kvh,
                "head_dim": d,
                "block_size": bs or 0,
                "backend": backend,
            },
            work,
        )

    for b, s in gen_cells:
        sizes = [None, REFERENCE_BLOCK_SIZE] + (other_bs if b in sub_b and s in sub_l else [])
        for bs in sizes:
            name = "decode_contiguous" if bs is None else "decode_paged"
            if bs is not None and per_seq:  # per sequence: two block gathers, one SDPA
                work = Work.decode(b, s, h, kvh, d, el, kernels=b, ops=2 * b, gathered=True)
            else:
                work = Work.decode(b, s, h, kvh, d, el)
            jobs.append(decode(b, s, name, bs, partial(bench.decode_calls, b, s, h, kvh, d, bs), be.name, work))
    if plan.static_decode:
        # the reference engine's static (contiguous-arena) layout runs SDPA on every backend: its decode
        # kernel, and (other backends) its prefill, timed for the static profile (with_static_decode)
        for b, s in gen_cells:
            setup = partial(bench.decode_static_calls, b, s, h, kvh, d)
            # per sequence: a view, a mask and one SDPA; then one concatenation
            work = Work.decode(b, s, h, kvh, d, el, kernels=b, ops=2 * b + 1)
            jobs.append(decode(b, s, "decode_static", None, setup, "sdpa", work))
        if be.name != "sdpa":
            sdpa = AB.SdpaBackend(bench.torch, bench.device)
            jobs += [prefill(b, s, STATIC_PREFILL, sdpa) for b, s in _ctx_cells(plan)]
    for nb in plan.mem_bytes:
        # zero_ fills buffers from torch.empty; a copy's source is random, drawn anew past the pool's size
        fresh = nb // el > POOL_ELEMS // 2
        jobs.append(
            Job(
                f"zero_ {nb} B",
                partial(bench.zero_fill_calls, nb),
                "memory",
                "zero_fill",
                {"nbytes": nb},
                Work.stream(nb),
            )
        )
        jobs.append(
            Job(
                f"copy_ {nb} B",
                partial(bench.copy_calls, nb),
                "memory",
                "copy",
                {"nbytes": nb},
                Work.stream(2 * nb, fresh=fresh),
            )
        )
        if bench.ops.pinned_host:
            for di in ("h2d", "d2h"):
                setup = partial(bench.host_transfer_calls, nb, di)
                jobs.append(Job(f"{di} {nb} B", setup, "memory", f"host_{di}", {"nbytes": nb}, Work.stream(2 * nb)))
    for tok in plan.ew_tokens:
        nbytes = 3 * tok * model.hidden * el
        setup = partial(bench.elementwise_calls, tok, model.hidden)
        jobs.append(
            Job(
                f"add_ {tok} tokens",
                setup,
                "elementwise",
                "add_",
                {"tokens": tok, "nbytes": nbytes},
                Work.stream(nbytes),
            )
        )
    jobs.append(
        Job(
            "block allocation", lambda: bench.alloc_events_calls(), "alloc", "block_alloc", {"events": 1}, Work.host(64)
        )
    )
    for b in plan.overhead_batch:
        jobs.append(
            Job(
                f"CPU step b={b}",
                partial(bench.step_cpu_calls, b, model.vocab),
                "cpu_overhead",
                "step_cpu",
                {"batch": b},
                Work.host(8 + 2 * b, nbytes=4 * b * model.vocab),
            )
        )
    return jobs


def run_measurements(
    bench: Bench,
    model: ModelSpec,
    plan: Plan,
    progress: bool = True,
    announce: Callable[[Estimate], None] | None = None,
) -> Measurements:
    """Time every point of ``plan`` at ``model``'s TP-1 shapes, in ``plan.passes`` interleaved passes.

    ``announce``: called before any buffer is built with the run's :class:`Estimate` (a short probe of
    the device's rates, then the plan's arithmetic: :func:`estimate_run`)."""
    h, kvh = per_gpu_heads(model, 1)
    d = model.head_dim
    jobs = plan_jobs(bench, model, plan)
    if announce is not None:
        announce(estimate_run([j.work for j in jobs], plan, probe_rates(bench, h, kvh, d), bench.rotate_bytes))
    block_sizes = [REFERENCE_BLOCK_SIZE, *_other_block_sizes(bench.kernels, plan)]
    paged_cells = [(b, s, bs) for b, s in _gen_cells(plan, 2 * kvh * d * bench.elem) for bs in block_sizes]
    paged_cells += [(b, s, 16) for b, s in _ctx_cells(plan)]
    try:
        bench.reserve_paged(paged_cells, h, kvh, d)
    except Exception as exc:
        if not out_of_memory(exc):
            raise
        raise _no_memory(bench, exc, model.name, "reserving the paged KV pool") from None
    timings = _run_jobs(bench, jobs, plan.passes, progress, model.name)
    meas = Measurements()
    for j, t in zip(jobs, timings):
        meas.add(j.family, j.kernel, t, **j.coords)
    return meas


def skipped_block_sizes(backend: AB.AttentionBackend, plan: Plan) -> dict[int, str]:
    """The plan's extra block sizes the backend's paged kernel cannot use, with the reason (the
    reference block size is never skipped: the profile's decode curve is measured at it)."""
    out = {}
    for bs in plan.block_sizes:
        why = backend.block_size_problem(bs)
        if why and bs != REFERENCE_BLOCK_SIZE:
            out[bs] = why
    return out


#: How torch says an allocation failed (CPU allocator, CUDA caching allocator, other backends).
_OOM_TEXT = ("out of memory", "not enough memory", "can't allocate memory", "cannot allocate memory")


def out_of_memory(exc: BaseException) -> bool:
    """``exc`` is an allocation failure (torch's ``OutOfMemoryError``, a ``MemoryError``, or a
    ``RuntimeError`` from the CPU allocator), not a bug."""
    if isinstance(exc, MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in _OOM_TEXT)


def _run_jobs(bench: Bench, jobs, passes: int, progress: bool, model: str = "") -> list[Timing]:
    """Time ``jobs``; a point whose buffers do not fit the device's memory is one ConfigError line
    naming the point, not a traceback (a model too big for this device)."""
    current = {"i": 0}

    def track(i: int, setup: Callable[[], Setup]) -> Setup:
        current["i"] = i
        return setup()

    setups: list[Callable[[], Setup]] = [partial(track, i, j.setup) for i, j in enumerate(jobs)]
    try:
        return time_jobs(bench, jobs, setups, passes, progress)
    except Exception as exc:
        if not out_of_memory(exc):
            raise
        raise _no_memory(bench, exc, model, f"timing {jobs[current['i']].label}") from None


def _no_memory(bench: Bench, exc: BaseException, model: str, doing: str) -> ConfigError:
    """The one line of an allocation failure while ``doing`` (a model too big for this device)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if bench.ops.kind == "cuda":
        bench.ops.torch.cuda.empty_cache()
    return ConfigError(
        "calibrate.model",
        model or "?",
        f"a model whose kernels fit this device's memory: {doing} ran out of memory ({first[:200]}); "
        "calibrate a smaller model, or on a device with more memory",
    )


def time_jobs(bench: Bench, jobs, setups, passes: int, progress: bool) -> list[Timing]:
    """``bench.measure`` of ``setups`` over ``passes``, with a progress bar (or log lines) when ``progress``."""
    if not progress:
        return bench.measure(setups, passes)
    from sim.output.progress import Progress

    # A bar on a terminal, plain lines in a log (sim.output.progress); its last state stays on screen.
    state = {"pass": 1, "done": 0}

    def label(i: int) -> str:
        return f"pass {min(state['pass'], passes)}/{passes} {jobs[i % len(jobs)].label}"

    with Progress(
        "calibrate", "kernel timings", len(jobs) * passes, transient=False, note=label(0), lazy=True
    ) as shown:

        def done(i):
            if i == len(jobs) - 1:
                state["pass"] += 1
            state["done"] += 1
            shown.update(state["done"], note=label(i + 1))

        return bench.measure(setups, passes, on_done=done)


def measure_device(
    device: str,
    model: ModelSpec,
    plan: Plan,
    *,
    dtype: str = "bf16",
    threads: int | None = None,
    progress: bool = False,
    cpu_time: bool = False,
    speed=None,
    kernels: str = "auto",
    ops: Device | None = None,
    registry: dict | None = None,
    announce: Callable[[Estimate], None] | None = None,
) -> tuple[Measurements, dict]:
    """Time every point of ``plan`` (no fitting): the measurements and the device's description
    (``attention``: the backend's :meth:`~calibration.attention_backends.AttentionBackend.describe`, the
    block sizes it skipped, its counters). Arguments as :func:`calibrate_device`; ``announce`` as
    :func:`run_measurements`."""
    if device not in DEVICES:
        raise ConfigError("calibrate.device", device, f"one of {', '.join(DEVICES)}")
    if dtype not in TORCH_DTYPES:
        raise ConfigError("calibrate.dtype", dtype, f"one of {', '.join(TORCH_DTYPES)} on the --device route")
    bench = Bench.open(device, dtype, threads=threads, kernels=kernels, ops=ops, registry=registry)
    try:
        bench.repeats, bench.warmup, bench.target = plan.repeats, plan.warmup, plan.target_repeat_s
        if cpu_time and device == "cpu":
            bench.timer = time.thread_time
        bench.speed = speed
        info = describe_device(bench)
        t0 = time.perf_counter()
        meas = run_measurements(bench, model, plan, progress, announce)
        info["attention"] = {
            **bench.kernels.describe(),
            "prefill_kernel": bench.kernels.prefill_kernel,
            "skipped_block_sizes": {str(k): v for k, v in skipped_block_sizes(bench.kernels, plan).items()},
            "measure_s": round(time.perf_counter() - t0, 1),
            **bench.kernels.stats(),
        }
    finally:
        bench.close()
    return meas, info


def pool_measurements(runs: list[Measurements]) -> Measurements:
    """One point per measured coordinate from several runs of the same plan: the median of the
    runs' medians (each run's value already robust to its slow samples; a run taken in a slow
    or oddly-loaded window is outvoted), the extreme min and max, the repeats summed. A point
    missing from some runs is pooled over the runs that have it."""
    stats = ("median_s", "min_s", "max_s", "repeats", "inner", "buffers", "runs")
    groups: dict[tuple, list[dict]] = {}  # in first-seen order
    for m in runs:
        for r in m.rows:
            key = tuple(sorted((k, v) for k, v in r.items() if k not in stats))
            groups.setdefault(key, []).append(r)
    out = Measurements()
    for rs in groups.values():
        row = {k: v for k, v in rs[0].items() if k not in stats}
        row.update(
            median_s=float(np.median([r["median_s"] for r in rs])),
            min_s=min(r["min_s"] for r in rs),
            max_s=max(r["max_s"] for r in rs),
            repeats=sum(r["repeats"] for r in rs),
            inner=rs[-1]["inner"],
            buffers=rs[-1]["buffers"],
            runs=sum(r.get("runs", 1) for r in rs),
        )
        out.rows.append(row)
    return out
