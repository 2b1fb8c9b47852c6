"""Route 1 end to end: time a plan on the device, fit the profile, write it with its sidecar files
(``<out>.measurements.parquet``, the raw rows; ``<out>.report.html``, the fit report when plotly is
importable)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from sim.catalog import ModelSpec
from sim.cost.profile import Profile

from ..devices import Device
from .device_profile import build_device_profile
from .estimate import Estimate
from .measure import Measurements, measure_device
from .plan import Plan, make_plan
from .report import write_report


def sidecar_paths(out: Path | str) -> tuple[Path, Path]:
    out = Path(out)
    stem = out.with_suffix("")
    return stem.with_name(stem.name + ".measurements.parquet"), stem.with_name(stem.name + ".report.html")


@dataclass
class DeviceResult:
    profile: Profile
    measurements: Measurements
    fits: dict
    elapsed_s: float


def calibrate_device(
    device: str,
    model: ModelSpec,
    *,
    quick: bool = False,
    name: str | None = None,
    dtype: str = "bf16",
    threads: int | None = None,
    progress: bool = True,
    plan: Plan | None = None,
    key_dtype: str | None = None,
    cpu_time: bool = False,
    speed=None,
    kernels: str = "auto",
    ops: Device | None = None,
    registry: dict | None = None,
) -> DeviceResult:
    """Time ``model``'s kernels on ``device`` and fit a profile (see :mod:`calibration.kernels`).

    ``cpu_time`` (CPU only): time repeats in the thread's CPU time (``time.thread_time``) instead of
    wall time. ``speed``: a host-speed normaliser (:attr:`Bench.speed`; ``kvsim validate``'s
    :class:`calibration.validate.HostSpeed`) that puts every sample at its reference speed.
    ``kernels``: the attention backend (:data:`calibration.attention_backends.KERNELS`); ``ops`` and
    ``registry``: a stand-in device and set of backends (:meth:`Bench.open`). With ``progress``, one
    line before timing gives the number of points and the estimated timing
    (:mod:`calibration.kernels.estimate`; a second line warns of a run over
    :data:`~calibration.kernels.estimate.LONG_RUN_MIN` minutes), then a progress bar with an ETA.
    """
    t0 = time.perf_counter()
    plan = plan or make_plan(device, model, quick)

    def announce(est: Estimate) -> None:
        for line in est.lines(device=device, quick=quick):
            print(line, flush=True)

    meas, info = measure_device(
        device,
        model,
        plan,
        dtype=dtype,
        threads=threads,
        progress=progress,
        cpu_time=cpu_time,
        speed=speed,
        kernels=kernels,
        ops=ops,
        registry=registry,
        announce=announce if progress else None,
    )
    elapsed = time.perf_counter() - t0
    profile, fits = build_device_profile(
        meas, model, info, plan, name=name, dtype=dtype, elapsed_s=elapsed, key_dtype=key_dtype
    )
    return DeviceResult(profile, meas, fits, elapsed)


def write_outputs(
    result: DeviceResult, out: Path | str, model: ModelSpec, report: bool = True
) -> dict[str, Path | None]:
    """Write the profile, the Parquet sidecar of raw timings and (with plotly) the HTML fit report.

    The files appear together or not at all: they are written into a staging folder beside ``out``
    and moved into place with SIGINT/SIGTERM held back (:func:`sim.output.staging.staged`),
    so an interruption or a failure while writing leaves an earlier run's files as they were. A report
    an earlier run left at this ``out`` is removed in the same step when this run writes none
    (``report=False``, or plotly missing): it described another calibration (``written["removed"]``).
    """
    import pyarrow.parquet as pq

    from sim.output.staging import staged

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pq_path, html_path = sidecar_paths(out)
    written: dict[str, Path | None] = {"profile": out, "measurements": pq_path, "report": None, "removed": None}
    stale: list[Path] = []
    # the three names exactly: a profile named ``.x.json`` (and its dot-named sidecars) is moved too
    with staged(out.parent, only=[out.name, pq_path.name, html_path.name], remove=stale) as stage:
        result.profile.write(stage / out.name)
        pq.write_table(result.measurements.to_arrow(), stage / pq_path.name, compression="zstd")
        if report and write_report(stage / html_path.name, result.profile, result.measurements, result.fits, model):
            written["report"] = html_path
        elif html_path.is_file():
            stale.append(html_path)
            written["removed"] = html_path
    return written
