"""``kvsim compare RESULT...``: replay serving benchmarks in the simulator (registered in :mod:`sim.cli.main`).

Exit status, as ``kvsim sweep``'s: 0 every file compared; 1 some files could not be compared
(each named on one line as it is found and listed again at the end; the others are compared and
written); 2 bad input: a bad option (an unknown engine, model or GPU, a bad override) or no file
that could be compared.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from sim.cli.sweep import fail, stdout_console
from sim.errors import ConfigError

#: Scenario keys the options set: a value they refuse is the option's, named as the command line spells it.
OPTION_KEYS = {
    "engine.kind": "--engine",
    "gpu.name": "--gpu",
    "gpu.tensor_parallel": "--tp",
    "cost_model.profile": "--profile",
}


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def print_comparison(doc: dict) -> None:
    from rich.table import Table

    from sim.analysis.bench_compare import METRICS, THROUGHPUTS

    sim = doc["simulation"]
    cal = "" if sim["cost_model_calibrated"] else " (UNCALIBRATED roofline prior)"
    req = doc["requests"]
    no_output = req["no_output_left_out"]
    left_out = f"{req['failed_left_out']} failed in the file" + (
        f", {no_output} without an output token" if no_output else ""
    )
    t = Table(
        title=f"kvsim compare: {Path(doc['file']).name}\n{sim['model']} on {sim['gpu']} TP{sim['tensor_parallel']}, "
        f"engine {sim['engine']}, cost model {sim['cost_model']}{cal}\n{req['simulated']} requests "
        f"({left_out}, left out); arrivals: {doc['arrival']}"
    )
    for c in ("metric", "stat", "measured", "simulated", "rel error"):
        t.add_column(c, justify="left" if c in ("metric", "stat") else "right")
    labels = dict(METRICS) | dict(THROUGHPUTS)
    last = None
    for r in doc["rows"]:
        label = labels[r["metric"]] if r["metric"] != last else ""
        if r["metric"] != last and last is not None and r["stat"] in ("mean", "-") and last in dict(METRICS):
            t.add_section()
        last = r["metric"]
        t.add_row(label, r["stat"], _ms(r["measured"]), _ms(r["simulated"]), _pct(r["rel_error"]))
    stdout_console().print(t)


def _blame(exc: ConfigError, path: Path, given: dict[str, object], overrides: dict) -> tuple[bool, ConfigError]:
    """Whose a refusal met while replaying the file at ``path`` is: ``(True, error)`` the file's,
    ``(False, error)`` an option's (every file would meet it). A key that an override or a given
    option sets is the option's; any other the scenario took from the file."""
    key = exc.key
    if key == str(path) or key.startswith(f"{path}: "):
        return True, exc
    if any(key == k or key.startswith(k + ".") for k in overrides):
        return False, exc
    option = OPTION_KEYS.get(key) or ("--model" if key.startswith("model.") else None)
    if option is not None and given.get(option) is not None:
        return False, ConfigError(option, given[option], exc.allowed)
    return True, ConfigError(f"{path}: {key}", exc.value, exc.allowed)


def _write_out(out: Path, docs: list[dict], problems: list[tuple[Path, ConfigError]]) -> None:
    from sim import __version__
    from sim.analysis.bench_compare import strict_json

    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "kvsim_version": __version__,
        "comparisons": docs,
        "not_compared": [{"file": str(p), "error": str(e)} for p, e in problems],
    }
    out.write_text(strict_json(doc))
    stdout_console().print(f"wrote {out}")


def compare_command(
    results: list[Path] = typer.Argument(
        ..., help="Result JSON files of vllm bench serve --save-result --save-detailed, or folders of them."
    ),
    engine: str | None = typer.Option(
        None,
        "--engine",
        help="Serving engine preset: vllm, sglang, trtllm (TensorRT-LLM), reference; default: the file's backend "
        "(vllm where it names no other preset).",
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="Catalog model or Hugging Face config.json (path or shipped id); default: the file's model_id.",
    ),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU name (kvsim list gpus); default H100-SXM-80GB."),
    tp: int | None = typer.Option(None, "--tp", help="Tensor-parallel degree (1, 2, 4, 8)."),
    profile: str | None = typer.Option(
        None, "--profile", help="Cost-model profile (name or JSON); default: the GPU's."
    ),
    set_: list[str] | None = typer.Option(None, "--set", "-s", help="Override a scenario key: dotted.path=value."),
    seed: int = typer.Option(0, "--seed", help="Seed of the simulation (and of Poisson/gamma send times)."),
    runs: Path = typer.Option(Path("runs"), "--runs", help="Each file's simulation goes to RUNS/compare-<file name>/."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Also write every comparison into this JSON file."),
    index: int | None = typer.Option(
        None,
        "--index",
        help="Which result of a file holding several, one per line (--append-result, JSONL), 0-based; "
        "a file with more than one needs it.",
    ),
):
    """Simulate the requests of serving-benchmark results with the same arrivals; measured vs simulated latencies."""
    from typing import get_args

    from sim.analysis.bench_compare import compare_result, run_name, strict_json
    from sim.analysis.bench_results import BenchResult, read_bench_result, result_files
    from sim.config import GpuConfig, parse_override
    from sim.engine_presets import ENGINE_KINDS, normalize_engine
    from sim.output.staging import out_dir, out_file

    # Options first: a bad one would refuse every file the same way, so it stops the command at once.
    try:
        # The spellings serving-bench files' engine column accepts (TensorRT-LLM, trt-llm, any case).
        kind = normalize_engine(engine) if engine is not None else None
        if kind is not None and kind not in ENGINE_KINDS:
            raise ConfigError(
                "--engine", engine, f"one of {', '.join(ENGINE_KINDS)} (any case; TensorRT-LLM and trt-llm for trtllm)"
            )
        degrees = get_args(GpuConfig.model_fields["tensor_parallel"].annotation)
        if tp is not None and tp not in degrees:
            raise ConfigError("--tp", tp, f"one of {', '.join(map(str, degrees))}")
        overrides = dict(parse_override(i) for i in set_ or [])
        # Where the results go, as kvsim sweep and kvsim report check it: a folder given as --out, or
        # a file as --runs, is named now rather than after every file was simulated.
        if out is not None:
            out = out_file(out)
        out_dir(runs, "--runs")
    except ConfigError as exc:
        fail(exc)
    given: dict[str, object] = {"--engine": engine, "--gpu": gpu, "--tp": tp, "--profile": profile, "--model": model}

    # A bad file is named on one line and left out; the others are still compared.
    problems: list[tuple[Path, ConfigError]] = []

    def bad(path: Path, exc: ConfigError) -> None:
        problems.append((path, exc))
        sys.stderr.write(f"error: {exc}\n")

    files: list[Path] = []
    for arg in results:
        try:
            files.extend(result_files([arg]))
        except ConfigError as exc:
            bad(arg, exc)
    parsed: list[BenchResult] = []
    for f in files:  # every file checked before any simulation
        try:
            parsed.append(read_bench_result(f, index))
        except ConfigError as exc:
            bad(f, exc)
    docs: list[dict] = []
    option_error: ConfigError | None = None
    used: set[str] = set()
    for res in parsed:
        name = run_name(res)
        while name in used:  # files of the same name from different folders
            name += "+"
        used.add(name)
        run_dir = runs / name
        try:
            doc = compare_result(
                res,
                run_dir,
                engine=kind,
                model=model,
                gpu=gpu,
                tp=tp,
                profile=profile,
                overrides=overrides,
                seed=seed,
            )
        except ConfigError as exc:
            files_fault, err = _blame(exc, res.path, given, overrides)
            if not files_fault:
                option_error = err
                break
            bad(res.path, err)
            continue
        (run_dir / "compare.json").write_text(strict_json(doc))
        docs.append(doc)
        for n in doc["notes"]:
            sys.stderr.write(f"note: {res.name}: {n}\n")
        print_comparison(doc)
        for w in doc["warnings"]:
            sys.stderr.write(f"warning: {res.name}: {w}\n")
        stdout_console().print(f"wrote {run_dir}/ (compare.json, scenario.yaml, requests.parquet, ...)")
    # Comparisons already made are written whatever comes after them.
    if out is not None and docs:
        _write_out(out, docs, problems)
    if option_error is not None:
        fail(option_error)
    if not docs:
        if len(problems) > 1:
            sys.stderr.write(f"error: none of the {len(problems)} result files could be compared (each named above)\n")
        raise typer.Exit(2)
    if problems:
        total = len(docs) + len(problems)
        sys.stderr.write(f"{len(problems)} of {total} result files could not be compared (the others are written):\n")
        for _, problem in problems:
            sys.stderr.write(f"not compared: {problem}\n")
        raise typer.Exit(1)
