"""Route 1 of ``kvsim calibrate``: time real torch kernels on this machine (``--device cpu|cuda``).

Not implemented yet. The intended design: import torch lazily here only; time the model's
projection GEMMs over a token grid, SDPA prefill and decode attention over (batch, length)
grids, memcpy/memset/host-transfer bandwidths and caching-allocator latency; feed the
timings through the same :mod:`calibration.fit` path as the published tables so the
output is an ordinary :class:`sim.profile.Profile`.
"""

from __future__ import annotations

from sim.catalog import ModelSpec
from sim.errors import ConfigError


def calibrate_device(device: str, model: ModelSpec, *, quick: bool = False, name: str | None = None,
                     dtype: str = "bf16"):
    raise ConfigError("calibrate.device", device, "not implemented yet; use --from-tables DIR (published kernel tables)")
