"""``kvsim plan SCENARIO --slo ...``: the command (registered in :mod:`sim.cli.main`; ``python -m sim.cli.plan`` runs it alone).

Exit status: 0 a recommendation was made; 1 none was (no candidate meets the SLO, or every one
failed); 2 bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from sim.cli.sweep import fail, stdout_console
from sim.errors import ConfigError


def plan_command(
    scenario: str = typer.Argument("chat-api", help="Scenario YAML file or built-in name."),
    slo: list[str] = typer.Option(
        ...,
        "--slo",
        help="Per-request bound, e.g. ttft_p90_s=0.5, tpot_p90_s=0.05, long:ttft_p90_s=5 "
        "(repeatable; see docs/sweeps.md for what pNN and long: mean).",
    ),
    attainment: float | None = typer.Option(
        None,
        "--attainment",
        help="Fraction of requests that must meet every bound (default: the pNN of the SLO names, or 0.9).",
    ),
    long_prompt_tokens: int | None = typer.Option(
        None,
        "--long-prompt-tokens",
        help="Prompts of at least this many tokens are long: they meet the --slo long:METRIC=SECONDS "
        "bounds where given (e.g. long:ttft_p90_s=5), the others where not.",
    ),
    allocators: str | None = typer.Option(
        None,
        "--allocators",
        help="Comma-separated candidates (default: all but "
        "hybrid_tail-quantile): static, static-p95, "
        "static-p95-fallback, paged, ...",
    ),
    target_rate: str | None = typer.Option(
        None,
        "--target-rate",
        metavar="REQ_PER_S",
        help="Requests/s to sustain: find the fewest replicas.",
    ),
    tolerance: float = typer.Option(0.05, "--tolerance", help="Relative tolerance of the goodput search."),
    seeds: int = typer.Option(
        1,
        "--seeds",
        help="Workload seeds per candidate: goodput with a confidence interval "
        "over seeds, and which candidates are within noise.",
    ),
    break_even: bool = typer.Option(
        False,
        "--break-even/--no-break-even",
        help="Find the value of each unmeasured cost-model constant at which the "
        "recommendation would flip (bisection; more simulations).",
    ),
    search: str = typer.Option(
        "guided",
        "--search",
        help="guided (saturation estimate, runs stopped when decided) or exhaustive (every probe a full run).",
    ),
    confidence: float = typer.Option(
        0.95, "--confidence", help="Confidence of the early-stopping test and of the intervals over seeds."
    ),
    set_: list[str] | None = typer.Option(None, "--set", "-s", help="Override a scenario key: dotted.path=value."),
    workers: int | None = typer.Option(
        None, "--workers", "-w", help="Candidates searched in parallel (default: cores)."
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="Replace the scenario's model, as kvsim run --model does: a catalog name, a Hugging Face "
        "config.json path, or a shipped config's id such as Qwen/Qwen3-32B (--set model.* applies after).",
    ),
    tp: str | None = typer.Option(
        None,
        "--tp",
        help="Plan at several tensor-parallel sizes (e.g. 1,2,4,8, or auto: those the model fits) "
        "and use the one needing the fewest GPUs; each size's plan goes to OUT/tpN/.",
    ),
    out: str | None = typer.Option(None, "--out", "-o", help="Output directory (default plans/<scenario name>)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress or table; print the plan.json path only."),
):
    """Goodput of each allocation strategy under SLOs, GPUs for a target rate, and a recommendation."""
    from sim.analysis.plan_output import write_plan
    from sim.analysis.planner import plan
    from sim.analysis.slo import parse_slos
    from sim.config import parse_override

    try:
        slo_ = parse_slos(slo, attainment, long_prompt_tokens)
        rate = _target_rate(target_rate)
        overrides = dict(parse_override(i) for i in set_ or [])
        if model is not None:
            from sim.cli.main import model_option_section

            overrides = {"model": model_option_section(model), **overrides}
        sizes = None
        if tp is not None:
            from sim.analysis.tp_search import parse_tp

            sizes = parse_tp(tp)
        names = [n.strip() for n in allocators.split(",") if n.strip()] if allocators else None
        from sim.limits import MAX_WORKERS

        if workers is not None and not 1 <= workers <= MAX_WORKERS:
            raise ConfigError("--workers", workers, f"an integer in [1, {MAX_WORKERS}]")
        if out is not None:
            from sim.output.staging import out_dir

            out_dir(out)  # a bad --out is refused before minutes of planning
        kw: dict[str, Any] = dict(search=search, seeds=seeds, confidence=confidence, break_even=break_even)
        # Workers forked from this process once it has loaded the simulator (before the progress
        # bar's thread exists); forkserver where fork is not available.
        import multiprocessing

        kw["start_method"] = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
        from sim.output.progress import Progress

        def run_plan(over: dict, label: str = "plan") -> dict:
            # Started (bar thread, first line) only once the workers exist: on_start.
            shown = Progress(label, "candidates", show=not quiet, note="searching goodput")
            try:
                p = plan(
                    scenario,
                    slo_,
                    over,
                    names,
                    rate,
                    tolerance,
                    workers,
                    **kw,
                    on_start=shown.start,
                    progress=lambda d, n, name: shown.update(d, total=n, note=f"{name} done"),
                )
            except BaseException:
                shown.stop(ok=False)
                raise
            shown.stop()
            return p

        if tp is None:
            p = run_plan(overrides)
            dest = write_plan(p, out if out is not None else Path("plans") / p["scenario"])
            search_ = None
        else:
            from sim.analysis.tp_search import plan_tensor_parallel

            search_ = plan_tensor_parallel(
                scenario,
                sizes,
                overrides,
                lambda over: run_plan(over, f"plan TP{over['gpu.tensor_parallel']}"),
                rate,
                tolerance,
            )
            first = next(iter(search_["plans"].values()))
            dest = Path(out if out is not None else Path("plans") / first["scenario"])
            for size, sp in search_["plans"].items():
                write_plan(sp, dest / f"tp{size}")
            p = search_["plans"].get(search_["chosen"], first)
            p = {**p, "tensor_parallel_search": search_["sizes"], "tensor_parallel_chosen": search_["chosen"]}
            write_plan(p, dest)
    except ConfigError as exc:
        fail(exc)
    if quiet:
        print(dest / "plan.json")
    else:
        _print_plan(p, dest, search_, rate)
    if p["recommendation"]["candidate"] is None or (search_ is not None and search_["chosen"] is None):
        raise typer.Exit(1)


def _print_plan(p: dict, dest: Path, search_: dict | None, rate: float | None) -> None:
    from rich.table import Table

    from sim.analysis.plan_output import assumption_lines, plan_columns, plan_dtypes, plan_router, plan_rows
    from sim.analysis.recommend import problem_lines

    console = stdout_console()
    if search_ is not None:
        from sim.analysis.tp_search import size_lines

        console.print("[bold]Tensor-parallel sizes[/bold] (each plan in its tpN/ folder):", highlight=False)
        for line in size_lines(search_, rate):
            console.print(f"  • {line}", highlight=False, markup=False)
        if search_["chosen"] is None:
            console.print("\nNo size gives a recommendation.", highlight=False)
        else:
            console.print(f"\nThe plan at TP{search_['chosen']}:\n", highlight=False)
    cal = "" if p["cost_model_calibrated"] else " — UNCALIBRATED roofline cost model"
    t = Table(
        title=f"kvsim plan: {p['scenario']} ({p['model']}{plan_dtypes(p)} on {p['gpu']}, TP{p['tensor_parallel']}); "
        f"SLO: {p['slo_text']}{plan_router(p)}{cal}"
    )
    for c in plan_columns(p):
        t.add_column(c, justify="left" if c == "candidate" else "right")
    for r in plan_rows(p):
        t.add_row(*r)
    console.print(t)
    for line in problem_lines(p):
        console.print(line, highlight=False, markup=False)
    rec = p["recommendation"]
    console.print(f"\n[bold]{rec['text']}[/bold]", highlight=False)
    for r in rec["reasons"]:
        console.print(f"  • {r}", highlight=False)
    lines = assumption_lines(p)
    if lines:
        console.print(
            "\n[bold]Assumptions[/bold] (unmeasured constants of the cost model and the KV capacity):",
            highlight=False,
        )
        for line in lines:
            console.print(f"  • {line}", highlight=False)
    if p.get("accuracy"):
        console.print(f"\n[bold]Accuracy[/bold]: {p['accuracy']}.", highlight=False)
    console.print(
        f"\nwrote {dest}/ (plan.json, plan.html); {p['simulations']} simulations "
        f"({p['quick_simulations']} stopped early when decided, {p['simulated_requests']} requests) "
        f"in {p['wall_s']:.1f} s",
        highlight=False,
    )


def _target_rate(raw: str | None) -> float | None:
    """``--target-rate`` as typed, refused on one line naming the flag (typer's own float parsing
    answers a bad number with a usage box, and a rate out of range would otherwise reach every
    candidate's first run as ``workload.arrival.rate``)."""
    from sim.analysis.planner import TARGET_RATE_ALLOWED
    from sim.limits import MAX_RATE, MIN_RATE

    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError("--target-rate", raw, TARGET_RATE_ALLOWED) from None
    if not MIN_RATE <= value <= MAX_RATE:
        raise ConfigError("--target-rate", raw, TARGET_RATE_ALLOWED)
    return value


def _main() -> None:
    app = typer.Typer(add_completion=False)
    app.command()(plan_command)
    app()


if __name__ == "__main__":
    _main()
