"""``kvsim validate``: mounted by ``sim.cli.main`` (``app.command("validate")(validate_command)``).

Errors are :class:`sim.errors.ConfigError`; the caller prints them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sim.errors import ConfigError

from . import serving_options as opt

if TYPE_CHECKING:
    from .serving_selection import Treatments

_SB = "--serving-bench"


def validate_command(
    device: str = typer.Option("cpu", "--device", help="cpu or cuda: where the reference engine and calibration run."),
    scenario: str = typer.Option(
        # the built-in name, not a relative path: the default must work from any folder
        "validate-cpu",
        "--scenario",
        help="Validation spec: a built-in name (validate-cpu, validate-cuda) or a YAML file (docs/validation.md).",
    ),
    profile: str | None = typer.Option(
        None,
        "--profile",
        help="Use this profile (name or JSON) instead of calibrating the engine's shape on the device first.",
    ),
    out: Path = typer.Option(Path("runs/validate"), "--out", help="Output folder (validation.json, validation.html)."),
    quick: bool = typer.Option(False, "--quick", help="The spec's quick subset (CI: about a minute on 2 cores)."),
    engine_overhead: bool = typer.Option(
        True,
        "--engine-overhead/--no-engine-overhead",
        help="Measure the engine's per-iteration framework overhead with its own "
        "loop and use it as the profile's CPU-step term.",
    ),
    kernels: str | None = typer.Option(
        None,
        "--kernels",
        help="Attention kernels of the paged engine and its calibration: "
        "auto|flex|flashinfer|vllm|sdpa (default: the spec's engine.kernels, auto).",
    ),
    serving_bench: str | None = typer.Option(
        None,
        "--serving-bench",
        help="Instead: simulate end-to-end serving benchmarks (CSV, a vllm bench "
        "serve JSON, or a folder; 'builtin' = the shipped training file) "
        "and compare TTFT/TPOT with the measured runs.",
    ),
    engine: str | None = opt.engine_option(_SB, "only rows of this engine"),
    terms: str | None = typer.Option(
        None, "--terms", help="--serving-bench: engine terms file (kvsim calibrate --from-serving-bench)."
    ),
    logo: bool = typer.Option(
        False,
        "--logo",
        help="--serving-bench: leave one (model, GPU, engine) group out: fit "
        "its engine's terms on the other groups, then predict it.",
    ),
    own_fit: bool = typer.Option(
        False,
        "--own-fit",
        help="--serving-bench: fit each (model, GPU, engine) group's engine terms on its own rows, then "
        "simulate it (in-sample): the least error the terms reach, what calibrating on such runs gives.",
    ),
    requests_per_client: int = typer.Option(
        10,
        "--requests-per-client",
        min=1,
        max=1000,
        help="--serving-bench: requests each client sends, all counted (a vLLM result's own count wins).",
    ),
    workers: int = opt.workers_option(_SB),
    max_evals: int = opt.max_evals_option(_SB + " --logo or --own-fit"),
    gpu: str | None = opt.gpu_option(_SB),
    tp: int | None = typer.Option(None, "--tp", help="--serving-bench with vllm JSON results: tensor parallelism."),
    weights: str | None = opt.weights_option(_SB),
    kv: str | None = opt.kv_option(_SB),
    kv_cache_tokens: int | None = opt.kv_cache_tokens_option(_SB),
    model: str | None = opt.model_option(_SB),
    exclude_group: list[str] | None = opt.exclude_group_option(_SB + " --logo or --own-fit"),
    hold_back_flagged: bool = opt.hold_back_option(_SB, "the note", "in training and prediction"),
    spread_flagged: bool = opt.spread_option(_SB, "the note", "in training and prediction"),
    cache_flagged: bool = opt.cache_option(_SB, "the note", "in training and prediction"),
    kv_from_runs: bool = opt.kv_from_runs_option(_SB, "the note", "in training and prediction"),
    blind: bool = typer.Option(
        False,
        "--blind",
        help="--serving-bench --logo: the --*-flagged and --kv-from-runs treatments reach the training "
        "folds only; each held-out group is predicted from its runs as the file gives them.",
    ),
    served_by: str | None = opt.served_by_option(_SB),
    clients: str | None = opt.clients_option(_SB),
    sensitivity: bool = typer.Option(
        False,
        "--sensitivity",
        help="--serving-bench --logo or --own-fit: after each fit, move each term alone (halved and doubled) "
        "and name the terms its training runs do not pin (13 more simulations of them per fit).",
    ),
    client_timing: bool = typer.Option(
        False,
        "--client-timing",
        help="--serving-bench with terms as given: simulate every run again with its clients in step without "
        "jitter, in step with jitter of cv 1, and spread over a request cycle, and say how far TTFT moves.",
    ),
    prior: bool = typer.Option(
        True,
        "--prior/--no-prior",
        help="--serving-bench --logo: pull each fold's fit towards terms shared by all its training groups, "
        "of every engine (--no-prior: its engine's other groups alone, as fitted; half the time).",
    ),
) -> None:
    """Run the torch reference engine and the simulator on the same requests; compare latencies and KV use.

    With --serving-bench: simulate published or your own serving benchmark runs and compare."""
    from rich.console import Console
    from rich.table import Table

    if serving_bench is not None:
        from .serving_selection import Treatments

        _serving(
            serving_bench,
            profile=profile,
            engine=engine,
            terms=terms,
            logo=logo,
            own_fit=own_fit,
            requests_per_client=requests_per_client,
            workers=workers,
            out=out,
            gpu=gpu,
            tp=tp,
            weights=weights,
            kv=kv,
            kv_cache_tokens=kv_cache_tokens,
            model=model,
            max_evals=max_evals,
            exclude=tuple(exclude_group or ()),
            treat=Treatments(hold_back_flagged, spread_flagged, cache_flagged, kv_from_runs, blind),
            served_by=served_by,
            clients=clients,
            sensitivity=sensitivity,
            pooled_prior=prior,
            client_timing=client_timing,
        )
        return

    from sim.output.staging import out_dir

    from .validate import format_table, load_spec, validate

    if device not in ("cpu", "cuda"):
        raise ConfigError("validate.device", device, "one of cpu, cuda")
    spec = load_spec(scenario, quick=quick, kernels=kernels)
    out = out_dir(out)
    err = Console(stderr=True)
    doc = validate(
        spec,
        device=device,
        profile=profile,
        out=out,
        engine_overhead=engine_overhead,
        progress=lambda msg: err.print(f"[bold]validate[/] {msg}"),
    )
    con = Console(width=None if sys.stdout.isatty() else 160)
    t = Table(
        title=f"kvsim validate: {doc['name']} on {doc['device']['kind']} ({doc['shape']['model']}, "
        f"{doc['device']['dtype']}, attention {doc['device'].get('kernels', 'sdpa')}), "
        f"profile {doc['profile']['name']}"
    )
    n = int(doc.get("replays", 1))
    t.caption = (
        f"measured on the engine's {doc['clock']} clock"
        + (f" (median of {n} replays of the same trace; replay spread = (max - min) / median)" if n > 1 else "")
        + f": {doc['clock_meaning'][doc['clock']]} (docs/validation.md)"
    )
    cols = (
        ["load", "allocator", "metric", "measured", "simulated", "rel error"]
        + (["replay spread"] if n > 1 else [])
        + (["sensitivity"] if any("sensitivity" in r for r in doc["rows"]) else [])
    )
    for c in cols:
        t.add_column(c, justify="left" if c in ("load", "allocator", "metric") else "right")
    for row in format_table(doc):
        t.add_row(*row)
    con.print(t)
    sm = doc.get("summary") or {}
    if sm.get("cells"):
        con.print(
            f"p50/p90 TTFT, TPOT, e2e: {sm['within_10pct']} of {sm['cells']} cells within 10 %, "
            f"{sm['within_5pct']} within 5 %; median {sm['median_rel_error']:.1%}, worst {sm['max_rel_error']:.1%} "
            f"({sm['worst']})"
            + (
                f"; {sm['below_replay_spread']} of {sm['cells']} below their replay spread (noise this run "
                "cannot resolve)"
                if "below_replay_spread" in sm
                else ""
            )
        )
        if "max_step_equivalent" in sm:
            con.print(
                f"sensitivity = d ln(metric) / d ln(step time), from the simulator: highest "
                f"{sm['max_sensitivity']:.1f} ({sm['max_sensitivity_cell']}); every cell's error is what a uniform "
                f"step-time error of at most {sm['max_step_equivalent']:.1%} would make "
                f"({sm['max_step_equivalent_cell']})"
            )
    sem = doc["semantics"]
    con.print(
        "semantics (engine on the simulator's clock): "
        + ", ".join(f"{k} {'identical' if v['identical'] else 'DIFFERENT'}" for k, v in sem.items())
    )
    for k, dd in doc["diagnostics"].items():
        for clock, d in dd.items():
            a = d.get("all", {})
            lag = d.get("feeder_lag_s", {}).get("p99")
            sp = d.get("speed_probes") or {}
            con.print(
                f"{k} ({clock} clock): per-iteration predicted/measured median "
                f"{1 + a.get('signed_rel_error', {}).get('p50', 0):.3f}, "
                f"busy-time ratio {a.get('sum_predicted_over_measured', float('nan')):.3f}, "
                + (
                    f"thread CPU / wall {a.get('sum_cpu_over_wall', float('nan')):.3f}"
                    if clock != "cpu_norm"
                    else f"host-speed probe {sp.get('probes', 0)}x, {sp.get('probe_s', {}).get('p10', 0) * 1e3:.2f}/"
                    f"{sp.get('probe_s', {}).get('p50', 0) * 1e3:.2f}/{sp.get('probe_s', {}).get('p90', 0) * 1e3:.2f} ms"
                    f" p10/p50/p90 (reference {sp.get('reference_s', 0) * 1e3:.2f} ms)"
                )
                + (f", feeder lag p99 {lag * 1e3:.2f} ms" if clock == "wall" and lag is not None else "")
            )
    if len(doc.get("rows_by_clock", {})) > 1:
        other = [c for c in doc["rows_by_clock"] if c != doc["clock"]]
        for c in other:
            e = {(r["load"], r["allocator"], r["metric"]): r["rel_error"] for r in doc["rows_by_clock"][c]}
            con.print(
                f"{c}-clock replay, p50 rel error TTFT/TPOT/e2e: "
                + "; ".join(
                    f"{ld}/{al} "
                    + "/".join(
                        "-" if e.get((ld, al, m)) is None else f"{e[(ld, al, m)]:.0%}"
                        for m in ("ttft_p50", "tpot_p50", "e2e_p50")
                    )
                    for ld, al in dict.fromkeys((r["load"], r["allocator"]) for r in doc["rows_by_clock"][c])
                )
            )
    con.print(f"wrote {Path(out) / 'validation.json'} and {Path(out) / 'validation.html'} in {doc['elapsed_s']} s")


def validate_runs_command(
    runs: list[Path] = typer.Argument(..., help="Two or more kvsim validate output folders of one spec."),
    out: Path | None = typer.Option(None, "--out", help="Also write the tables as JSON here."),
) -> None:
    """Read several validation runs together: per run, per cell over the runs (the systematic part), and the runs' median."""
    import json

    from sim.output.staging import out_file

    from .validate.several_runs import combine, load_run, markdown

    seen: dict[Path, Path] = {}
    for r in runs:
        # The same run twice would count its noise as agreement (a spread of 0 between the two).
        key = r.resolve()
        if key in seen:
            raise ConfigError("validate-runs", str(r), f"distinct runs (the same folder as {seen[key]})")
        seen[key] = r
    if len(runs) < 2:
        raise ConfigError("validate-runs", f"{len(runs)} run", "two or more kvsim validate output folders")
    if out is not None:
        out = out_file(out)
    doc = combine([load_run(r) for r in runs])
    print(markdown(doc))
    if out is not None:
        out.write_text(json.dumps(doc, indent=1))
        print(f"wrote {out}")


def main() -> None:  # ``python -m calibration.validate_cli`` until sim.cli.main mounts the command
    import typer as _t

    try:
        _t.run(validate_command)
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()


def _serving(
    path: str,
    *,
    profile,
    engine,
    terms,
    logo,
    requests_per_client,
    workers,
    out,
    gpu,
    tp,
    weights: str | None = None,
    kv: str | None = None,
    kv_cache_tokens: int | None = None,
    model: str | None = None,
    max_evals: int = 100,
    exclude: tuple[str, ...] = (),
    treat: Treatments | None = None,
    served_by: str | None = None,
    clients: str | None = None,
    own_fit: bool = False,
    sensitivity: bool = False,
    pooled_prior: bool = True,
    client_timing: bool = False,
) -> None:
    from rich.console import Console
    from rich.table import Table

    from .fit_progress import progress_display
    from .serving_bench import TRAINING_FILE
    from .serving_notes import (
        apart_warnings,
        completion_warnings,
        fast_run_warnings,
        kernel_warnings,
        kv_warnings,
        listed_lines,
        roofline_warnings,
        unpinned_warnings,
    )
    from .serving_report import validate_serving_bench
    from .serving_selection import Treatments
    from .serving_tables import (
        HEADER,
        SCALING_HEADER,
        SPLIT_HEADER,
        TTFT_LINE_HEADER,
        scaling_rows,
        split_rows,
        table_rows,
        ttft_line_rows,
    )

    err = Console(stderr=True)
    src = str(TRAINING_FILE) if path == "builtin" else path
    with progress_display("validate", err):
        doc = validate_serving_bench(
            src,
            profile=profile,
            engine=engine,
            terms_file=terms,
            logo=logo,
            own_fit=own_fit,
            requests_per_client=requests_per_client,
            workers=workers,
            out=out,
            gpu=gpu,
            tp=tp,
            weights=weights,
            kv=kv,
            kv_cache_tokens=kv_cache_tokens,
            model=model,
            max_evals=max_evals,
            exclude=exclude,
            treat=treat or Treatments(),
            served_by=served_by,
            clients=clients,
            sensitivity=sensitivity,
            pooled_prior=pooled_prior,
            client_timings=client_timing,
            log=lambda msg: err.print(f"[bold]validate[/] {msg}"),
        )

    def table(title: str, caption: str, header, rows: list[list[str]]) -> Table:
        t = Table(title=title, caption=caption)
        for c in header:
            t.add_column(c, justify="left" if c.startswith("group") else "right")
        for row in rows:
            t.add_row(*row)
        return t

    con = Console(width=None if sys.stdout.isatty() else 200)
    con.print(
        table(
            f"kvsim against real servers: {doc['rows']} runs of {src}",
            doc["protocol"],
            HEADER,
            table_rows(doc["score"]),
        )
    )
    # The diagnostics a file gives enough runs for, each a table of its own.
    diagnostics = (
        (
            "tpot_error_split",
            "where the TPOT error comes from",
            "a line through each group's TPOT errors against the share of wall time its runs spend "
            "in prefills: its value with no prefill (decode iterations mispriced) and its change per unit "
            "of prefill share (prefills mispriced, or batched otherwise than the server does)",
            SPLIT_HEADER,
            split_rows,
        ),
        (
            "ttft_vs_prefill",
            "what sets TTFT at the lowest concurrency",
            "a line through the mean TTFT of each group's runs at its lowest concurrency against one "
            "prompt's prefill at the engine's kernel prices: a slope above 1 with no intercept says prompts "
            "wait behind others' prefills (clients arriving together), an intercept with a slope near 1 a "
            "fixed front end",
            TTFT_LINE_HEADER,
            ttft_line_rows,
        ),
        (
            "tp_scaling",
            "what more GPUs buy",
            "TPOT at the smaller tensor-parallel size / TPOT at the larger, for the same prompt and output "
            "lengths and concurrency (median over the lengths run at both): each group's largest pair of "
            "sizes; every pair is in serving_validation.json (tp_scaling)",
            SCALING_HEADER,
            scaling_rows,
        ),
    )
    for key, title, caption, header, rows_of in diagnostics:
        if doc[key]:
            con.print(table(title, caption, header, rows_of(doc[key])))
    if doc["client_timing"]:
        from .client_timing import timing_header, timing_rows

        con.print(
            table(
                "TTFT and the clients' timing",
                "TTFT median |error| with the clients as simulated and under each other timing; in brackets, how far "
                "the simulated TTFT moved: the median and the 90th percentile of its size (client_timing in "
                "serving_validation.json)",
                timing_header(doc["client_timing"]),
                timing_rows(doc["client_timing"], doc["score"]),
            )
        )
    for line in (
        completion_warnings(doc["ttft_follows_completions"], doc["held_back"])
        + apart_warnings(doc["clients_apart"], doc["spread"])
        + kernel_warnings(doc["faster_than_kernels"], doc["least_cached_share"], doc["cached"])
        + fast_run_warnings(doc["fast_runs"])
        + kv_warnings(doc["kv_capacity"], doc["kv_from_runs"])
        + roofline_warnings(doc["roofline_priced"])
        + unpinned_warnings(doc["fold_sensitivity"], logo)
    ):
        con.print(f"note: {line}")
    failed = [f"{r.get('origin') or r['source']}: {r['error']}" for r in doc["results"] if r["error"]]
    for line in listed_lines(failed, "simulated without a result", " (results[].error in serving_validation.json)"):
        con.print(line)
    if doc["skipped_rows"]:
        n = len(doc["skipped_rows"])
        con.print(
            f"{n} row{'s' if n > 1 else ''} of the file left out, not simulated (named above; "
            "skipped_rows in serving_validation.json)"
        )
    if out is not None:
        con.print(f"wrote {out / 'serving_validation.json'} and {out / 'serving_validation.html'} ({doc['wall_s']} s)")
