"""The reference engine's configuration (:class:`EngineConfig`), its clocks and cache layouts, and torch
imported only when an engine runs."""

from __future__ import annotations

from dataclasses import dataclass

from sim.catalog import ModelSpec

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
#: Engine.run clocks; ``cpu_norm`` is ``cpu`` normalised by a host-speed probe (:class:`SpeedProbe`).
CLOCKS = ("wall", "cpu", "cpu_norm", "virtual")
#: cpu_norm: probe every this many seconds of engine thread CPU time, scale by the median of the last
#: PROBE_WINDOW probes (chosen by measurement, docs/validation.md: 25-50 ms track the host's speed
#: changes, which last ~0.5 s and more; the probe's 2 x ~8 ms then cost ~30 % extra run time, not charged).
PROBE_EVERY_S = 0.05
PROBE_WINDOW = 3
ALLOCATORS = ("paged", "static")


def load_torch():
    """torch, imported on first use (:func:`calibration.kernels.import_torch`: a clear error where it
    is missing), so that reading a validation spec does not pay for it."""
    from ..kernels import import_torch

    return import_torch()


@dataclass
class EngineConfig:
    model: ModelSpec
    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 256
    allocator: str = "paged"
    #: static: slots reserved per request (``None``: ``max_model_len``).
    reserve: int | None = None
    max_model_len: int = 1024
    chunked_prefill: bool = True
    dtype: str = "fp32"
    threads: int = 1
    seed: int = 0
    device: str = "cpu"
    #: attention backend of the paged layout (:data:`calibration.attention_backends.KERNELS`; ``auto``: CPU
    #: sdpa, CUDA the first installed of flashinfer, vllm, flex). The static layout runs SDPA on every one.
    kernels: str = "auto"

    def __post_init__(self):
        if self.allocator not in ALLOCATORS:
            raise ValueError(f"allocator {self.allocator!r}: one of {ALLOCATORS}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: one of {tuple(DTYPES)}")
        if self.allocator == "static" and self.reserve is None:
            self.reserve = self.max_model_len

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size
