"""What calibration's timing loop needs from a device, behind one small interface.

:class:`Device` is the device side of :class:`calibration.kernels.Bench`: where tensors live, how a
timed loop is bracketed (the host clock on CPU; CUDA events around the loop, then a synchronise, on
CUDA), whether pinned host memory exists for host transfers, and the device's description for the
profile's provenance. Tests stand in a fake (a CPU device that calls itself ``cuda``) to run the
CUDA route's selection, provenance and profile writer on a machine without a GPU.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from pathlib import Path


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _host(torch) -> dict:
    return {
        "torch": torch.__version__,
        "host_cpu": cpu_model_name(),
        "host_cores": os.cpu_count(),
        "platform": platform.platform(),
    }


class Device:
    """A device kind (``kind``: what the profile calls it) whose tensors live on ``tensor_device``."""

    kind = "cpu"
    #: host transfers use pinned host memory (else they are timed as a copy between two host buffers)
    pinned_host = False

    def __init__(self, torch, tensor_device):
        self.torch = torch
        self.tensor_device = tensor_device

    def sync(self) -> None:
        """Wait for queued work (no-op where calls are synchronous)."""

    def loop_seconds(self, loop: Callable[[], None], clock: Callable[[], float]) -> float:
        """Seconds one run of ``loop`` took on this device (``clock``: the host timer to use)."""
        t0 = clock()
        loop()
        return clock() - t0

    def describe(self, dtype: str, threads: int | None) -> dict:
        info = {"kind": self.kind, **_host(self.torch), "dtype": dtype, "name": cpu_model_name(), "threads": threads}
        try:
            kb = next(
                int(line.split()[1])
                for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")
            )
            info["memory_bytes"] = kb * 1024
        except (OSError, StopIteration, ValueError):
            pass
        return info


class CpuDevice(Device):
    kind = "cpu"


class CudaDevice(Device):
    """CUDA: each timed loop bracketed by CUDA events (``end.synchronize()``), pinned host buffers."""

    kind = "cuda"
    pinned_host = True

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.tensor_device)

    def loop_seconds(self, loop, clock):
        cuda = self.torch.cuda
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        loop()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3

    def describe(self, dtype, threads):
        torch = self.torch
        dev = self.tensor_device
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        info = {
            "kind": "cuda",
            **_host(torch),
            "dtype": dtype,
            "name": torch.cuda.get_device_name(idx),
            "memory_bytes": int(props.total_memory),
            "compute_capability": f"{props.major}.{props.minor}",
            # copies that fit in L2 time its bandwidth, not HBM's (device_profile.hbm_bandwidth)
            "l2_cache_bytes": int(getattr(props, "L2_cache_size", 0)),
            "cuda_runtime": torch.version.cuda,
            "cudnn": str(torch.backends.cudnn.version()),
        }
        try:
            info["cuda_driver"] = int(torch._C._cuda_getDriverVersion())
        except Exception:  # private API; absent in some builds
            info["cuda_driver"] = None
        return info


def open_device(torch, device) -> Device:
    """The :class:`Device` of a real ``torch.device``."""
    return CudaDevice(torch, device) if device.type == "cuda" else CpuDevice(torch, device)
