"""Parameter sweeps: one scenario, many points, one resumable Parquet dataset.

A sweep file (YAML, format in ``docs/sweeps.md``)::

    name: alloc-vs-rate
    base: chat-api                 # scenario file (relative to this file) or built-in name
    set:                           # fixed overrides for every point
      workload.num_requests: 200
    grid:                          # Cartesian product of these axes
      allocator.kind: [static, paged]
      workload.arrival.rate: [5, 10, 20]
    zip:                           # paired axes (equal lengths), one value-tuple per point
      allocator.block_size: [16, 32]
      scheduler.max_num_seqs: [128, 256]
    seeds: 3                       # replicates: seed = base seed + i
    slo:                           # optional: each point's attainment of this SLO (slo.* columns)
      ttft_p90_s: 0.5
      tpot_p90_s: 0.05
    step_breakdown: true           # optional: each point's iteration time by part (step_s.*, step_share.*)

Points = product(grid axes, each zip group) × seeds. An axis is a list of values, or a
mapping ``label: value`` (the label is what the dataset column holds; use it for whole
sections such as ``workload.lengths``). For a list axis the column holds the value the point's
scenario ran with (the validated config value: ``1.0e2`` or ``"8"`` for a rate is the number
100.0 or 8.0), so a column is typed by its config field. Values of an axis (value tuples of a
zip group) must be distinct, and so must the scenarios they resolve to: ``[4, 4.0]``, labels
``{a: 4, b: 4.0}``, or ``[8, "8"]`` are refused, naming the axis and the values.

Validation happens before any point runs: the file's structure, every axis key path
(unknown keys fail the sweep), then every point's scenario, and then each ``allocator.*`` axis:
one that the allocator of no point reads (``allocator.block_size`` of ``static`` without
``overflow: fallback``), or each ``workload.arrival.*`` axis that the arrival kind of no point reads
(``workload.arrival.rate`` of ``closed_loop``), fails the sweep, since its values would all give the
same run. A point whose scenario is
invalid for its *values* (a block size of 0, a model that does not fit the GPU) is recorded
as ``failed`` with its error, without running, and the sweep exits non-zero after the valid
points finish: a sweep that maps a feasible region should not abort on its infeasible corner.

Each point runs in its own process (a ``spawn``/``forkserver`` process pool, or a Ray task) and
is written as one Parquet file ``part-<point id>.parquet`` as soon as it finishes (written to a
hidden temporary name, then renamed, so a kill never leaves a partial file). A pool worker that
dies (out of memory, ``kill -9``, a native crash) fails only the point it ran, and only once that
point, run again alone, kills its worker again; the points beside it run in a fresh pool
(:func:`run_points_locally`). The point id is a hash of the resolved scenario (every key,
defaults filled) and of the keys it sets (:func:`point_id`), so it is stable across runs and
machines and independent of how the sweep file spells the point. The worker gets the keys set,
not a full dump (:func:`canonical_scenario`): which keys are set changes a run, so a point runs
exactly as ``kvsim run`` of its overrides.

Rerunning into the same folder (:func:`run_sweep`) makes the dataset describe exactly the
current sweep file's points: a point already ``ok`` there is reused only when its id is that
of a point of the new expansion (the same resolved scenario), and its row is rewritten with the
new expansion's point index, seed and axis columns (metrics kept); failed points are run again;
rows of points no longer in the sweep leave the dataset (finished ones move to ``_dropped/``,
which pyarrow's dataset readers skip, and come back without running if the sweep lists them
again; failed ones are deleted).

The package, one module per part: the sweep file and its points (:mod:`.spec`), one point run in a
worker (:mod:`.point`), the Parquet dataset (:mod:`.dataset`), running a sweep locally
(:mod:`.runner`) or on Ray (:mod:`.ray_cluster`), and the printed results (:mod:`.results_table`).
"""

from sim.analysis.sweep.dataset import DROPPED_DIR, META_FILE, read_dataset
from sim.analysis.sweep.point import default_workers, flatten_summary, process_pool, run_point
from sim.analysis.sweep.results_table import RESULT_COLUMNS, describe_params, result_rows
from sim.analysis.sweep.runner import SweepResult, run_points_locally, run_sweep
from sim.analysis.sweep.spec import (
    Axis,
    Point,
    SweepSpec,
    canonical_scenario,
    check_sweep_axes,
    json_digest,
    load_sweep,
    point_id,
)

__all__ = [
    "DROPPED_DIR",
    "META_FILE",
    "RESULT_COLUMNS",
    "Axis",
    "Point",
    "SweepResult",
    "SweepSpec",
    "canonical_scenario",
    "check_sweep_axes",
    "default_workers",
    "describe_params",
    "flatten_summary",
    "json_digest",
    "load_sweep",
    "point_id",
    "process_pool",
    "read_dataset",
    "result_rows",
    "run_point",
    "run_points_locally",
    "run_sweep",
]
