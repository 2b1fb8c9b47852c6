"""``kvsim validate``: mounted by ``sim.cli.main`` (``app.command("validate")(validate_command)``).

Errors are :class:`sim.errors.ConfigError`; the caller prints them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from sim.errors import ConfigError


def validate_command(
    device: str = typer.Option("cpu", "--device", help="cpu or cuda: where the reference engine and calibration run."),
    scenario: str = typer.Option("scenarios/validate-cpu.yaml", "--scenario",
                                 help="Validation spec (YAML; see docs/validation.md)."),
    profile: Optional[str] = typer.Option(None, "--profile",
                                          help="Use this profile (name or JSON) instead of calibrating the engine's "
                                               "shape on the device first."),
    out: Path = typer.Option(Path("runs/validate"), "--out", help="Output folder (validation.json, validation.html)."),
    quick: bool = typer.Option(False, "--quick", help="The spec's quick subset (CI: seconds)."),
    engine_overhead: bool = typer.Option(True, "--engine-overhead/--no-engine-overhead",
                                         help="Measure the engine's per-iteration framework overhead with its own "
                                              "loop and use it as the profile's CPU-step term."),
    kernels: Optional[str] = typer.Option(None, "--kernels",
                                          help="Attention kernels of the paged engine and its calibration: "
                                               "auto|flex|flashinfer|vllm|sdpa (default: the spec's engine.kernels, auto)."),
) -> None:
    """Run the torch reference engine and the simulator on the same requests; compare latencies and KV use."""
    from rich.console import Console
    from rich.table import Table

    from .validate import format_table, load_spec, validate

    if device not in ("cpu", "cuda"):
        raise ConfigError("validate.device", device, "one of cpu, cuda")
    spec = load_spec(scenario, quick=quick, kernels=kernels)
    err = Console(stderr=True)
    doc = validate(spec, device=device, profile=profile, out=out, engine_overhead=engine_overhead,
                   progress=lambda msg: err.print(f"[bold]validate[/] {msg}"))
    con = Console(width=None if sys.stdout.isatty() else 160)
    t = Table(title=f"kvsim validate: {doc['name']} on {doc['device']['kind']} ({doc['shape']['model']}, "
                    f"{doc['device']['dtype']}, attention {doc['device'].get('kernels', 'sdpa')}), "
                    f"profile {doc['profile']['name']}")
    n = int(doc.get("replays", 1))
    t.caption = (f"measured on the engine's {doc['clock']} clock"
                 + (f" (median of {n} replays of the same trace; replay spread = (max - min) / median)" if n > 1 else "")
                 + f": {doc['clock_meaning'][doc['clock']]} (docs/validation.md)")
    cols = (["load", "allocator", "metric", "measured", "simulated", "rel error"] + (["replay spread"] if n > 1 else [])
            + (["sensitivity"] if any("sensitivity" in r for r in doc["rows"]) else []))
    for c in cols:
        t.add_column(c, justify="left" if c in ("load", "allocator", "metric") else "right")
    for row in format_table(doc):
        t.add_row(*row)
    con.print(t)
    sm = doc.get("summary") or {}
    if sm.get("cells"):
        con.print(f"p50/p90 TTFT, TPOT, e2e: {sm['within_10pct']} of {sm['cells']} cells within 10 %, "
                  f"{sm['within_5pct']} within 5 %; median {sm['median_rel_error']:.1%}, worst {sm['max_rel_error']:.1%} "
                  f"({sm['worst']})"
                  + (f"; {sm['below_replay_spread']} of {sm['cells']} below their replay spread (noise this run "
                     "cannot resolve)" if "below_replay_spread" in sm else ""))
        if "max_step_equivalent" in sm:
            con.print(f"sensitivity = d ln(metric) / d ln(step time), from the simulator: highest "
                      f"{sm['max_sensitivity']:.1f} ({sm['max_sensitivity_cell']}); every cell's error is what a uniform "
                      f"step-time error of at most {sm['max_step_equivalent']:.1%} would make "
                      f"({sm['max_step_equivalent_cell']})")
    sem = doc["semantics"]
    con.print("semantics (engine on the simulator's clock): "
              + ", ".join(f"{k} {'identical' if v['identical'] else 'DIFFERENT'}" for k, v in sem.items()))
    for k, dd in doc["diagnostics"].items():
        for clock, d in dd.items():
            a = d.get("all", {})
            lag = d.get("feeder_lag_s", {}).get("p99")
            sp = d.get("speed_probes") or {}
            con.print(f"{k} ({clock} clock): per-iteration predicted/measured median "
                      f"{1 + a.get('signed_rel_error', {}).get('p50', 0):.3f}, "
                      f"busy-time ratio {a.get('sum_predicted_over_measured', float('nan')):.3f}, "
                      + (f"thread CPU / wall {a.get('sum_cpu_over_wall', float('nan')):.3f}" if clock != "cpu_norm" else
                         f"host-speed probe {sp.get('probes', 0)}x, {sp.get('probe_s', {}).get('p10', 0) * 1e3:.2f}/"
                         f"{sp.get('probe_s', {}).get('p50', 0) * 1e3:.2f}/{sp.get('probe_s', {}).get('p90', 0) * 1e3:.2f} ms"
                         f" p10/p50/p90 (reference {sp.get('reference_s', 0) * 1e3:.2f} ms)")
                      + (f", feeder lag p99 {lag * 1e3:.2f} ms" if clock == "wall" and lag is not None else ""))
    if len(doc.get("rows_by_clock", {})) > 1:
        other = [c for c in doc["rows_by_clock"] if c != doc["clock"]]
        for c in other:
            e = {(r["load"], r["allocator"], r["metric"]): r["rel_error"] for r in doc["rows_by_clock"][c]}
            con.print(f"{c}-clock replay, p50 rel error TTFT/TPOT/e2e: " + "; ".join(
                f"{ld}/{al} " + "/".join("-" if e.get((ld, al, m)) is None else f"{e[(ld, al, m)]:.0%}"
                                        for m in ("ttft_p50", "tpot_p50", "e2e_p50"))
                for ld, al in dict.fromkeys((r["load"], r["allocator"]) for r in doc["rows_by_clock"][c])))
    con.print(f"wrote {Path(out) / 'validation.json'} and {Path(out) / 'validation.html'} in {doc['elapsed_s']} s")


def validate_runs_command(
    runs: list[Path] = typer.Argument(..., help="Two or more kvsim validate output folders of one spec."),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the tables as JSON here."),
) -> None:
    """Read several validation runs together: per run, per cell over the runs (the systematic part), and the runs' median."""
    import json

    from .validate.several_runs import combine, load_run, markdown

    doc = combine([load_run(r) for r in runs])
    print(markdown(doc))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
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
