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
    ``registry``: a stand-in device and set of backends (:meth:`Bench.open`).
    """
    t0 = time.perf_counter()
    plan = plan or make_plan(device, model, quick)
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
    )
    elapsed = time.perf_counter() - t0
    profile, fits = build_device_profile(
        meas, model, info, plan, name=name, dtype=dtype, elapsed_s=elapsed, key_dtype=key_dtype
    )
    return DeviceResult(profile, meas, fits, elapsed)


def write_outputs(
    result: DeviceResult, out: Path | str, model: ModelSpec, report: bool = True
) -> dict[str, Path | None]:
    """Write the profile, the Parquet sidecar of raw timings and (with plotly) the HTML fit report."""
    import pyarrow.parquet as pq

    out = Path(out)
    path = result.profile.write(out)
    pq_path, html_path = sidecar_paths(out)
    pq.write_table(result.measurements.to_arrow(), pq_path, compression="zstd")
    written = {"profile": path, "measurements": pq_path, "report": None}
    if report:
        written["report"] = write_report(html_path, result.profile, result.measurements, result.fits, model)
    return written
