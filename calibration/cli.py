"""Command-line entry points for calibration, mounted under ``kvsim`` by ``sim.cli.main``.

* :func:`calibrate_command` — ``kvsim calibrate``: build a profile from published kernel
  tables (``--from-tables DIR --system h200_sxm --backend trtllm --model NAME``) or by
  timing kernels on this machine (``--device cpu|cuda --model NAME [--quick] [--kernels K]``);
  ``--model`` is read as ``kvsim run --model`` reads it (:func:`model_option`).
* :data:`profile_app` — ``kvsim profile list`` / ``kvsim profile show NAME``.

Errors are :class:`sim.errors.ConfigError`; the caller prints them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sim.cost.profile import list_profiles, load_profile
from sim.errors import ConfigError

from . import serving_options as opt

if TYPE_CHECKING:
    from sim.catalog import ModelSpec

    from .serving_selection import Treatments

# The fitting stack (scipy) is imported inside the commands: every `kvsim` start mounts this module.
DEFAULT_TPS = (1, 2, 4, 8)
_FSB = "--from-serving-bench"
#: The ``--model`` help of ``kvsim calibrate`` and ``kvsim profile diff``: what ``kvsim run --model`` takes.
MODEL_HELP = (
    "a catalog name (kvsim list models), a Hugging Face config.json path, or a shipped config's id "
    "such as Qwen/Qwen3-32B or meta-llama/Llama-3.1-8B-Instruct (as kvsim run --model)"
)


def model_option(model: str) -> ModelSpec:
    """The model a command line's ``--model`` names, resolved as ``kvsim run --model`` resolves it
    (:func:`sim.model_ids.model_argument` into the scenario's ``model`` section, then its shape as
    a run reads it); one not found is a ConfigError naming ``--model``."""
    from sim.catalog import MODELS
    from sim.cli.main import MODEL_ALLOWED
    from sim.config import scenario_from_dict
    from sim.engine.deployment import model_spec
    from sim.hf_config import resolve_hf_config
    from sim.model_ids import model_argument

    unknown = ConfigError("--model", model, f"{MODEL_ALLOWED}; catalog models: {', '.join(MODELS)}")
    if not model.strip():
        # An empty path resolves to the working directory: it would be read as a model folder.
        raise unknown
    section = model_argument(model)
    if section.get("hf_config") is not None:
        try:
            resolve_hf_config(section["hf_config"])
        except ConfigError:
            raise unknown from None
    # A config that is found but cannot be read keeps its own error (the file and what is wrong with it).
    return model_spec(scenario_from_dict({"model": section}))


def _tp_pairs(spec: ModelSpec, tps: tuple[int, ...]) -> list[tuple[ModelSpec, int]]:
    """(model, TP) for the degrees in ``tps`` that split its heads, KV heads, intermediate size and
    vocabulary evenly: those :func:`sim.cost.profile_model.shape_keys` prices (the pairs
    :func:`calibration.profile_builder.default_models` makes of catalog names, for any shape)."""
    from sim.cost.profile_model import shape_keys

    pairs = []
    for tp in tps:
        try:
            shape_keys(spec, tp, "bf16", "bf16")
        except ConfigError:
            continue
        pairs.append((spec, tp))
    return pairs


def _serving_bench(
    path: str,
    out: Path,
    *,
    engine,
    profile,
    gpu,
    tp,
    max_evals,
    workers,
    exclude: tuple[str, ...] = (),
    weights: str | None = None,
    kv: str | None = None,
    kv_cache_tokens: int | None = None,
    model: str | None = None,
    treat: Treatments | None = None,
    served_by: str | None = None,
    clients: str | None = None,
    sensitivity: bool = True,
    prior: bool = False,
) -> None:
    from rich.console import Console

    from .serving_bench import TRAINING_FILE
    from .serving_notes import sensitivity_lines
    from .serving_report import calibrate_from_serving_bench
    from .serving_selection import Treatments

    err = Console(stderr=True)
    src = str(TRAINING_FILE) if path == "builtin" else path

    def progress(eng: str, n: int, loss: float, terms: dict) -> None:
        if n % 10 == 0:
            err.print(
                f"[bold]calibrate[/] {eng}: {n} simulations of its rows, objective {loss:.3f} "
                f"(host {terms['host_s'] * 1e3:.2f} ms + {terms['host_per_seq_s'] * 1e6:.1f} us/seq, hidden "
                f"{terms['host_hidden']:.0%}, front end {terms['frontend_s'] * 1e3:.1f} ms, client cv "
                f"{terms['client_cv']:.2f}, {terms.get('completion_per_token_s', 0.0) * 1e6:.1f} us per output token "
                f"after each completion, {terms.get('stream_per_token_s', 0.0) * 1e6:.1f} us per streamed token)"
            )

    from .fit_progress import progress_display

    with progress_display("calibrate", err):
        terms = calibrate_from_serving_bench(
            src,
            out,
            profile=profile,
            engine=engine,
            gpu=gpu,
            tp=tp,
            weights=weights,
            kv=kv,
            kv_cache_tokens=kv_cache_tokens,
            model=model,
            max_evals=max_evals,
            workers=workers,
            exclude=exclude,
            treat=treat or Treatments(),
            served_by=served_by,
            clients=clients,
            sensitivity=sensitivity,
            prior=prior,
            progress=progress,
            warn=lambda line: err.print(f"[bold yellow]calibrate warning[/] {line}"),
        )
    typer.echo(
        f"wrote {out}: terms of {', '.join(sorted(terms.engines))} fitted on {len(terms.groups)} group{'s' if len(terms.groups) != 1 else ''}, "
        f"objective {terms.loss:.3f} after {terms.evals} simulations; use it with engine.terms_file: {out}"
    )
    for e, t in sorted(terms.engines.items()):
        typer.echo(f"  {e}: " + ", ".join(f"{k} {v:.4g}" for k, v in t.items()))
    for line in sensitivity_lines(terms.sensitivity):
        typer.echo(line)


profile_app = typer.Typer(help="Built-in and user calibration profiles.", no_args_is_help=True)


def calibrate_command(
    out: Path = typer.Option(
        ..., "--out", help="Profile JSON to write (with --from-serving-bench: the engine terms file)."
    ),
    model: str | None = typer.Option(
        None,
        "--model",
        help=f"Model whose kernel shapes to calibrate: {MODEL_HELP}. {_FSB} {opt.MODEL_FOR_RESULTS}.",
    ),
    from_tables: Path | None = typer.Option(None, "--from-tables", help="Folder of aiconfigurator-format tables."),
    system: str = typer.Option("h200_sxm", "--system", help="System folder under --from-tables."),
    backend: str = typer.Option("trtllm", "--backend", help="Serving backend whose tables to use."),
    dtype: str | None = typer.Option(None, "--dtype", help="Keep only this weight/KV dtype (bf16|fp8)."),
    tensor_parallel: list[int] | None = typer.Option(
        None,
        "--tp",
        help="TP degrees (default: 1,2,4,8 that divide; --device: 1 only). --from-serving-bench with vllm "
        "JSON results: the runs' tensor-parallel degree (the files do not record it).",
    ),
    device: str | None = typer.Option(None, "--device", help="Time real torch kernels on cpu|cuda instead."),
    quick: bool = typer.Option(False, "--quick", help="Small grids (device route)."),
    name: str | None = typer.Option(None, "--name", help="Profile name (default: derived from the device)."),
    threads: int | None = typer.Option(None, "--threads", help="CPU threads for the device route (default 1)."),
    report: bool = typer.Option(
        True,
        "--report/--no-report",
        help="--device: write <out>.report.html, the fit against the timings (needs plotly); --from-tables fits published tables and writes none.",
    ),
    kernels: str = typer.Option(
        "auto",
        "--kernels",
        help="Attention kernels timed on the device route: auto|flex|flashinfer|vllm|sdpa "
        "(auto: CUDA flashinfer > vllm > flex, CPU sdpa).",
    ),
    from_serving_bench: str | None = typer.Option(
        None,
        "--from-serving-bench",
        help="Fit serving-engine terms (host time, front end, client jitter) to "
        "end-to-end benchmark results: a CSV, a vllm bench serve JSON, or a folder.",
    ),
    engine: str | None = opt.engine_option(_FSB, "only this engine's rows"),
    profile: str | None = typer.Option(
        None, "--profile", help="--from-serving-bench: the kernel profile (default: the GPU's built-in one)."
    ),
    gpu: str | None = opt.gpu_option(_FSB),
    weights: str | None = opt.weights_option(_FSB),
    kv: str | None = opt.kv_option(_FSB),
    kv_cache_tokens: int | None = opt.kv_cache_tokens_option(_FSB),
    max_evals: int = opt.max_evals_option(_FSB),
    workers: int = opt.workers_option(_FSB),
    exclude_group: list[str] | None = opt.exclude_group_option(_FSB),
    hold_back_flagged: bool = opt.hold_back_option(_FSB, "the warning", "in the fit"),
    spread_flagged: bool = opt.spread_option(_FSB, "the warning", "in the fit"),
    cache_flagged: bool = opt.cache_option(_FSB, "the warning", "in the fit"),
    kv_from_runs: bool = opt.kv_from_runs_option(_FSB, "the warning", "in the fit"),
    served_by: str | None = opt.served_by_option(_FSB),
    clients: str | None = opt.clients_option(_FSB),
    sensitivity: bool = typer.Option(
        True,
        "--sensitivity/--no-sensitivity",
        help=f"{_FSB}: after the fit, move each term alone (halved and doubled) and report how much the "
        "objective rises: which terms the runs pin down (13 more simulations of the rows per engine).",
    ),
    prior: bool = typer.Option(
        False,
        "--prior/--no-prior",
        help=f"{_FSB}: pull each engine's terms towards the built-in preset's, so the terms your runs do not pin "
        "stay at the preset's values instead of wherever the fit leaves them (a handful of runs).",
    ),
) -> None:
    """Fit a kvsim profile from kernel tables or from kernels timed on this machine; or fit serving-engine
    terms to end-to-end benchmarks (--from-serving-bench)."""
    from sim.output.staging import out_file, staged

    if from_serving_bench is not None:
        from .serving_selection import Treatments

        _serving_bench(
            from_serving_bench,
            out,
            engine=engine,
            profile=profile,
            gpu=gpu,
            tp=tensor_parallel[0] if tensor_parallel else None,
            max_evals=max_evals,
            workers=workers,
            exclude=tuple(exclude_group or ()),
            weights=weights,
            kv=kv,
            kv_cache_tokens=kv_cache_tokens,
            model=model,
            treat=Treatments(hold_back_flagged, spread_flagged, cache_flagged, kv_from_runs),
            served_by=served_by,
            clients=clients,
            sensitivity=sensitivity,
            prior=prior,
        )
        return
    if model is None:
        raise ConfigError(
            "calibrate.model",
            None,
            "--model NAME (the model whose kernel shapes to calibrate: a catalog name, a Hugging Face "
            "config.json path or a shipped config's id)",
        )
    if device is not None and device not in ("cpu", "cuda"):
        raise ConfigError("calibrate.device", device, "one of cpu, cuda")
    if from_tables is not None and device is not None:
        raise ConfigError(
            "calibrate.device",
            device,
            "not with --from-tables: the two options cannot be combined (a profile is built from the tables or "
            "by timing this device; drop one)",
        )
    if from_tables is None and device is None:
        raise ConfigError("calibrate.device", None, "--device cpu|cuda, or --from-tables DIR instead")
    for tp in tensor_parallel or ():
        # anything else would divide by zero (0) or write a curve kvsim never looks up (16)
        if isinstance(tp, bool) or tp not in DEFAULT_TPS:
            raise ConfigError("calibrate.tp", tp, f"one of {', '.join(map(str, DEFAULT_TPS))}")
    if device is not None and tensor_parallel and set(tensor_parallel) != {1}:
        # the device route times one device's kernels: its profile is tp1 whatever --tp says
        raise ConfigError(
            "calibrate.tp",
            tensor_parallel[0] if len(set(tensor_parallel)) == 1 else list(tensor_parallel),
            "1 with --device (it times the kernels of one device, unsplit); other degrees: --from-tables",
        )
    out = out_file(out)
    if device is not None:
        from .kernels.calibrate import sidecar_paths

        # the sidecars are written after minutes of timing: a folder in their place must be said now
        pq_path, html_path = sidecar_paths(out)
        for side, what in ((pq_path, "raw timings"), (html_path, "fit report")):
            if side == html_path and not report:
                continue
            try:
                out_file(side)
            except ConfigError as exc:
                raise ConfigError(
                    "--out", str(side), f"{exc.allowed}: the {what} written next to --out {out}"
                ) from None
    spec = model_option(model)
    if dtype is not None and dtype not in ("bf16", "fp8"):
        raise ConfigError("calibrate.dtype", dtype, "bf16 or fp8")
    from .attention_backends import KERNELS

    if kernels not in KERNELS:
        raise ConfigError("calibrate.kernels", kernels, f"one of {', '.join(KERNELS)}")
    if from_tables is not None and kernels != "auto":
        raise ConfigError(
            "calibrate.kernels",
            kernels,
            "auto with --from-tables (the tables name their own kernels); --kernels chooses what --device times",
        )
    if device is not None:
        from .kernels import calibrate_device, write_outputs  # torch is imported only on this route

        if threads is not None and threads < 1:
            raise ConfigError("calibrate.threads", threads, "a thread count >= 1")
        result = calibrate_device(
            device, spec, quick=quick, name=name, dtype=dtype or "bf16", threads=threads, kernels=kernels
        )
        files = write_outputs(result, out, spec, report=report)
        built = result.profile
        att = built.provenance["attention_backend"]
        typer.echo(
            f"timed {sum(result.profile.provenance['measured_points'].values())} points on "
            f"{built.device['name']} in {result.elapsed_s:.1f} s with attention {att['name']} {att['version']}"
            + (f" ({att['compiled_graphs']} compiled graphs)" if att.get("compiled_graphs") else "")
            + f"; raw timings: {files['measurements']}"
            + (
                f"; fit report: {files['report']}"
                if files["report"]
                else ("; fit report skipped (plotly not installed)" if report else "")
            )
            + (
                f"; removed {files['removed']}, an earlier run's report (it described another calibration)"
                if files.get("removed")
                else ""
            )
        )
        path = files["profile"]
    else:
        from .profile_builder import build_profile
        from .tables import load_kernel_tables

        tps = tuple(tensor_parallel or DEFAULT_TPS)
        pairs = _tp_pairs(spec, tps)
        if not pairs:
            raise ConfigError("calibrate.tp", list(tps), f"TP degrees dividing {spec.name}'s heads ({spec.heads})")
        assert from_tables is not None  # exactly one of --from-tables and --device, checked above
        kt = load_kernel_tables(from_tables, system, backend)
        built = build_profile(kt, models=pairs, name=name, dtype=dtype)
        with staged(out.parent) as stage:  # the file appears whole or not at all (Ctrl-C included)
            built.write(stage / out.name)
        path = out
    q = built.fit_quality
    typer.echo(f"wrote {path} ({built.name}; models {', '.join(built.models)})")
    for fam, v in q.items():
        if isinstance(v, dict) and "overall" in v:
            o = v["overall"]
            typer.echo(f"  {fam}: held-out median {o['median_rel_err']:.1%}, p95 {o['p95_rel_err']:.1%} (n={o['n']})")


@profile_app.command("list")
def profile_list() -> None:
    """Built-in profiles with their device and backend."""
    for name in list_profiles():
        p = load_profile(name)
        prov = p.provenance
        typer.echo(
            f"{name:12s} {p.device.get('name', '?'):16s} {prov.get('backend', '?')} "
            f"{prov.get('backend_versions', {}).get('gemm', '')}  models: {len(p.models)}  dtypes: "
            f"weights {','.join(p.dtypes.get('weight', []))} / kv {','.join(p.dtypes.get('kv', []))}"
        )


@profile_app.command("diff")
def profile_diff(
    a: str = typer.Argument(
        ..., help="Profile A: a JSON path (e.g. from kvsim calibrate --device cuda) or built-in name."
    ),
    b: str = typer.Argument(..., help="Profile B, the reference (e.g. the built-in for that GPU: h200-sxm)."),
    model: str | None = typer.Option(
        None,
        "--model",
        help=f"Model whose GEMM shapes are priced: {MODEL_HELP} (default: the one model profile A, else B, "
        "was calibrated for; else llama-3.1-8b).",
    ),
    tensor_parallel: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel size (shards the GEMMs)."),
    weight_dtype: str = typer.Option("bf16", "--weight-dtype", help="Weight dtype of the GEMMs."),
    as_json: bool = typer.Option(False, "--json", help="Print the rows and summary as JSON."),
) -> None:
    """One model's GEMMs priced by two profiles side by side: A / B per projection and token count,
    and the median |A/B - 1| over the points both measured (docs/calibration.md)."""
    from calibration.profile_diff import default_model, gemm_rows, summary

    if model is None:
        model = default_model(a, b)
    spec = model_option(model)
    rows = gemm_rows(a, b, spec, tensor_parallel=tensor_parallel, weight_dtype=weight_dtype)
    s = summary(rows)
    if as_json:
        typer.echo(json.dumps({"a": a, "b": b, "model": model, "rows": [r.__dict__ for r in rows], "summary": s}))
        return
    label = model if spec.name == model else f"{model} ({spec.name})"
    typer.echo(f"{label} TP{tensor_parallel} {weight_dtype} GEMMs, us per layer: A = {a}, B = {b}")
    typer.echo(f"{'projection':>10} {'tokens':>7} {'A us':>10} {'B us':>10} {'A/B':>6}")
    for r in rows:
        flag = "  (outside a measured grid)" if r.outside else ""
        typer.echo(f"{r.proj:>10} {r.tokens:>7} {r.a_s * 1e6:>10.1f} {r.b_s * 1e6:>10.1f} {r.ratio:>6.2f}{flag}")
    if s["n_measured"]:
        typer.echo(
            f"median |A/B - 1| {s['median_abs_diff_measured']:.1%} (largest {s['max_abs_diff_measured']:.1%}) over "
            f"the {s['n_measured']} points both profiles measured; {s['median_abs_diff']:.1%} over all {s['n']}"
        )
    else:
        typer.echo(
            f"no point lies inside both measured grids; median |A/B - 1| {s['median_abs_diff']:.1%} over {s['n']}"
        )


def _versions_text(versions) -> str:
    """A profile's ``backend_versions`` as one readable clause (``gemm 2.13.0, …``); those it does not
    record (``nccl`` on one device: null) are left out."""
    if not isinstance(versions, dict):
        return "" if versions in (None, "") else f" ({versions})"
    parts = [f"{k} {v}" for k, v in versions.items() if v not in (None, "")]
    return f" ({', '.join(parts)})" if parts else ""


@profile_app.command("show")
def profile_show(
    name: str = typer.Argument(..., help="Built-in profile name or JSON path."),
    as_json: bool = typer.Option(False, "--json", help="Print provenance and fit quality as JSON."),
) -> None:
    """Provenance, fit quality and covered model shapes of one profile."""
    p = load_profile(name)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "name": p.name,
                    "device": p.device,
                    "provenance": p.provenance,
                    "fit_quality": p.fit_quality,
                    "models": sorted(p.models),
                    "dtypes": p.dtypes,
                    "moe": p.moe,
                    "mla": p.mla,
                },
                indent=2,
            )
        )
        return
    prov = p.provenance
    typer.echo(
        f"profile {p.name}: {p.device.get('name')} ({prov.get('system', '')}), backend {prov.get('backend')}"
        f"{_versions_text(prov.get('backend_versions'))}, built {prov.get('date')}"
    )
    typer.echo(f"method: {prov.get('method')}")
    typer.echo("held-out fit quality:")
    for fam, v in p.fit_quality.items():
        if isinstance(v, dict) and "overall" in v:
            o = v["overall"]
            typer.echo(f"  {fam:22s} median {o['median_rel_err']:.1%}  p95 {o['p95_rel_err']:.1%}  n={o['n']}")
    typer.echo(f"dtypes: weights {p.dtypes.get('weight')}, kv {p.dtypes.get('kv')}")
    typer.echo(f"models ({len(p.models)}): {', '.join(sorted(p.models))}")
    if p.kernels:
        sets = ", ".join(f"{b}: {', '.join(sorted(f))}" for b, f in sorted(p.kernels.items()))
        typer.echo(
            f"kernels: fitted families (curves of any shape derived at load) — {sets}; "
            f"all-reduce GPUs {sorted(p.allreduce, key=int)}"
        )
    else:
        typer.echo(
            f"curves: {len(p.gemm)} GEMM, {len(p.context_attention)} context, {len(p.generation_attention)} "
            f"generation, all-reduce GPUs {sorted(p.allreduce, key=int)}"
        )
    if p.moe:
        typer.echo(
            f"fused mixture-of-experts kernels (held-out 20 % of each table's rows; default {p.kernel_defaults.get('moe')}):"
        )
        for backend, fits in sorted(p.moe.items()):
            for dtype, f in sorted(fits.items()):
                typer.echo(
                    f"  {backend:7s} {dtype:10s} median {f['heldout_median']:.1%}  p90 {f['heldout_p90']:.1%}  "
                    f"n={f['rows']}  {f['kernel']}"
                )
    if p.mla:
        typer.echo(
            "multi-head latent attention kernels (held-out 20 % of each table's rows; "
            f"default {p.kernel_defaults.get('mla')}):"
        )
        for backend, kinds in sorted(p.mla.items()):
            for kind, fits in sorted(kinds.items()):
                for kv, f in sorted(fits.items()):
                    typer.echo(
                        f"  {backend:7s} {kind:10s} KV {kv:4s} median {f['heldout_median']:.1%}  "
                        f"p90 {f['heldout_p90']:.1%}  n={f['rows']}"
                    )
    for note in prov.get("notes", []):
        typer.echo(f"note: {note}")
    from calibration.curve_checks import report_lines

    for line in report_lines(p):
        typer.echo(line)
