"""The profiles a validation compares against (:func:`prepare_profiles`): route 1 on the validation
grid (:class:`KernelRounds`) and the reference engine's overhead runs (:class:`OverheadRounds`), both
in rounds spread over the run and fitted on every round pooled."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.catalog import get_model

from .spec import OVERHEAD_MIX, ValidationSpec

if TYPE_CHECKING:
    from .host_speed import HostSpeed


def validation_plan(spec: ValidationSpec, device: str):
    """A route-1 grid covering the spec's batch shapes only (seconds, not minutes)."""
    from ..kernels import Plan, pow2_grid

    model = get_model(spec.model)
    T = spec.scheduler.max_num_batched_tokens
    S = spec.scheduler.max_num_seqs
    L = min(spec.workload.max_model_len, model.max_position)
    top = 1 << max(1, (max(T, S) - 1).bit_length())
    ltop = 1 << max(5, (L - 1).bit_length())
    return Plan(
        gemm_m=pow2_grid(1, top),
        ctx_batch=(1, 2, 4),
        ctx_len=pow2_grid(16, min(ltop, model.max_position), 1),
        ctx_max_tokens=4 * top,
        gen_batch=pow2_grid(1, 1 << (S - 1).bit_length()),
        gen_len=pow2_grid(16, min(ltop, model.max_position)),
        gen_max_kv_bytes=256 << 20,
        block_sizes=(8, 32),
        overhead_batch=pow2_grid(1, 64, 2),
        # on a GPU up to 256 MB: past an H100/H200's 50-60 MB L2, so the copies time HBM too
        mem_bytes=pow2_grid(1 << 12, 1 << 24 if device == "cpu" else 1 << 28, 4),
        # on a GPU 256 tokens of adds are launch-bound: a fit on them alone put the H200's elementwise
        # bandwidth anywhere from 0.65 to 138 TB/s, and at 0.65 priced an 8B 1,536-token
        # prefill's adds at 16 ms. Up to 16,384 tokens (128 MB at hidden 4096, past the L2) as
        # `calibrate --quick` times them there.
        ew_tokens=(1, 16, 256) if device == "cpu" else (1, 16, 256, 4096, 16384),
        repeats=5,
        warmup=2,
        target_repeat_s=0.0005,
        passes=2 if device == "cpu" else 1,
        static_decode="static" in spec.allocators,
    )


def prepare_profiles(
    spec: ValidationSpec,
    device: str,
    out: Path,
    profile: str | None,
    engine_overhead: bool = True,
    progress: bool = False,
    speed: HostSpeed | None = None,
    net=None,
) -> tuple[dict[str, str], dict, OverheadRounds | None]:
    """Profile file per allocator (kernel curves + the engine's measured overhead for that layout),
    the calibration's description, and the overhead's :class:`OverheadRounds` (to add rounds to
    and refit; ``None`` without ``engine_overhead``).

    ``speed`` (the ``cpu_norm`` clock's :class:`HostSpeed`): the whole calibration is put at one
    reference host speed. Its probes run 10 times before the kernel route and then between the
    route's points (every :attr:`HostSpeed.every_s` of wall time); the **reference** is the median of
    those probes, and every kernel sample is multiplied by reference ÷ the median of the probes
    around it (:meth:`HostSpeed.factor_at`); kernels are timed in thread CPU time. The overhead runs
    then run on the engine's ``cpu_norm`` clock with that reference (the replay's normalisation),
    so kernel curves, overhead fit and the ``cpu_norm`` replays share one reference speed.
    The static profile's decode-attention grid is the engine's static kernel (``decode_static``).
    """
    from sim.cost.profile import load_profile

    model = get_model(spec.model)
    eng = spec.engine
    info: dict = {}
    t0 = time.perf_counter()
    cpu_clock = device == "cpu" and eng.clocks[0] in ("cpu", "cpu_norm")
    if speed is not None:
        speed.sample("before_calibration", 10)
    bases = {}
    kernels = None
    if profile is None:
        kernels = KernelRounds(spec, device, model, speed=speed, cpu_time=cpu_clock, progress=progress)
        bases = kernels.bases()
        base = bases[spec.allocators[0]]
        info["calibrated"] = {
            "route": "kvsim calibrate --device (route 1), validation grid",
            "elapsed_s": kernels.log[0]["elapsed_s"],
            "points": sum(base.provenance["measured_points"].values()),
            "timer": "thread CPU time" if cpu_clock else "wall time",
            "normalised": speed is not None,
        }
    else:
        base = load_profile(profile)
        info["loaded"] = profile
        cdt = base.provenance.get("compute_dtype", base.dtypes.get("weight", ["?"])[0])
        if cdt != eng.dtype:
            info["dtype_mismatch"] = f"profile kernels timed in {cdt}, engine computes in {eng.dtype}"
        bases = {a: base for a in spec.allocators}
    if speed is not None:
        speed.freeze()
    rounds = None
    if engine_overhead:
        norm_speed = speed if cpu_clock else None  # the host-speed normaliser: cpu clocks only
        norm = norm_speed is not None
        kw = dict(
            allocators=tuple(spec.allocators),
            block_size=spec.kv.block_size,
            dtype=eng.dtype,
            threads=eng.threads,
            device=device,
            kernels=eng.kernels,
            clock=("cpu_norm" if norm else "cpu") if cpu_clock else "wall",
            probe_ref_s={a: norm_speed.reference(a) for a in spec.allocators} if norm_speed is not None else None,
            prefill_probe_ref_s={a: norm_speed.prefill_reference(a) for a in norm_speed.prefill_probes}
            if norm_speed is not None and norm_speed.prefill_probes
            else None,
            max_num_batched_tokens=spec.scheduler.max_num_batched_tokens,
            batches=tuple(b for b in (1, 2, 4, 8, 16, 32) if b <= spec.scheduler.max_num_seqs),
            mixes=OVERHEAD_MIX[eng.overhead_mix],
            net=net,
        )
        rounds = OverheadRounds(
            bases,
            model,
            kw,
            norm_speed,
            between_runs=(lambda: speed.sample("engine_overhead", 1)) if speed and not norm else None,
            kernels=kernels if eng.kernel_rounds == "spread" else None,
        )
        rounds.upfront()
        paths = rounds.write(out)
        info["engine_overhead"] = rounds.summary()
    else:
        paths = {}
        for alloc in spec.allocators:
            path = out / f"profile-{alloc}.json"
            bases[alloc].write(path)
            paths[alloc] = str(path)
    if speed is not None:
        speed.sample("after_calibration", 10)
    info["elapsed_s"] = round(time.perf_counter() - t0, 1)
    info["name"] = base.name
    return paths, info, rounds


class KernelRounds:
    """Route 1's validation grid (:func:`validation_plan`), timed up front and again, one pass,
    before every overhead round (``engine.kernel_rounds: spread``); the kernel curves are fitted on
    every pass pooled (:func:`calibration.kernels.pool_measurements`: per point the median of the
    passes' medians).

    Why: one route is one ~6 s window, and its curves move by shape from window to window even
    normalised by the probe (this sandbox, five routes back to back in one process, kernels-only
    predictions in reference units: a one-sequence decode 0.95–1.14 of their mean, four sequences
    0.88–1.11, a 256-token prefill 0.86–1.06, each route off in its own pattern). The overhead
    fit ``a + b·S + c·P`` takes out a level, not a shape, so a run's cells that lean on one shape
    (light load: one or two sequences; saturating: full batches) inherited that window's error.
    Pooled over the run, as the overhead already is, the pattern averages out. Each later pass is
    put at the frozen reference by the probes around its own points (:meth:`HostSpeed.kernel_round`).
    """

    def __init__(
        self,
        spec: ValidationSpec,
        device: str,
        model,
        *,
        speed: HostSpeed | None,
        cpu_time: bool,
        progress: bool = False,
    ):
        from ..kernels import measure_device

        eng = spec.engine
        self.spec, self.device, self.model, self.speed = spec, device, model, speed
        self.allocators = tuple(spec.allocators)
        self.plan = validation_plan(spec, device)
        self.name = f"{device}-{model.name}-{eng.dtype}-validate"
        self.kw: dict[str, Any] = dict(dtype=eng.dtype, threads=eng.threads, cpu_time=cpu_time, kernels=eng.kernels)
        t = time.perf_counter()
        meas, self.info = measure_device(device, model, self.plan, progress=progress, speed=speed, **self.kw)
        if speed is not None:
            speed.freeze()
        self.runs = [meas]
        self.log = [
            {"label": "calibration", "passes": self.plan.passes, "elapsed_s": round(time.perf_counter() - t, 1)}
        ]
        self._bases: dict | None = None

    def round(self, label: str) -> None:
        """One more pass of the grid, pooled into :meth:`bases`."""
        from dataclasses import replace

        from ..kernels import measure_device

        t = time.perf_counter()
        with self.speed.kernel_round() if self.speed is not None else contextlib.nullcontext():
            meas, _ = measure_device(self.device, self.model, replace(self.plan, passes=1), speed=self.speed, **self.kw)
        self.runs.append(meas)
        self.log.append({"label": label, "passes": 1, "elapsed_s": round(time.perf_counter() - t, 1)})
        self._bases = None

    def passes(self) -> int:
        return sum(x["passes"] for x in self.log)

    def bases(self) -> dict:
        """Per allocator, the kernel profile fitted on every pass so far (``static``: its decode grid
        the engine's static kernel, :func:`calibration.kernels.with_static_decode`)."""
        from ..kernels import build_device_profile, pool_measurements, with_static_decode

        if self._bases is None:
            meas = self.runs[0] if len(self.runs) == 1 else pool_measurements(self.runs)
            base, _ = build_device_profile(
                meas,
                self.model,
                self.info,
                self.plan,
                name=self.name,
                dtype=self.spec.engine.dtype,
                elapsed_s=sum(x["elapsed_s"] for x in self.log),
                key_dtype="bf16",
            )
            if len(self.runs) > 1:
                base.provenance["kernel_rounds"] = {
                    "passes": self.passes(),
                    "runs": len(self.runs),
                    "pooled": "per point, the median of the runs' medians",
                }
            self._bases = {
                a: with_static_decode(base, meas, self.model) if a == "static" else base for a in self.allocators
            }
        return self._bases


class OverheadRounds:
    """The reference engine's per-iteration overhead (:func:`calibration.kernels.measure_engine_overhead`),
    measured in rounds spread over the whole validation and fitted on all of them pooled.

    :meth:`upfront` runs the calibration's passes (3) before any replay; with
    ``engine.overhead_rounds: spread`` ``validate`` adds one pass (:meth:`round`, both layouts
    interleaved, new prompts each time) per cell, evenly among the replays, and one after the last, and
    the final profiles (:meth:`write`) are fitted on every pass pooled. Why: on a shared host one
    pass's fit moves far between rounds a few seconds apart (this sandbox, one process, 8 rounds of
    one pass: the median one-sequence decode iteration 1.96–3.60 ms paged, 1.43–2.86 ms static, on
    the ``cpu_norm`` clock), so a calibration taken in one 12 s window sets every cell's level by
    that window's luck. Spread over the run, the overhead is measured under the same mix of host
    states as the replays, still only on offline batches of its own prompts: nothing here reads
    a replay. Capacities and arrival rates are set from the up-front fit (they must exist before
    the first replay).
    """

    #: passes of the offline batches before the first replay
    upfront_passes = 3

    def __init__(
        self,
        bases: dict,
        model,
        kw: dict,
        speed: HostSpeed | None = None,
        between_runs=None,
        kernels: KernelRounds | None = None,
    ):
        self.bases, self.model, self.kw, self.speed, self.between_runs = bases, model, kw, speed, between_runs
        self.kernels = kernels
        self.rows: dict[str, list] = {a: [] for a in kw["allocators"]}
        self.log: list[dict] = []
        self.t0 = time.perf_counter()
        self._fits: dict[str, dict] | None = None  # the pooled fit, until the next round

    def _measure(self, label: str, passes: int) -> None:
        from ..kernels import measure_engine_overhead

        k = len(self.log)
        if k > 0 and self.kernels is not None:  # the kernel grid again, right before this round
            self.kernels.round(label)
        phase = "engine_overhead" if k == 0 else "overhead_rounds"
        ovs = measure_engine_overhead(
            self.bases,
            self.model,
            passes=passes,
            seed=k,
            probes=self.speed.logged(phase) if self.speed is not None else None,
            prefill_probes=self.speed.logged(phase, prefill=True) if self.speed is not None else None,
            between_runs=self.between_runs,
            **self.kw,
        )
        for a, ov in ovs.items():
            self.rows[a] += [dict(r, round=k) for r in ov["rows"]]
        ov = ovs[next(iter(ovs))]
        self.log.append(
            {
                "round": k,
                "label": label,
                "passes": passes,
                "elapsed_s": ov["elapsed_s"],
                "start_s": round(time.perf_counter() - self.t0 - ov["elapsed_s"], 2),
            }
        )
        self._meta = {
            x: ov[x]
            for x in (
                "block_size",
                "dtype",
                "threads",
                "clock",
                "batches",
                "prompt_range",
                "output_tokens",
                "mixes",
                "output_range",
            )
            if x in ov
        }
        self._fits = None

    def upfront(self) -> None:
        self._measure("calibration", self.upfront_passes)

    def round(self, label: str) -> None:
        """One more pass of the offline batches (both layouts), pooled into the fit."""
        self._measure(label, 1)

    def _rebase(self) -> None:
        """With kernel rounds: the kernel curves pooled over every pass so far, and every overhead
        row's prediction and residual recomputed against them (the rows stay as measured)."""
        from ..kernels import kernel_cost, repredict

        if self.kernels is None or len(self.kernels.runs) < 2:
            return
        self.bases = self.kernels.bases()
        for a in self.rows:
            cost = kernel_cost(self.bases[a], self.model, a, int(self.kw["block_size"]))
            self.rows[a] = repredict(self.rows[a], cost, self._meta["clock"])

    def fits(self) -> dict[str, dict]:
        """Per allocator, :func:`calibration.kernels.fit_overhead` on every round's rows pooled
        (against the pooled kernel curves, with kernel rounds)."""
        from ..kernels import fit_overhead

        if self._fits is None:
            self._rebase()
            passes = sum(x["passes"] for x in self.log)
            elapsed = round(sum(x["elapsed_s"] for x in self.log), 2)
            self._fits = {
                a: {
                    **fit_overhead(rows, self._meta["clock"]),
                    "allocator": a,
                    **self._meta,
                    "passes": passes,
                    "rounds": len(self.log),
                    "elapsed_s": elapsed,
                    **({"kernel_passes": self.kernels.passes()} if self.kernels is not None else {}),
                    **({"probe_ref_s": float(self.kw["probe_ref_s"][a])} if self.kw.get("probe_ref_s") else {}),
                }
                for a, rows in self.rows.items()
            }
        return self._fits

    def write(self, out: Path) -> dict[str, str]:
        """``profile-<allocator>.json`` per allocator: its kernel profile + the pooled overhead fit."""
        from ..kernels import with_engine_overhead

        fits = self.fits()
        paths = {}
        for a, fit in fits.items():
            path = out / f"profile-{a}.json"
            with_engine_overhead(self.bases[a], fit, self.model).write(path)
            paths[a] = str(path)
        return paths

    def level_by_round(self) -> list[dict]:
        """Each round's pure-decode iterations, measured ÷ (kernels + pooled fit) summed: how far the
        host's (normalised) speed in that round sat from the pooled level."""
        from ..kernels import row_time_s, step_overhead_s

        fits = self.fits()
        out = []
        for x in self.log:
            row = {k: x[k] for k in ("round", "label", "passes", "start_s", "elapsed_s")}
            for a, rows in self.rows.items():
                f = fits[a]
                rs = [r for r in rows if r["round"] == x["round"] and r["pure_decode"]]
                meas = sum(row_time_s(r, self._meta["clock"]) for r in rs)
                pred = float(sum(r["predicted_s"] for r in rs) + step_overhead_s(f, [r["seqs"] for r in rs]).sum())
                row[a] = round(meas / pred, 4) if pred > 0 else None
            out.append(row)
        return out

    def summary(self) -> dict:
        fits = self.fits()
        return {a: {k: v for k, v in f.items() if k not in ("rows", "speed_probes")} for a, f in fits.items()}
