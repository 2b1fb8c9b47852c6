"""Route 1 of ``kvsim calibrate``: time real torch kernels on this machine (``--device cpu|cuda``).

torch is imported only in :mod:`calibration.kernels.timing`, and lazily (:func:`import_torch`): the
simulator never needs it.

What is timed, at exactly one model's kernel shapes (TP 1, ``--dtype`` bf16):

* **GEMMs** ``F.linear`` for QKV, O, gate+up, down and the LM head over a grid of token
  counts ``m``;
* **prefill attention** (causal) over (batch, prompt length) and **decode attention** (one query
  token per sequence) over (batch, KV length) on a *contiguous* cache and on a *paged* cache (a
  preallocated block pool plus random block tables), all by one attention backend
  (:mod:`calibration.attention_backends`, ``--kernels``: sdpa, flex, flashinfer, vllm), the one the
  reference engine runs. The profile's generation curve is the paged one at
  :data:`REFERENCE_BLOCK_SIZE`; the contiguous grid gives the measured ``layout.paged_overhead``
  and other block sizes ``paged_overhead_by_block_size``;
* **memory operations** the allocators charge: ``zero_()`` and ``copy_`` bandwidth and
  latency over a size grid, host↔device transfers (pinned host memory on CUDA; on CPU a
  memcpy between two host buffers, i.e. the copy measurement, stated as such), the
  bookkeeping of one block allocation (pop from a free list, extend a block-table row,
  write the row into the block-table tensor), and the elementwise kernels' bandwidth
  (``add_`` over activations);
* the **CPU side of a step** vs batch size: a Python loop building the batch metadata
  (input ids, positions, slot mapping, padded block tables) moved to the device, an argmax
  sampler over vocab-sized logits read back to the host, and the output bookkeeping.

The measurements become ordinary :class:`calibration.tables.GemmTable` /
``AttentionTable`` rows and go through :mod:`calibration.fit` (parametric form + grid
correction, 80/20 held-out score) into an ordinary :class:`sim.cost.profile.Profile`. Raw rows
are written beside the profile as Parquet (``<out>.measurements.parquet``) and a plotly
fit report as HTML (``<out>.report.html``) when plotly is importable.

The modules, in the order the data flows:

* :mod:`~calibration.kernels.plan`: the grids and timing effort of a run (:class:`Plan`);
* :mod:`~calibration.kernels.timing`: how one point is timed (:class:`Bench`, :class:`Timing`);
* :mod:`~calibration.kernels.estimate`: how long a plan's timing will take, said before it starts;
* :mod:`~calibration.kernels.measure`: a plan timed into :class:`Measurements`, runs pooled;
* :mod:`~calibration.kernels.device_profile`: measurements fitted into a profile;
* :mod:`~calibration.kernels.report`: the HTML fit report;
* :mod:`~calibration.kernels.calibrate`: the route end to end (:func:`calibrate_device`, :func:`write_outputs`);
* :mod:`~calibration.kernels.engine_overhead`: the reference engine's per-iteration framework
  overhead, measured with its own loop and fitted into a profile's CPU-step term.

Callers import from this package; the names below are its interface.
"""

from __future__ import annotations

from .calibrate import DeviceResult, calibrate_device, sidecar_paths, write_outputs
from .device_profile import ELEMENTWISE_KERNELS, METHOD, build_device_profile, with_static_decode
from .engine_overhead import (
    AFTER_PREFILL,
    BY_SEQS_MIN,
    ENGINE_OVERHEAD_BATCHES,
    FIT_CENTERS,
    OVERHEAD_MIXES,
    TRIM_MIN,
    decode_since_prefill,
    engine_iteration_rows,
    fit_overhead,
    kernel_cost,
    kernels_only,
    measure_engine_overhead,
    repredict,
    row_time_s,
    step_overhead_s,
    with_engine_overhead,
)
from .measure import Measurements, measure_device, pool_measurements, run_measurements, skipped_block_sizes
from .plan import (
    REFERENCE_BLOCK_SIZE,
    STATIC_PREFILL,
    Plan,
    make_plan,
    pow2_grid,
)
from .report import write_report
from .timing import (
    DEVICES,
    MAX_POINT_S,
    MAX_ROTATIONS,
    POOL_ELEMS,
    ROTATE_BYTES,
    Bench,
    Setup,
    Timing,
    check_device,
    describe_device,
    import_torch,
)

__all__ = [
    "AFTER_PREFILL",
    "BY_SEQS_MIN",
    "DEVICES",
    "ELEMENTWISE_KERNELS",
    "ENGINE_OVERHEAD_BATCHES",
    "FIT_CENTERS",
    "MAX_POINT_S",
    "MAX_ROTATIONS",
    "METHOD",
    "OVERHEAD_MIXES",
    "POOL_ELEMS",
    "REFERENCE_BLOCK_SIZE",
    "ROTATE_BYTES",
    "STATIC_PREFILL",
    "TRIM_MIN",
    "Bench",
    "DeviceResult",
    "Measurements",
    "Plan",
    "Setup",
    "Timing",
    "build_device_profile",
    "calibrate_device",
    "check_device",
    "decode_since_prefill",
    "describe_device",
    "engine_iteration_rows",
    "fit_overhead",
    "import_torch",
    "kernel_cost",
    "kernels_only",
    "make_plan",
    "measure_device",
    "measure_engine_overhead",
    "pool_measurements",
    "pow2_grid",
    "repredict",
    "row_time_s",
    "run_measurements",
    "sidecar_paths",
    "skipped_block_sizes",
    "step_overhead_s",
    "with_engine_overhead",
    "with_static_decode",
    "write_outputs",
    "write_report",
]
