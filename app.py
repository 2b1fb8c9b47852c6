"""kvsim what-if explorer: ``streamlit run app.py`` (or ``kvsim app``).

Thin by design: widgets are wired to functions of :mod:`sim.explorer`, :mod:`sim.analysis.plots`,
:mod:`sim.analysis.sweep`, :mod:`sim.analysis.planner` and :mod:`sim.cost.profile`; no simulation logic lives here.
See docs/app.md.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout

import pandas  # noqa: F401  (first imports before the prewarm thread starts: two threads importing
import plotly.graph_objects  # noqa: F401  pandas/plotly at once see a partially initialised module)
import streamlit as st

from sim import explorer as X
from sim.allocators import KINDS
from sim.analysis import plots
from sim.catalog import GPUS
from sim.config import SCENARIO_DIR, apply_overrides
from sim.errors import ConfigError
from sim.explorer import downloads as XD, knobs as XK, kpi as XKPI, page_budget as XB, prewarm as XP
from sim.limits import MAX_REQUESTS

st.set_page_config(page_title="kvsim explorer", page_icon="🧮", layout="wide")

PAGES = ["Explore", "Compare", "Sweeps & plan", "Calibration"]
S = st.session_state


# --- state ----------------------------------------------------------------------------------


def store() -> X.UploadStore:
    if "store" not in S:
        S.store = X.UploadStore()
    return S.store


def set_base(data: dict, base_id, label: str) -> None:
    """A new base scenario: knobs (and their widgets) reset to its values."""
    S.base, S.base_id, S.base_label = data, base_id, label
    slo = {k: S.knobs[k] for k in X.DEFAULT_SLO} if "knobs" in S else dict(X.DEFAULT_SLO)
    S.knobs = {**X.knobs_from_scenario(data), **slo}
    for k in [k for k in S if isinstance(k, str) and k.startswith("knob.")]:
        del S[k]


def set_knob(k: str, v) -> None:
    S.knobs[k] = v
    S.pop("knob." + k, None)


def knob(widget, label: str, k: str, where=None, **kw):
    """A widget bound to ``S.knobs[k]`` (kept while the widget is hidden)."""
    wkey = "knob." + k
    if wkey not in S:
        S[wkey] = S.knobs[k]
    v = getattr(where or st.sidebar, widget)(label, key=wkey, **kw)
    S.knobs[k] = v
    return v


def show_error(where, msg: str | None) -> None:
    if msg:
        where.error(X.plain_markdown(msg), icon="⚠️")


def accept_upload(up, seen_key: str, error_key: str, parse, rejected: str, seen=None):
    """Parse an uploaded file once (Streamlit reruns keep handing back the same file): returns what
    ``parse(name, data)`` gave, or ``None`` when nothing new arrived or it was rejected, the reason
    then kept in ``S[error_key]`` for :func:`show_error`. ``seen``: what makes it new (its file id)."""
    if up is None:
        return None
    seen = up.file_id if seen is None else seen
    if S.get(seen_key) == seen:
        return None
    S[seen_key] = seen
    try:
        out = parse(up.name, up.getvalue())
    except ConfigError as exc:
        S[error_key] = f"{rejected} — {X.error_text(exc)}"
        return None
    S[error_key] = None
    return out


# --- runs -----------------------------------------------------------------------------------


@st.cache_data(max_entries=64, show_spinner=False)
def cached_run(key: str, _progress=None) -> X.RunData:
    """One simulation per resolved scenario (its canonical JSON): repeated runs are free."""
    return X.run_canonical(key, _progress)


@st.cache_data(max_entries=16, show_spinner=False)
def cached_breakdown(key: str) -> dict:
    """Where a run's iteration time goes: one step-mode run per resolved scenario."""
    return X.step_breakdown(key)


@st.cache_resource
def _prewarm_queue() -> XP.PrewarmQueue:
    """One queue for the whole server: at most one background run at once (sim/explorer/prewarm.py)."""
    return XP.PrewarmQueue()


def session_id() -> str:
    if "session_id" not in S:
        S.session_id = uuid.uuid4().hex
    return S.session_id


def prewarm(key: str) -> None:
    """Queue the run of the scenario on screen in the background, before anyone presses Run, so
    the default view's charts come back at once (set KVSIM_APP_PREWARM=0 to turn off); a newer
    request of the session replaces its older one that has not started."""
    if XP.prewarm_enabled():
        _prewarm_queue().submit(session_id(), key, lambda: cached_run(key))


def run_with_progress(key: str, where, label: str = "simulating") -> X.RunData:
    """Run (or fetch) in a worker thread; a run longer than a second shows a progress bar."""
    done: dict = {}
    bar = None
    t0 = time.perf_counter()
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(cached_run, key, lambda d, n: done.update(d=d, n=n))
        while True:
            try:
                result = fut.result(timeout=0.05)
                break
            except FutureTimeout:
                if bar is None and time.perf_counter() - t0 > 1.0:
                    bar = where.progress(0.0, text=f"{label}…")
                if bar is not None and done:
                    bar.progress(
                        min(1.0, done["d"] / max(done["n"], 1)), text=f"{label}… {done['d']}/{done['n']} requests"
                    )
    where.empty()
    return result


def current_scenario():
    """(raw edited mapping, resolved Scenario) of the Explore knobs; raises ConfigError."""
    data = X.edited_scenario(S.base, S.knobs)
    return data, X.resolve_scenario(data, store().trace_paths(), store().profiles)


# --- sidebar: page and scenario knobs -------------------------------------------------------


def trace_options(need_arrivals: bool = False) -> list[str]:
    names = X.builtin_arrival_traces() if need_arrivals else list(X.builtin_traces())
    names += [n for n, t in store().traces.items() if t.has_arrivals or not need_arrivals]
    return names


def options_with(options: list, current) -> list:
    return options if current in options else [*options, current]


def scenario_source() -> None:
    sb = st.sidebar
    src = sb.radio("Scenario", ["Built-in", "Upload"], horizontal=True, key="src")
    if src == "Built-in":
        names = X.builtin_scenarios()
        name = sb.selectbox(
            "Built-in scenario", names, key="builtin", index=names.index("chat-api") if "chat-api" in names else 0
        )
        if S.get("base_id") != ("builtin", name):
            set_base(X.builtin_scenario(name), ("builtin", name), name)
    else:
        up = sb.file_uploader("Scenario YAML (≤ 256 kB)", type=["yaml", "yml"], key="scenario_upload")
        data = accept_upload(
            up,
            "scenario_upload_seen",
            "upload_error",
            store().parse_scenario,
            "Upload rejected, previous scenario kept",
        )
        if data is not None:
            set_base(data, ("upload", up.file_id), up.name)
        show_error(sb, S.get("upload_error"))
    if "base" not in S:  # first visit with "Upload" selected
        first = X.builtin_scenarios()[0]
        set_base(X.builtin_scenario(first), ("builtin", first), first)


def trace_upload(where) -> None:
    up = where.file_uploader(
        "Upload a trace (CSV / JSONL / Parquet, ≤ 5 MiB)", type=["csv", "jsonl", "parquet"], key="trace_upload"
    )
    fmt = where.selectbox("Trace format", X.TRACE_FORMATS, key="trace_format")
    info = accept_upload(
        up,
        "trace_upload_seen",
        "trace_error",
        lambda n, d: store().add_trace(n, d, fmt),
        "Trace rejected",
        seen=None if up is None else (up.file_id, fmt),
    )
    if info is not None:
        set_knob("workload.lengths.path", info.name)
        if S.knobs["workload.lengths.kind"] != "empirical":
            set_knob("workload.lengths.kind", "empirical")
        where.success(f"{info.name}: {info.rows:,} rows" + (" with arrival times" if info.has_arrivals else ""))
    show_error(where, S.get("trace_error"))


ALLOCATOR_LABELS = {
    "block_size": "Block size (tokens)",
    "reserve": "Reserve (max_model_len | tokens | pNN)",
    "overflow": "Overflow",
}


def allocator_widget_args(name: str, default) -> tuple[str, dict]:
    """Widget kind and arguments for one allocator knob (from its default and the scenario schema)."""
    choices = X.allocator_choices(name)
    if name == "reserve" or (choices is None and isinstance(default, str)):
        return "text_input", {}
    if choices is not None:
        return "selectbox", {"options": choices}
    if isinstance(default, bool):
        return "checkbox", {}
    if isinstance(default, int):
        return "number_input", {"min_value": 0, "step": 16 if name == "block_size" else 1}
    return "number_input", {"min_value": 0.0, "step": 0.05, "format": "%.3f"}


def allocator_knob_widget(name: str, default) -> None:
    widget, kw = allocator_widget_args(name, default)
    knob(widget, ALLOCATOR_LABELS.get(name, name), f"allocator.{name}", st, **kw)


def knob_widgets(allocator: bool = True) -> None:
    sb = st.sidebar
    K = S.knobs
    with sb.expander("Model & GPU", expanded=True):
        knob(
            "selectbox",
            "Model",
            "model.name",
            st,
            options=options_with(X.model_choices(), K["model.name"]),
            help="a catalog model, or a Hugging Face config shipped with kvsim (mixture-of-experts and "
            "latent-attention models among them)",
        )
        knob("selectbox", "GPU", "gpu.name", st, options=options_with(list(GPUS), K["gpu.name"]))
        c1, c2 = st.columns(2)
        knob("number_input", "Replicas", "gpu.replicas", c1, min_value=1, max_value=4096, step=1)
        knob("selectbox", "Tensor parallel", "gpu.tensor_parallel", c2, options=[1, 2, 4, 8])
        knob(
            "selectbox",
            "Router (across replicas)",
            "router",
            st,
            options=list(X.ROUTERS),
            help="least_outstanding: fewest running + waiting; length_split: a pool of replicas for long prompts",
        )
        if K["router"] == "length_split":
            c1, c2 = st.columns(2)
            knob("number_input", "Long from (prompt tokens)", "length_split.prompt_tokens", c1, min_value=1, step=1024)
            knob("number_input", "Replicas for long", "length_split.replicas", c2, min_value=1, max_value=4096, step=1)
        knob("selectbox", "KV dtype", "model.kv_dtype", st, options=["bf16", "fp16", "fp8", "int4"])
        dtypes = st.empty()  # filled once every knob is read: the dtypes depend on the model picked
        profiles = ["auto", "none", *X.builtin_profiles(), *store().profiles]
        knob(
            "selectbox",
            "Cost model profile",
            "cost_model.profile",
            st,
            options=options_with(profiles, K["cost_model.profile"]),
            help="auto: the GPU's calibrated profile when it covers the model; none: roofline prior",
        )
    with sb.expander("Traffic", expanded=True):
        knob("number_input", "Requests", "workload.num_requests", st, min_value=1, max_value=1_000_000, step=100)
        kind = knob(
            "selectbox",
            "Arrivals",
            "workload.arrival.kind",
            st,
            options=["poisson", "gamma", "trace", "closed_loop"],
            help="gamma: bursty arrivals with coefficient of variation cv",
        )
        if kind in ("poisson", "gamma"):
            knob(
                "number_input",
                "Rate (requests/s)",
                "workload.arrival.rate",
                st,
                min_value=0.01,
                step=1.0,
                format="%.2f",
            )
        if kind == "gamma":
            knob(
                "number_input",
                "Burstiness (gamma cv)",
                "workload.arrival.cv",
                st,
                min_value=0.05,
                step=0.5,
                format="%.2f",
            )
        if kind == "trace":
            opts = trace_options(need_arrivals=True)
            if K["workload.arrival.path"] not in opts:
                set_knob("workload.arrival.path", next((o for o in opts if "Azure" in o), opts[0]))
            knob("selectbox", "Arrival trace", "workload.arrival.path", st, options=opts)
            knob(
                "number_input", "Time scale", "workload.arrival.time_scale", st, min_value=0.01, step=0.1, format="%.2f"
            )
        if kind != "closed_loop":
            client_cap_widgets()
        if kind == "closed_loop":
            knob("number_input", "Clients", "workload.arrival.concurrency", st, min_value=1, step=1)
            knob("number_input", "Think time (s)", "workload.arrival.think_time_s", st, min_value=0.0, step=0.5)
    with sb.expander("Lengths", expanded=False):
        trace_upload(st)  # first: an accepted trace selects itself in the widgets below
        kinds = ["fixed", "uniform", "lognormal", "empirical"]
        if K["workload.arrival.kind"] == "trace":
            kinds.append("trace")
        base_kind = X.knobs_from_scenario(S.base)["workload.lengths.kind"]
        if base_kind == "mixture":
            kinds.append("mixture")
        if K["workload.lengths.kind"] not in kinds:
            set_knob("workload.lengths.kind", base_kind if base_kind in kinds else "fixed")
        lk = knob("selectbox", "Length distribution", "workload.lengths.kind", st, options=kinds)
        c1, c2 = st.columns(2)
        if lk == "fixed":
            knob("number_input", "Prompt tokens", "workload.lengths.prompt_tokens", c1, min_value=1, step=64)
            knob("number_input", "Output tokens", "workload.lengths.output_tokens", c2, min_value=1, step=16)
        elif lk == "uniform":
            knob("number_input", "Prompt min", "workload.lengths.prompt_min", c1, min_value=1, step=16)
            knob("number_input", "Prompt max", "workload.lengths.prompt_max", c2, min_value=1, step=64)
            knob("number_input", "Output min", "workload.lengths.output_min", c1, min_value=1, step=16)
            knob("number_input", "Output max", "workload.lengths.output_max", c2, min_value=1, step=16)
        elif lk == "lognormal":
            knob("number_input", "Prompt median", "workload.lengths.prompt_median", c1, min_value=1.0, step=64.0)
            knob("number_input", "Prompt sigma", "workload.lengths.prompt_sigma", c2, min_value=0.0, step=0.1)
            knob("number_input", "Output median", "workload.lengths.output_median", c1, min_value=1.0, step=16.0)
            knob("number_input", "Output sigma", "workload.lengths.output_sigma", c2, min_value=0.0, step=0.1)
        elif lk == "empirical":
            opts = trace_options()
            if K["workload.lengths.path"] not in opts:
                set_knob("workload.lengths.path", next((o for o in opts if "conv" in o), opts[0]))
            knob("selectbox", "Length trace", "workload.lengths.path", st, options=opts)
        elif lk == "mixture":
            knob(
                "number_input",
                "Outlier fraction",
                "workload.lengths.outlier_fraction",
                c1,
                min_value=0.0,
                max_value=1.0,
                step=0.05,
            )
            knob(
                "number_input", "Outlier multiplier", "workload.lengths.outlier_multiplier", c2, min_value=0.1, step=0.5
            )
        knob("number_input", "max_model_len", "workload.max_model_len", st, min_value=2, step=1024)
    if allocator:
        with sb.expander("Allocator", expanded=True):
            ak = knob(
                "selectbox",
                "Allocator",
                "allocator.kind",
                st,
                options=list(KINDS),
                help="; ".join(f"{k}: {v[1]}" for k, v in KINDS.items()),
            )
            for name, default in X.allocator_knobs(ak).items():
                allocator_knob_widget(name, default)
    with sb.expander("Scheduler", expanded=False):
        knob("number_input", "max_num_seqs", "scheduler.max_num_seqs", st, min_value=1, step=16)
        knob("number_input", "max_num_batched_tokens", "scheduler.max_num_batched_tokens", st, min_value=1, step=512)
        knob("checkbox", "Chunked prefill", "scheduler.chunked_prefill", st)
    with sb.expander("SLO", expanded=False):
        knob("number_input", "TTFT bound (s, 0 = none)", "slo.ttft_s", st, min_value=0.0, step=0.1, format="%.3f")
        knob("number_input", "TPOT bound (s, 0 = none)", "slo.tpot_s", st, min_value=0.0, step=0.01, format="%.3f")
        knob("number_input", "Attainment target", "slo.attainment", st, min_value=0.01, max_value=1.0, step=0.05)
        knob("number_input", "Seed", "seed", st, step=1)
    simulated_dtypes(dtypes)


def client_cap_widgets() -> None:
    """The open-loop client's cap on requests in flight (``workload.arrival.max_concurrency``): a
    checkbox, off unless the scenario sets one, so an untouched page runs the scenario as loaded.
    Not shown for closed_loop: the config refuses a cap there (its clients are its cap)."""
    k = "workload.arrival.max_concurrency"
    on_key = f"knob.{k}.on"
    if on_key not in S:
        S[on_key] = S.knobs[k] is not None
    on = st.checkbox(
        "Client cap (max concurrency)",
        key=on_key,
        help="at most this many requests in flight, as vllm bench serve --max-concurrency: a request due "
        "while the cap is reached waits in the client and is sent when one ends (TTFT counts from the send)",
    )
    if not on:
        set_knob(k, None)
        return
    if S.knobs[k] is None:
        set_knob(k, XK.DEFAULT_CLIENT_CAP)
    knob("number_input", "Max requests in flight", k, st, min_value=1, max_value=MAX_REQUESTS, step=1)


def simulated_dtypes(where) -> None:
    """The dtypes the run will use: a picked model brings its checkpoint's, which the KV dtype
    widget (still showing the scenario's value) does not."""
    try:
        m = current_scenario()[1].model
    except ConfigError:
        return
    where.caption(f"Simulated dtypes: weights `{m.weight_dtype}` · KV cache `{m.kv_dtype}`")


def action_inputs(*parts):
    """What a Compare / sweep / plan press runs on (the edited scenario and ``parts``): kept with its
    results, which are marked stale when the inputs on screen differ; ``None`` when invalid."""
    try:
        return X.inputs_key(X.edited_scenario(S.base, S.knobs), *parts)
    except ConfigError:
        return None


def stale_caption(stored_key: str, now, what: str) -> None:
    if S.get(stored_key) is not None and S.get(stored_key) != now:
        st.caption(f"⚠️ knobs changed since this {what} — press {'Plan' if what == 'plan' else 'Run ' + what} again.")


# --- Explore --------------------------------------------------------------------------------


def run_figures(rd: X.RunData) -> dict:
    return {
        "Latency CDFs": plots.latency_cdf(rd.requests),
        "KV memory": plots.kv_memory(rd.timeseries),
        "Fragmentation": plots.fragmentation(rd.timeseries),
        "Queue length": plots.queue_length(rd.timeseries),
        "Per-step decode latency": plots.step_latency(rd.timeseries),
    }


def render_charts(figs: dict) -> None:
    items = list(figs.items())
    st.plotly_chart(items[0][1], key="chart_cdf", theme=None)
    for left, right in ((items[1], items[2]), (items[3], items[4])):
        a, b = st.columns(2)
        for col, (name, fig) in ((a, left), (b, right)):
            fig.update_layout(title_font_size=13)  # half-width: long titles must fit
            col.plotly_chart(fig, key=f"chart_{name}", theme=None)


def kpi_grid(values: dict, previous: dict | None, client_cap: bool = False) -> None:
    """The KPI metrics, six a row; ``client_cap``: a third row with the client wait, shown while a
    cap is set (before a run too, so the layout holds) or when the run on screen had one."""
    keys = [k for k, *_ in X.KPI_SPEC]
    rows = [keys[:6], keys[6:]]
    wait = [k for k, *_ in XKPI.CLIENT_WAIT_KPI_SPEC]
    if client_cap or any(k in values for k in wait):
        rows.append(wait)
    for row in rows:
        cols = st.columns(6)
        for c, k in zip(cols, row):
            delta, color = X.kpi_delta(k, values.get(k), (previous or {}).get(k))
            c.metric(X.KPI_LABELS[k], X.format_kpi(k, values.get(k)), delta=delta, delta_color=color)


def downloads(rd: X.RunData, figs: dict) -> None:
    st.subheader("Downloads")
    cols = st.columns(7)
    try:
        yaml_text = X.edited_scenario_yaml(S.base, S.knobs, [n for n in store().traces], store().profiles)
    except ConfigError as exc:
        yaml_text = f"# invalid scenario: {exc}\n"
    name = rd.scenario_name or "scenario"
    cols[0].download_button("scenario.yaml", yaml_text, f"{name}.yaml", "text/yaml", on_click="ignore", key="dl_yaml")
    for i, (tname, table) in enumerate((("requests", rd.requests), ("timeseries", rd.timeseries))):
        for j, fmt in enumerate(("parquet", "csv")):
            cols[1 + 2 * i + j].download_button(
                f"{tname}.{fmt}",
                (lambda t=table, f=fmt: X.table_bytes(t, f)),
                f"{tname}.{fmt}",
                "application/octet-stream" if fmt == "parquet" else "text/csv",
                on_click="ignore",
                key=f"dl_{tname}_{fmt}",
            )
    cols[5].download_button(
        "summary.json",
        XD.summary_download(rd.summary, (str(store().dir),)),
        "summary.json",
        "application/json",
        on_click="ignore",
        key="dl_summary",
    )
    cols[6].download_button(
        "charts.html",
        lambda f=figs: X.figures_html(f, f"kvsim: {name}"),
        f"{name}-charts.html",
        "text/html",
        on_click="ignore",
        key="dl_html",
    )


def page_explore() -> None:
    # The element layout is the same before and after a run (placeholders, KPI grid, chart
    # slots), so a run updates the charts in place instead of rebuilding the page.
    st.title("Explore")
    st.caption(X.scenario_caption(S.base_label, S.base, S.knobs))
    c1, c2 = st.columns([1, 5])
    pressed = c1.button("▶ Run", type="primary", key="run")
    status = c2.empty()
    bar = st.empty()
    err = st.empty()
    if pressed:
        _prewarm_queue().cancel(session_id())
        try:
            _, sc = current_scenario()
            key = X.canonical_json(sc)
            rd = run_with_progress(key, bar)
        except ConfigError as exc:
            S.explore_error = X.error_text(exc)
        except Exception as exc:  # noqa: BLE001 - show, do not crash the page
            S.explore_error = f"{type(exc).__name__}: {X.error_text(exc)}"
        else:
            S.explore_error = None
            if S.get("explore_result") is not None and S.explore_result.key != rd.key:
                S.explore_prev = S.explore_result
            S.explore_result = rd
            S.run_count = S.get("run_count", 0) + 1
    show_error(err, S.get("explore_error"))
    rd = S.get("explore_result")
    try:
        key_now = X.canonical_json(current_scenario()[1])
    except ConfigError:
        key_now = None
    slo = X.slo_from_knobs(S.knobs)
    cap_on = (
        S.knobs["workload.arrival.kind"] != "closed_loop" and S.knobs["workload.arrival.max_concurrency"] is not None
    )
    if rd is None:
        status.info("Press **Run** to simulate the scenario.")
        if key_now is not None:
            prewarm(key_now)
        kpi_grid({}, None, cap_on)
    else:
        s = rd.summary
        status.caption(
            ("⚠️ knobs changed since this run — press Run.  " if key_now != rd.key else "")
            + f"{s['completed']:,} completed / {s['requests']:,} requests · cost model `{s['cost_model']}`"
            + ("" if s.get("cost_model_calibrated") else " (uncalibrated prior)")
            + f" · simulated {s['makespan_s']:.0f} s in {rd.wall_s:.2f} s wall · run #{S.get('run_count', 0)}"
        )
        prev = S.get("explore_prev")
        kpi_grid(X.kpis(s, rd.requests, slo), X.kpis(prev.summary, prev.requests, slo) if prev else None, cap_on)
    st.caption(
        f"SLO: {slo.describe() if (slo.ttft_s or slo.tpot_s) else 'none'} · KV waste = 1 − used/reserved "
        "KV token-seconds · deltas against the previous run"
    )
    figs = run_figures(rd if rd is not None else X.empty_run())
    render_charts(figs)
    if rd is not None:
        breakdown_panel(rd)
        downloads(rd, figs)


def breakdown_panel(rd: X.RunData) -> None:
    with st.expander("Where the iteration time goes"):
        st.caption(
            "GEMMs, attention and what the paged layout adds to it, all-reduce, host time, the allocator's "
            "work: the run priced iteration by iteration (engine.mode step: the same results, 4 to 6 times the simulation time)."
        )
        if st.button("Split this run's time", key="breakdown_run"):
            try:
                S.breakdown = (rd.key, cached_breakdown(rd.key))
            except ConfigError as exc:
                S.breakdown = (rd.key, X.error_text(exc))
        got = S.get("breakdown")
        if got is not None and got[0] == rd.key:
            if isinstance(got[1], str):
                st.error(got[1])
            else:
                st.plotly_chart(plots.step_breakdown(got[1]), key="chart_breakdown", theme=None)


# --- Compare --------------------------------------------------------------------------------

DEFAULT_CONFIGS = [
    {"kind": "paged", "block_size": 16, "reserve": "max_model_len", "overflow": "reject"},
    {"kind": "static", "block_size": 16, "reserve": "max_model_len", "overflow": "reject"},
    {"kind": "static", "block_size": 16, "reserve": "p95", "overflow": "truncate"},
    {"kind": "paged", "block_size": 128, "reserve": "max_model_len", "overflow": "reject"},
]


def highlight_kpis(rows: list[dict], labels: list[str]):
    import pandas as pd

    df = pd.DataFrame([{k: r[k] for k in ["KPI", *labels]} for r in rows]).set_index("KPI")

    def style(frame):
        out = pd.DataFrame("", index=frame.index, columns=frame.columns)
        for r, row in zip(frame.index, rows):
            if row["_differs"]:
                out.loc[r, :] = "font-weight: bold"
            if row["_best"]:
                out.loc[r, row["_best"]] = "background-color: #c8f0c8; font-weight: bold"
            if row["_worst"]:
                out.loc[r, row["_worst"]] = "background-color: #f6cccc; font-weight: bold"
        return out

    return df.style.apply(style, axis=None)


def page_compare() -> None:
    st.title("Compare allocators")
    st.caption(
        f"Same workload for every column: scenario **{S.base_label}** with the sidebar knobs. "
        "Best value per KPI in green, worst in red; rows that differ in bold."
    )
    n = st.radio("Configurations", [2, 3, 4], horizontal=True, key="cmp_n", index=1)
    cfgs = []
    cols = st.columns(n)
    for i, col in enumerate(cols):
        d = DEFAULT_CONFIGS[i]
        with col:
            kinds = list(KINDS)
            kind = st.selectbox(
                f"#{i + 1} allocator",
                kinds,
                index=kinds.index(d["kind"]) if d["kind"] in kinds else 0,
                key=f"cmp_kind_{i}",
            )
            cfg = {"kind": kind}
            for name, default in X.allocator_knobs(kind).items():
                widget, kw = allocator_widget_args(name, default)
                value = d.get(name, default)
                if widget == "selectbox":
                    kw["index"] = kw["options"].index(value) if value in kw["options"] else 0
                else:
                    kw["value"] = value
                cfg[name] = getattr(st, widget)(name, key=f"cmp_{name}_{i}", **kw)
            cfgs.append(cfg)
    labels = X.unique_labels(cfgs)
    pressed = st.button("▶ Run comparison", type="primary", key="compare_run")
    bar = st.empty()
    inputs = action_inputs(cfgs)
    if pressed:
        try:
            data, _ = current_scenario()
            results = {}
            for i, (lb, cfg) in enumerate(zip(labels, cfgs)):
                try:
                    sc = X.resolve_scenario(
                        apply_overrides(data, X.allocator_overrides(cfg)), store().trace_paths(), store().profiles
                    )
                except ConfigError as exc:  # which of the configurations it is
                    raise ConfigError(f"configuration {i + 1} ({lb}): {exc.key}", exc.value, exc.allowed) from None
                results[lb] = run_with_progress(X.canonical_json(sc), bar, f"simulating {lb}")
        except ConfigError as exc:
            S.compare_error = X.error_text(exc)
        except Exception as exc:  # noqa: BLE001
            S.compare_error = f"{type(exc).__name__}: {X.error_text(exc)}"
        else:
            S.compare_error = None
            S.compare, S.compare_inputs = results, inputs
    show_error(st, S.get("compare_error"))
    results = S.get("compare")
    if not results:
        st.info("Pick 2–4 allocator configurations and press **Run comparison**.")
        return
    stale_caption("compare_inputs", inputs, "comparison")
    slo = X.slo_from_knobs(S.knobs)
    kp = {lb: X.kpis(rd.summary, rd.requests, slo) for lb, rd in results.items()}
    rows = X.compare_rows(kp)
    st.dataframe(highlight_kpis(rows, list(results)), key="cmp_table", height=36 * (len(rows) + 1) + 4)
    fig = plots.latency_cdf({lb: rd.requests for lb, rd in results.items()})
    st.plotly_chart(fig, key="cmp_cdf", theme=None)
    cols = st.columns(len(results))
    figs = {"Latency CDFs": fig}
    for col, (lb, rd) in zip(cols, results.items()):
        f = plots.kv_memory(rd.timeseries, title=f"KV memory — {lb}")
        figs[f"KV memory — {lb}"] = f
        col.plotly_chart(f, key=f"cmp_kv_{lb}", theme=None)
    with st.expander("Where the iteration time goes, per configuration"):
        st.caption(
            "Each configuration run again iteration by iteration (same results): GEMMs, attention and what "
            "the paged layout adds to it, host time, the allocator's work (growth copies, zero-fill, swaps)."
        )
        keys = tuple(rd.key for rd in results.values())
        if st.button("Split each configuration's time", key="cmp_breakdown_run"):
            try:
                S.compare_breakdown = (keys, {lb: cached_breakdown(rd.key) for lb, rd in results.items()})
            except ConfigError as exc:
                S.compare_breakdown = (keys, X.error_text(exc))
        got = S.get("compare_breakdown")
        if got is not None and got[0] == keys:
            if isinstance(got[1], str):
                st.error(got[1])
            else:
                st.dataframe(X.breakdown_rows(got[1]), key="cmp_breakdown_table", hide_index=True)
                f = plots.step_breakdown(got[1])
                figs["Where the busy time went"] = f
                st.plotly_chart(f, key="cmp_breakdown", theme=None)
    csv = (
        "KPI,"
        + ",".join(results)
        + "\n"
        + "\n".join(",".join([r["KPI"], *(str(r[lb]).replace(",", "") for lb in results)]) for r in rows)
        + "\n"
    )
    c1, c2 = st.columns(2)
    c1.download_button("comparison.csv", csv, "comparison.csv", "text/csv", on_click="ignore", key="dl_cmp_csv")
    c2.download_button(
        "comparison-charts.html",
        lambda f=figs: X.figures_html(f, "kvsim allocator comparison"),
        "comparison-charts.html",
        "text/html",
        on_click="ignore",
        key="dl_cmp_html",
    )


# --- Sweeps & plan --------------------------------------------------------------------------


def page_sweeps() -> None:
    st.title("Sweeps & plan")
    src = st.radio("Dataset", ["Upload a Parquet dataset", "Run a small sweep"], horizontal=True, key="sw_src")
    if src.startswith("Upload"):
        up = st.file_uploader("Sweep dataset (one Parquet file, ≤ 20 MB)", type=["parquet"], key="sweep_upload")
        table = accept_upload(
            up, "sweep_upload_seen", "sweep_error", X.read_sweep_upload, "Upload rejected, previous dataset kept"
        )
        if table is not None:
            S.sweep_table, S.sweep_inputs = table, None
    else:
        st.caption(
            f"Sweeps the Explore scenario (**{S.base_label}** with the sidebar knobs) over one or two axes; "
            "keep it small: every point is a full run. With an SLO in the sidebar, each point's share of "
            "requests meeting it is the column slo.attainment."
        )
        axes = X.SWEEP_AXES
        c1, c2 = st.columns(2)
        a1 = c1.selectbox("Axis 1", list(axes), key="sw_a1")
        v1 = c1.text_input("values (comma-separated)", axes[a1], key=f"sw_v1_{a1}")
        a2 = c2.selectbox("Axis 2", ["(none)", *axes], index=2, key="sw_a2")
        v2 = c2.text_input("values (comma-separated)", axes.get(a2, ""), key=f"sw_v2_{a2}", disabled=a2 == "(none)")
        n_req = st.number_input("Requests per point", 50, 5000, 300, 50, key="sw_n")
        split = st.checkbox(
            "Split each point's iteration time (step_share.* columns; runs iteration by iteration)", key="sw_split"
        )
        slo_knobs = {k: S.knobs[k] for k in X.DEFAULT_SLO}  # each point's SLO attainment follows the sidebar
        sweep_inputs = action_inputs(a1, v1, a2, v2 if a2 != "(none)" else "", int(n_req), slo_knobs, split)
        if st.button("▶ Run sweep", type="primary", key="sweep_run"):
            bar = st.progress(0.0, text="sweeping…")
            try:
                data, _ = current_scenario()
                grid = {a1: X.parse_axis_values(v1, a1)}
                if a2 != "(none)":
                    grid[a2] = X.parse_axis_values(v2, a2)
                table, failures = X.run_small_sweep(
                    data,
                    grid,
                    int(n_req),
                    store(),
                    progress=lambda d, n, f: bar.progress(min(1.0, d / max(n, 1)), text=f"sweeping… {d}/{n} points"),
                    slo=X.slo_from_knobs(S.knobs),
                    step_breakdown=split,
                )
                S.sweep_table = XD.public_table(table, (str(store().dir),))
                S.sweep_inputs = sweep_inputs
                S.sweep_error = (
                    (
                        f"{len(failures)} point(s) failed: "
                        + "; ".join(X.error_text(f["error"])[:200] for f in failures[:3])
                    )
                    if failures
                    else None
                )
            except ConfigError as exc:
                S.sweep_error = X.error_text(exc)
            bar.empty()
        stale_caption("sweep_inputs", sweep_inputs, "sweep")
    show_error(st, S.get("sweep_error"))
    table = S.get("sweep_table")
    if table is not None and not X.numeric_columns(table):
        st.info("This dataset has no numeric column to plot.")
    elif table is not None:
        st.dataframe(table.to_pandas(), key="sweep_df", height=220)
        cols = table.column_names
        numeric = X.numeric_columns(table)
        params = X.sweep_param_columns(table)
        c1, c2, c3 = st.columns(3)
        dx, dcolor = X.default_sweep_axes(table)
        xs = params or cols
        x = c1.selectbox("x", xs, index=X.default_index(xs, dx), key="sw_x")
        y = c2.selectbox("y", numeric, index=X.default_index(numeric, "ttft_s.p99"), key="sw_y")
        colors = ["(none)", *[c for c in params if c != x]]
        color = c3.selectbox("color", colors, index=X.default_index(colors, dcolor), key="sw_color")
        note = XB.sweep_note(table, params)
        if note:
            st.warning(X.plain_markdown(note), icon="⏱️")
        try:
            fig = plots.sweep_curves(table, x, y, None if color == "(none)" else color, max_distinct=plots.MAX_DISTINCT)
        except plots.TooManyValues as exc:
            st.info(X.plain_markdown(str(exc)))
        else:
            st.plotly_chart(fig, key="sw_curves", theme=None)
        if len(params) >= 2:
            c1, c2, c3 = st.columns(3)
            hx = c1.selectbox("heatmap x", params, key="sw_hx")
            hy = c2.selectbox("heatmap y", [p for p in params if p != hx], key="sw_hy")
            hz = c3.selectbox(
                "heatmap value", numeric, index=X.default_index(numeric, "throughput_tokens_per_s"), key="sw_hz"
            )
            try:
                heat = plots.heatmap(
                    table,
                    hx,
                    hy,
                    hz,
                    max_distinct=plots.MAX_DISTINCT,
                    # A panel per value of each other axis: a cell averages seeds only.
                    facets=[p for p in params if p not in (hx, hy, "seed")],
                    mean_of="seeds" if "seed" in params and "seed" not in (hx, hy) else "points",
                    max_panels=plots.MAX_PANELS,
                )
            except plots.TooManyValues as exc:
                st.info(X.plain_markdown(str(exc)))
            else:
                st.plotly_chart(heat, key="sw_heat", theme=None)
        st.download_button(
            "sweep.parquet",
            lambda t=table: X.table_bytes(t, "parquet"),
            "sweep.parquet",
            on_click="ignore",
            key="dl_sweep",
        )
    st.divider()
    st.subheader("Goodput plan")
    from sim.analysis import plan_output as PO, planner as PL
    from sim.analysis.recommend import problem_lines

    slo = X.slo_from_knobs(S.knobs)
    st.caption(
        f"Highest arrival rate per allocator at which {slo.describe() if (slo.ttft_s or slo.tpot_s) else 'the SLO'}"
        " holds (SLO in the sidebar). Candidates appear in the table as they finish."
    )
    c1, c2, c3, c4 = st.columns([3, 1, 1, 1])
    cands = c1.multiselect(
        "Candidates",
        list(PL.CANDIDATES),
        default=[c for c in ("static", "paged") if c in PL.CANDIDATES],
        key="plan_cands",
    )
    n_req = c2.number_input("Requests per run", 50, 5000, 200, 50, key="plan_n")
    seeds = c3.number_input(
        "Seeds",
        1,
        10,
        1,
        1,
        key="plan_seeds",
        help="Workload seeds per candidate: goodput with a confidence interval over seeds.",
    )
    break_even = c4.checkbox(
        "Break-even",
        value=False,
        key="plan_break_even",
        help="Find the value of each unmeasured cost-model constant, and of the KV capacity derived "
        "from memory, at which the recommendation would flip (more simulations).",
    )
    slo_knobs = {k: S.knobs[k] for k in X.DEFAULT_SLO}  # the KPIs of Compare follow the SLO; a plan's do not
    plan_inputs = action_inputs(slo_knobs, sorted(cands), int(n_req), int(seeds), bool(break_even))
    if st.button("▶ Plan", type="primary", key="plan_run"):
        bar = st.progress(0.0, text="planning…")
        live = st.empty()
        streamed: list[dict] = []

        def show(cand: dict) -> None:
            streamed.append(cand)
            live.dataframe(X.plan_stream_rows(streamed, int(seeds)), hide_index=True)

        try:
            data, _ = current_scenario()
            S.plan = X.run_small_plan(
                data,
                slo,
                cands,
                int(n_req),
                store(),
                seeds=int(seeds),
                break_even=break_even,
                on_candidate=show,
                progress=lambda d, n, name: bar.progress(
                    min(1.0, d / max(n, 1)), text=f"planning… {name} done ({d}/{n})"
                ),
            )
            S.plan_error, S.plan_partial, S.plan_inputs = None, None, plan_inputs
        except XB.ActionBudgetSpent as exc:  # the candidates that finished are kept
            S.plan, S.plan_partial = None, X.plan_stream_rows(exc.finished, int(seeds))
            S.plan_inputs = plan_inputs
            S.plan_error = X.error_text(exc)
        except ConfigError as exc:
            S.plan_error = X.error_text(exc)
        except Exception as exc:  # noqa: BLE001 - show, do not crash the page
            S.plan_error = f"{type(exc).__name__}: {X.error_text(exc)}"
        bar.empty()
        live.empty()
    show_error(st, S.get("plan_error"))
    if S.get("plan") or S.get("plan_partial"):
        stale_caption("plan_inputs", plan_inputs, "plan")
    if S.get("plan_partial"):
        st.dataframe(S.plan_partial, key="plan_partial", hide_index=True)
    p = S.get("plan")
    if p:
        st.success(p["recommendation"]["text"])
        for r in p["recommendation"].get("reasons", []):
            st.markdown(f"- {r}")
        st.dataframe([dict(zip(PO.plan_columns(p), r)) for r in PO.plan_rows(p)], key="plan_table", hide_index=True)
        lines = PO.assumption_lines(p)
        if lines:
            st.markdown("**Assumptions** (unmeasured constants of the cost model and the KV capacity)")
            for a in lines:
                st.markdown(f"- {a}")
        if p.get("accuracy"):
            st.caption(f"Accuracy: {p['accuracy']}.")
        st.caption(PO.search_summary(p))
        for line in problem_lines(p):
            st.caption(line)
        a, b = st.columns(2)
        a.plotly_chart(plots.attainment_vs_rate(p), key="plan_attain", theme=None)
        b.plotly_chart(plots.latency_throughput(p), key="plan_lat", theme=None)
        st.download_button(
            "plan.json",
            X.plan_download(p, (str(store().dir), str(SCENARIO_DIR))),
            "plan.json",
            "application/json",
            on_click="ignore",
            key="dl_plan",
        )


# --- Calibration ----------------------------------------------------------------------------


def page_calibration() -> None:
    st.title("Calibration")
    from sim.cost.profile import load_profile

    uploaded = store().profiles
    st.subheader("Profiles")
    try:
        rows = X.profile_rows()
        rows += X.profile_rows(list(uploaded), loader=lambda n: load_profile(uploaded[n]))
    except ConfigError as exc:
        rows = []
        show_error(st, X.error_text(exc))
    st.dataframe(rows, key="prof_table", hide_index=True)
    up = st.file_uploader(
        "Upload a profile JSON (≤ 5 MB; made with `kvsim calibrate`)", type=["json"], key="profile_upload"
    )
    name = accept_upload(up, "profile_upload_seen", "profile_error", store().add_profile, "Profile rejected")
    if name is not None:  # shown after the rerun that puts it in the table and the picker
        S.profile_added = f"Profile **{name}** added: pick it below, or use it in Explore."
        st.rerun()
    if S.get("profile_added"):
        st.success(S.pop("profile_added"))
    show_error(st, S.get("profile_error"))
    names = [*X.builtin_profiles(), *uploaded]
    if not names:
        st.info("No profiles.")
        return
    name = st.selectbox("Profile", names, key="prof_name")
    prof = load_profile(uploaded.get(name, name))
    c1, c2 = st.columns([3, 1])
    c1.caption(f"device {prof.device.get('name', '')} · {prof.provenance.get('source', '')}")
    if c2.button("Use in Explore", key="prof_use"):
        set_knob("cost_model.profile", name)
        st.success(f"Explore now uses cost model profile **{name}**.")
    with st.expander("Provenance"):
        st.json(prof.provenance, expanded=False)
    with st.expander("Fit quality (held-out relative error)"):
        st.json(prof.fit_quality, expanded=True)
    c1, c2 = st.columns(2)
    fam = c1.selectbox("Curve family", [f for f in X.CURVE_FAMILIES if X.curve_keys(prof, f)], key="prof_fam")
    keys = X.curve_keys(prof, fam)
    key = c2.selectbox("Shape", keys, index=X.default_index(keys, X.default_curve(prof, fam)), key="prof_key")
    fig, measured = X.calibration_figure(prof, fam, key)
    st.plotly_chart(fig, key="prof_fig", theme=None)
    if not measured:
        st.caption("No measured points for this shape in the shipped tables: the curve is the fit's prediction.")


# --- main -----------------------------------------------------------------------------------

st.sidebar.title("kvsim explorer")
page = st.sidebar.radio("Page", PAGES, key="page")
scenario_source()
if page in ("Explore", "Compare", "Sweeps & plan"):
    knob_widgets(allocator=page != "Compare")
{"Explore": page_explore, "Compare": page_compare, "Sweeps & plan": page_sweeps, "Calibration": page_calibration}[
    page
]()
