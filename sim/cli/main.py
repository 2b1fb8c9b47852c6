"""The ``kvsim`` command line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sim.cli.interrupts import hold_early

# Before the imports below (most of a second): a Ctrl-C during them is one line, not a traceback.
_release_signals = hold_early()

import typer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from sim.errors import ConfigError  # noqa: E402

if TYPE_CHECKING:
    from sim.config import Scenario

# Exceptions reach main() unwrapped, so a ConfigError from any subcommand is one line and exit 2.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="kvsim: KV-cache capacity simulator for LLM serving.",
)
# Piped output keeps whole cells instead of rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True)


def _fail(exc: ConfigError) -> None:
    # One plain line: scripts grep it, and rich would wrap long messages.
    sys.stderr.write(f"error: {exc}\n")
    raise typer.Exit(2)


def _overrides(items: list[str] | None) -> dict:
    from sim.config import parse_override

    return dict(parse_override(i) for i in items or [])


def _fmt(v, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}{unit}"
    return f"{v}{unit}"


_HOT_PATH = {
    "compiled": "compiled (mypyc)",
    "off": "interpreted (KVSIM_NATIVE=0)",
    "absent": "interpreted (no build: kvsim native build)",
    "stale": "interpreted (build older than the sources: kvsim native build)",
}


def can_truncate(sc: Scenario) -> bool:
    """Whether the scenario's allocator ends a request that outgrows its reservation early
    (``overflow: truncate``, on a kind that takes that knob)."""
    from sim.allocators import KINDS

    knobs = KINDS[sc.allocator.kind][0] if sc.allocator.kind in KINDS else {}
    return "overflow" in knobs and sc.allocator.overflow == "truncate"


def print_summary(
    summary: dict, wall_s: float | None = None, hot_path: str | None = None, truncates: bool = False
) -> None:
    """The run's table; ``truncates``: show the truncated count even when it is 0 (the allocator
    can truncate), as it is whenever it is not 0."""
    from sim.output.provenance import describe_block

    engine = f"{summary['engine']} engine, " if summary.get("engine") else ""  # older summaries lack it
    t = Table(
        title=f"kvsim: {summary['scenario']} — {summary['allocator']} allocator, {engine}cost model {summary['cost_model']}"
        + ("" if summary.get("cost_model_calibrated") else " (UNCALIBRATED prior)")
    )
    t.add_column("metric")
    for c in ("p50", "p90", "p99", "mean"):
        t.add_column(c, justify="right")
    for key, label in (("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"), ("e2e_s", "e2e latency (s)")):
        d = summary[key]
        t.add_row(label, *(_fmt(d[c]) for c in ("p50", "p90", "p99", "mean")))
    console.print(t)
    k = Table(show_header=False)
    k.add_column("k")
    k.add_column("v", justify="right")
    rows: list[tuple[str, object]] = [
        ("requests completed / rejected", f"{summary['completed']} / {summary['rejected']}"),
        ("rejected by reason", ", ".join(f"{a}: {b}" for a, b in summary["rejected_by_reason"].items()) or "-"),
    ]
    truncated = summary.get("truncated", 0)  # older summaries lack it
    if truncates or truncated:
        # Counted as completed, but their answers were cut short: SLO misses for `kvsim plan`.
        rows.append(("requests truncated (of completed; SLO misses)", truncated))
    rows += [
        ("preemptions", summary["preemptions"]),
        ("throughput (tokens/s, prompt+output)", _fmt(summary["throughput_tokens_per_s"])),
        ("throughput (requests/s)", _fmt(summary["throughput_requests_per_s"])),
        ("KV token utilization (used / reserved)", _fmt(summary["kv_token_utilization"])),
        ("KV memory utilization (used / capacity)", _fmt(summary["kv_memory_utilization"])),
        ("KV capacity per replica (GiB)", _fmt(summary["kv_capacity_bytes_per_replica"] / 2**30)),
        ("busy fraction", _fmt(summary["busy_fraction"])),
        ("simulated time (s)", _fmt(summary["makespan_s"])),
    ]
    profile = describe_block(summary.get("cost_model_profile"))
    if profile is not None:
        rows.append(("cost profile", profile))
    if wall_s is not None:
        rows.append(("wall time (s)", f"{wall_s:.2f}"))
    if hot_path is not None:
        rows.append(("simulator hot path", _HOT_PATH.get(hot_path, hot_path)))
    for a, b in rows:
        k.add_row(a, str(b))
    console.print(k)
    if summary.get("step_time_breakdown"):
        print_breakdown(summary["step_time_breakdown"])


def print_breakdown(b: dict) -> None:
    """Where the replicas' busy time went (``summary.json`` ``step_time_breakdown``), largest part
    first; parts of zero are left out."""
    from sim.cost.breakdown import PARTS

    t = Table(title=f"where the busy time went ({_fmt(b['busy_s'])} s over {b['iterations']} iterations)")
    for h, justify in (("part", "left"), ("s", "right"), ("share", "right"), ("what", "left")):
        t.add_column(h, justify=justify)  # type: ignore[arg-type]
    for part, sec in sorted(b["seconds"].items(), key=lambda kv: -abs(kv[1])):
        if sec:
            t.add_row(part, _fmt(sec), f"{b['share'][part]:.1%}", PARTS.get(part, ""))
    console.print(t)


#: What ``kvsim run --model`` takes.
MODEL_ALLOWED = (
    "a catalog model (kvsim list models), a Hugging Face config.json path or a folder holding one, "
    "or a shipped config's id such as Qwen/Qwen3-32B"
)


def model_option_section(model: str) -> dict:
    """The model section ``--model`` stands for (``kvsim run``, ``kvsim plan``); a variant note
    (a shipped config standing in for the one named) goes to stderr."""
    from sim.model_ids import model_argument, variant_note

    if not model.strip():
        # An empty path resolves to the working directory: it would be read as a model folder.
        raise ConfigError("--model", model, MODEL_ALLOWED)
    section = model_argument(model)
    note = variant_note(model, section)
    if note is not None:
        typer.echo(f"kvsim: {note}", err=True)
    return section


class _StderrWarnings(logging.Handler):
    """``warning: …`` lines on stderr for the ``kvsim`` logger (the roofline fallback) during one command."""

    def emit(self, record: logging.LogRecord) -> None:
        sys.stderr.write(f"warning: {record.getMessage()}\n")


@app.command()
def run(
    scenario: str = typer.Argument("chat-api", help="Scenario YAML file or built-in name."),
    set_: list[str] | None = typer.Option(None, "--set", "-s", help="Override a key: dotted.path=value (repeatable)."),
    out: str | None = typer.Option(None, "--out", "-o", help="Run directory (default runs/<scenario name>)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or table; print summary.json path only."),
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="Replace the scenario's model: a catalog name, a Hugging Face config.json "
        "path, or a shipped config's id such as Qwen/Qwen3-32B (--set model.* "
        "applies after).",
    ),
    max_requests: int | None = typer.Option(
        None, "--max-requests", help="Refuse a run of more requests (before it starts)."
    ),
    max_events: int | None = typer.Option(None, "--max-events", help="Stop a run past this many simulated events."),
    max_wall_s: float | None = typer.Option(None, "--max-wall-s", help="Stop a run past this many wall-clock seconds."),
    step_breakdown: bool = typer.Option(
        False,
        "--step-breakdown",
        help="Also say where the iteration time went (GEMMs, attention, the paged layout's share, all-reduce, "
        "host, allocator work); runs with engine.mode=step, which gives the same results more slowly.",
    ),
):
    """Simulate a scenario and write requests.parquet, timeseries.parquet, summary.json."""
    from sim.config import apply_overrides, read_scenario_dict, scenario_from_dict
    from sim.engine.budget import budget_from_options
    from sim.engine.cluster import simulate
    from sim.output.results import write_run

    warn = _StderrWarnings(logging.WARNING)
    logging.getLogger("kvsim").addHandler(warn)
    from sim.output.staging import out_dir, staged

    try:
        budget = budget_from_options(max_requests, max_events, max_wall_s)
        data, base = read_scenario_dict(scenario)
        if model is not None:
            data = {**data, "model": model_option_section(model)}
        overrides = _overrides(set_)
        if step_breakdown:
            # After the user's --set: every iteration priced on its own is what the breakdown adds up.
            if overrides.get("engine.mode", "step") != "step":
                typer.echo(
                    f"kvsim: --step-breakdown runs engine.mode=step, not {overrides['engine.mode']} (the same results)",
                    err=True,
                )
            overrides["engine.mode"] = "step"
        sc = scenario_from_dict(apply_overrides(data, overrides), base_dir=base)
        dest = out_dir(out if out is not None else Path("runs") / sc.name)
        # Every file is written into a staging folder and moved into place at the end: an
        # interrupted or failed run leaves an earlier run in ``dest`` as it was.
        with staged(dest) as stage:
            from sim.output.progress import Progress

            # The total is known from the first progress report on; "?" until then.
            with Progress(f"run {sc.name}", "requests", show=not quiet, console=err_console, lazy=True) as shown:
                result = simulate(
                    sc,
                    progress=None if quiet else lambda d, n: shown.update(d, total=n),
                    out_dir=stage,
                    budget=budget,
                    step_breakdown=step_breakdown,
                )
            write_run(result, stage, run_dir=dest)
    except ConfigError as exc:
        _fail(exc)
    finally:
        logging.getLogger("kvsim").removeHandler(warn)
    if quiet:
        print(dest / "summary.json")
    else:
        print_summary(result.summary, result.run_info["wall_s"], result.run_info.get("hot_path"), can_truncate(sc))
        console.print(f"wrote {dest}/ (requests.parquet, timeseries.parquet, summary.json)")
    warn_preemption(result.summary, sc, dest)


def warn_preemption(summary: dict, sc: Scenario, dest: Path) -> None:
    """One ``warning:`` line on stderr when the run preempted heavily (sim.output.diagnostics): a
    thrashing run otherwise finishes quietly, with only its makespan to show for it."""
    from sim.output.diagnostics import heavy_preemption, preemption_warning

    if not heavy_preemption(summary):
        return
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    # The longest prompt among completed requests names the cause; one column of the streamed file.
    t = pq.read_table(dest / "requests.parquet", columns=["status", "prompt_tokens"])
    longest = pc.max(pc.filter(t["prompt_tokens"], pc.equal(t["status"], "completed"))).as_py()
    from sim.engine.deployment import with_engine_defaults

    # The knobs as the run used them: the serving engine fills the scheduler keys the scenario left unset.
    sys.stderr.write(f"warning: {preemption_warning(summary, longest, with_engine_defaults(sc))}\n")


list_app = typer.Typer(help="List catalogs: models, gpus, scenarios, allocators.", no_args_is_help=True)
app.add_typer(list_app, name="list")


@list_app.command("models")
def list_models():
    """Model catalog with KV bytes per token (bf16), and the Hugging Face configs shipped in scenarios/models/."""
    from sim.catalog import MODELS
    from sim.hf_config import MODELS_DIR, read_hf_config, resolve_hf_config, shipped_models

    cols = (
        "name",
        "layers",
        "hidden",
        "heads",
        "kv_heads",
        "head_dim",
        "intermediate",
        "params (B)",
        "KV B/token bf16",
        "sliding window",
    )

    def row(m) -> list[str]:
        return [
            m.name,
            str(m.layers),
            str(m.hidden),
            str(m.heads),
            str(m.kv_heads),
            str(m.head_dim),
            str(m.intermediate),
            f"{m.params / 1e9:.2f}",
            f"{m.kv_bytes_per_token('bf16'):,}",
            str(m.sliding_window or "-"),
        ]

    t = Table(title="models (model.name)")
    for c in cols:
        t.add_column(c)
    for m in MODELS.values():
        t.add_row(*row(m))
    console.print(t)
    h = Table(title=f"Hugging Face configs in {MODELS_DIR} (model.hf_config: ID, or kvsim run --model ID)")
    for c in (
        "ID",
        "layers",
        "hidden",
        "heads/kv",
        "head_dim",
        "intermediate",
        "params (B)",
        "experts",
        "KV B/token",
        "weights/KV",
    ):
        h.add_column(c, no_wrap=c == "ID")
    for ident in shipped_models():
        hf = read_hf_config(resolve_hf_config(ident))
        m = hf.spec
        h.add_row(
            ident,
            str(m.layers),
            str(m.hidden),
            f"{m.heads}/{m.kv_heads}",
            str(m.head_dim),
            str(m.moe.expert_intermediate if m.moe else m.intermediate),
            f"{m.params / 1e9:.2f}" + (f" ({m.active_params / 1e9:.2f} active)" if m.moe else ""),
            f"{m.moe.experts_per_token} of {m.moe.experts}" if m.moe else "-",
            f"{m.kv_bytes_per_token(hf.kv_dtype):,}",
            f"{hf.weights_label}/{hf.kv_dtype}",
        )
    console.print(h)


@list_app.command("gpus")
def list_gpus():
    """GPU catalog."""
    from sim.catalog import GPUS
    from sim.engine.deployment import BUILTIN_PROFILE_FOR_GPU

    t = Table(
        title="gpus (gpu.name; or name: custom with memory_gib, hbm_tbps, bf16_tflops, fp8_tflops, fp4_tflops, nvlink_gbps, "
        "pcie_gbps)"
    )
    for c in (
        "name",
        "memory (GiB)",
        "HBM (TB/s)",
        "bf16 (TFLOP/s)",
        "fp8 (TFLOP/s)",
        "PCIe (GB/s)",
        "NVLink (GB/s)",
        "calibrated profile",
    ):
        t.add_column(c)
    for g in GPUS.values():
        t.add_row(
            g.name,
            f"{g.memory_bytes / 2**30:.0f}",
            f"{g.hbm_bandwidth / 1e12:.2f}",
            f"{g.peak_bf16_flops / 1e12:.0f}",
            f"{g.peak_fp8_flops / 1e12:.0f}" if g.peak_fp8_flops else "-",
            f"{g.pcie_bandwidth / 1e9:.0f}",
            f"{g.nvlink_bandwidth / 1e9:.0f}",
            BUILTIN_PROFILE_FOR_GPU.get(g.name, "- (roofline prior)"),
        )
    console.print(t)


@list_app.command("scenarios")
def list_scenarios_cmd():
    """Built-in scenarios."""
    import yaml

    from sim.config import SCENARIO_DIR, list_scenarios

    t = Table(title=f"scenarios ({SCENARIO_DIR})")
    t.add_column("name")
    t.add_column("description")
    for name in list_scenarios():
        data = yaml.safe_load((SCENARIO_DIR / f"{name}.yaml").read_text()) or {}
        t.add_row(name, str(data.get("description", "")).strip().splitlines()[0] if data.get("description") else "")
    console.print(t)


@list_app.command("allocators")
def list_allocators():
    """Allocator kinds with their knobs and defaults."""
    from sim.allocators import COMMON_KNOBS, KINDS

    t = Table(title="allocators (allocator.kind; knobs are allocator.<knob>; details in docs/allocators.md)")
    for c in ("kind", "knobs (defaults)", "what it models"):
        t.add_column(c)
    for kind, (knobs, what) in KINDS.items():
        t.add_row(kind, ", ".join(f"{k}={v}" for k, v in knobs.items()), what)
    t.add_row(
        "(every kind)",
        ", ".join(f"{k}={v}" for k, v in COMMON_KNOBS.items()),
        "preemption: recompute or swap; victim lifo or lowest_priority",
    )
    console.print(t)


@app.command("native")
def native_cmd(action: str = typer.Argument("status", help="build | status | clean")):
    """The compiled hot path (mypyc): build it, show whether it is in use, or remove it."""
    from sim import native

    if action == "status":
        console.print(native.state())
    elif action == "clean":
        console.print(f"removed {native.clean()} files")
    elif action == "build":
        console.print("compiling the hot path with mypyc (about a minute on two cores)…")
        try:
            files = native.build()
        except native.NativeBuildError as exc:
            sys.stderr.write(f"error: {exc}\n")
            raise typer.Exit(1) from None
        console.print(f"built {len(files)} extensions; state: {native.state()}")
    else:
        sys.stderr.write(f"error: native action {action!r}: expected build, status or clean\n")
        raise typer.Exit(2)


@app.command("app", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def app_cmd(ctx: typer.Context):
    """Open the Streamlit what-if explorer (needs the app extra); extra arguments go to streamlit."""
    from sim.explorer import app_command

    raise typer.Exit(app_command(list(ctx.args)))


def _mount_optional() -> None:
    """Subcommands whose modules live outside the core simulator (calibration, sweeps, app)."""
    from calibration.cli import calibrate_command, profile_app
    from calibration.validate_cli import validate_command, validate_runs_command
    from sim.cli.compare import compare_command
    from sim.cli.guide import guide_command
    from sim.cli.plan import plan_command
    from sim.cli.report import report_command
    from sim.cli.sweep import sweep_command

    app.command("calibrate")(calibrate_command)
    app.add_typer(profile_app, name="profile")
    app.command("sweep")(sweep_command)
    app.command("plan")(plan_command)
    app.command("report")(report_command)
    app.command("guide")(guide_command)
    app.command("compare")(compare_command)
    app.command("validate")(validate_command)
    app.command("validate-runs")(validate_runs_command)


try:
    _mount_optional()
finally:
    _release_signals()  # main() installs the handlers of a running command (sim/cli/interrupts.py)


def _print_version(value: bool) -> None:
    if value:
        from sim import __version__

        print(f"kvsim {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the kvsim version and exit."
    ),
) -> None:
    """kvsim: KV-cache capacity simulator for LLM serving."""


def main() -> None:
    # One error line and exit 2 for bad input, 130/143 for Ctrl-C/SIGTERM (sim/cli/interrupts.py).
    from sim.cli.interrupts import ignore_late, run_app

    status = run_app(app)
    ignore_late()
    sys.exit(status)


if __name__ == "__main__":
    main()
