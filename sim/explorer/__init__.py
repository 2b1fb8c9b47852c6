"""Glue between the Streamlit explorer (``app.py``) and the simulator, testable without Streamlit.

The page only wires widgets to the functions here, one module per part of the page:

* **Knobs** (:mod:`~sim.explorer.knobs`): :func:`knobs_from_scenario` reads the values people edit
  (model, GPU, traffic, lengths, allocator, scheduler, cost model) out of a scenario;
  :func:`overrides_from_knobs` turns edited widget values back into dotted overrides (only those
  that changed, so keys a scenario left unset stay unset); :func:`edited_scenario_yaml` writes the
  result as YAML that ``kvsim run`` accepts; :func:`scenario_caption` is the page's line about the
  scenario, naming the parts the knobs changed (:func:`changed_sections`).
* **Shipped files** (:mod:`~sim.explorer.shipped`): the built-in scenarios, traces and profiles.
* **Untrusted uploads** (:mod:`~sim.explorer.uploads`, :class:`UploadStore`): size limits,
  ``yaml.safe_load`` after refusing anchors/aliases, schema validation with one readable line on
  failure. Nothing named in an upload is ever opened: every field that names a file, at any depth,
  is vetted first — trace ``path`` keys must name a built-in trace under ``scenarios/`` or a trace
  uploaded in the same session (written to a private temporary folder), ``cost_model.profile`` a
  built-in profile or an uploaded one, and ``model.hf_config`` a shipped model config
  (:func:`resolve_paths`).
* **Runs** (:mod:`~sim.explorer.runs`, :mod:`~sim.explorer.kpi`, :mod:`~sim.explorer.compare`):
  :func:`resolve_scenario` and :func:`canonical_json` (the cache key of a run), :func:`run_canonical`
  (the simulation behind the page's cache), :func:`kpis` (headline numbers of a run),
  :func:`compare_rows` (side by side, best/worst marked).
* **Sweeps and plans** (:mod:`~sim.explorer.sweeps`): :func:`run_small_sweep`, :func:`run_small_plan`;
  :func:`check_axes_read` refuses an ``allocator.*`` axis the allocator kind does not read, or a
  ``workload.arrival.*`` axis the arrival kind does not read (:func:`sim.analysis.sweep.check_sweep_axes`,
  as ``kvsim sweep`` does).
* **Downloads** (:mod:`~sim.explorer.downloads`): :func:`table_bytes`, :func:`figures_html`.
* **Calibration** (:mod:`~sim.explorer.calibration_view`): :func:`profile_rows` (provenance and fit
  quality per profile) and :func:`calibration_figure` (measured table points against the profile's
  fitted curve).
* :func:`app_command` (:mod:`~sim.explorer.launcher`) launches ``streamlit run app.py`` (``kvsim app``).

``from sim import explorer as X`` and ``X.<name>`` is how the page uses it; the names below are its interface.
"""

from __future__ import annotations

from sim.explorer.calibration_view import (
    CURVE_FAMILIES,
    calibration_figure,
    curve_keys,
    default_curve,
    measured_points,
    preferred_curve,
    profile_rows,
)
from sim.explorer.compare import (
    ALLOCATOR_KNOBS,
    allocator_label,
    allocator_overrides,
    breakdown_rows,
    compare_inputs_key,
    compare_rows,
    inputs_key,
    unique_labels,
)
from sim.explorer.downloads import figures_html, plan_download, table_bytes
from sim.explorer.knobs import (
    ARRIVAL_KNOBS,
    LENGTH_KNOBS,
    ROUTERS,
    allocator_choices,
    allocator_fields,
    allocator_knobs,
    changed_sections,
    edited_scenario,
    edited_scenario_yaml,
    knobs_from_scenario,
    model_choices,
    overrides_from_knobs,
    scenario_caption,
)
from sim.explorer.kpi import DEFAULT_SLO, KPI_LABELS, KPI_SPEC, format_kpi, kpi_delta, kpis, slo_from_knobs
from sim.explorer.launcher import APP_PATH, app_command
from sim.explorer.runs import (
    RunData,
    canonical_json,
    empty_run,
    run_canonical,
    scenario_from_canonical,
    step_breakdown,
)
from sim.explorer.shipped import (
    TRACE_EXTENSIONS,
    builtin_arrival_traces,
    builtin_profiles,
    builtin_scenario,
    builtin_scenarios,
    builtin_traces,
)
from sim.explorer.sweeps import (
    MAX_AXIS_VALUES,
    MAX_SWEEP_POINTS,
    SWEEP_AXES,
    check_axes_read,
    default_index,
    default_sweep_axes,
    numeric_columns,
    parse_axis_values,
    plan_stream_rows,
    run_small_plan,
    run_small_sweep,
    sweep_param_columns,
)
from sim.explorer.uploads import (
    MAX_DATASET_BYTES,
    MAX_MESSAGE_CHARS,
    MAX_NESTING,
    MAX_SCENARIO_BYTES,
    MAX_SWEEP_BYTES,
    MAX_UPLOAD_BYTES,
    TRACE_FORMATS,
    UploadedTrace,
    UploadStore,
    error_text,
    plain_markdown,
    read_sweep_upload,
    resolve_paths,
    resolve_scenario,
    safe_filename,
    safe_yaml,
)

__all__ = [
    "ALLOCATOR_KNOBS",
    "APP_PATH",
    "ARRIVAL_KNOBS",
    "CURVE_FAMILIES",
    "DEFAULT_SLO",
    "KPI_LABELS",
    "KPI_SPEC",
    "LENGTH_KNOBS",
    "MAX_AXIS_VALUES",
    "MAX_MESSAGE_CHARS",
    "MAX_NESTING",
    "MAX_SCENARIO_BYTES",
    "MAX_SWEEP_BYTES",
    "MAX_SWEEP_POINTS",
    "MAX_DATASET_BYTES",
    "MAX_UPLOAD_BYTES",
    "ROUTERS",
    "plan_download",
    "plan_stream_rows",
    "SWEEP_AXES",
    "TRACE_EXTENSIONS",
    "TRACE_FORMATS",
    "RunData",
    "UploadStore",
    "UploadedTrace",
    "allocator_choices",
    "allocator_fields",
    "allocator_knobs",
    "allocator_label",
    "allocator_overrides",
    "app_command",
    "builtin_arrival_traces",
    "builtin_profiles",
    "builtin_scenario",
    "builtin_scenarios",
    "builtin_traces",
    "calibration_figure",
    "canonical_json",
    "changed_sections",
    "check_axes_read",
    "compare_inputs_key",
    "breakdown_rows",
    "compare_rows",
    "curve_keys",
    "default_curve",
    "default_index",
    "default_sweep_axes",
    "edited_scenario",
    "edited_scenario_yaml",
    "empty_run",
    "error_text",
    "figures_html",
    "format_kpi",
    "knobs_from_scenario",
    "model_choices",
    "inputs_key",
    "kpi_delta",
    "kpis",
    "measured_points",
    "numeric_columns",
    "overrides_from_knobs",
    "plain_markdown",
    "parse_axis_values",
    "preferred_curve",
    "profile_rows",
    "read_sweep_upload",
    "resolve_paths",
    "resolve_scenario",
    "run_canonical",
    "run_small_plan",
    "run_small_sweep",
    "safe_filename",
    "safe_yaml",
    "scenario_caption",
    "scenario_from_canonical",
    "slo_from_knobs",
    "step_breakdown",
    "sweep_param_columns",
    "table_bytes",
    "unique_labels",
]
