"""Refit a ``kvsim validate`` run's engine-overhead calibration offline, on the same replays.

A validation run measures the engine once (minutes of replays on a shared host); the choices in
the overhead fit (which decode iterations set ``a + b·S``, whether the decode iterations right
after a prefill get their measured excess, which rounds are pooled) can then be compared on
exactly those replays: each variant refits the run's ``overhead_rows.json``, rebuilds the profiles
from their kernel curves, re-runs the simulator on the run's traces and scores it against the
run's measured values (the median of its replays). The default variant reproduces the run's own
table. With ``engine.kernel_rounds: spread`` runs, each variant is also scored on the run's
up-front kernel route alone (``kernels upfront``: the rows re-priced against it), so pooled and
single-window kernel curves are compared on the same replays. With ``engine.overhead_mix: both``
runs, each is also scored on the ``offline`` and the ``queued`` overhead runs alone (``mix``).

    python -m calibration.validate.refit runs/validate-cpu [more run folders]
"""

from __future__ import annotations

import itertools
import sys
import tempfile
from pathlib import Path

from sim.catalog import get_model

#: fit variants (keyword arguments of ``kernels.fit_overhead``); the first is what validate uses
VARIANTS = {
    "steady": {"steady": True, "after_prefill": True},
    "steady-no-mixed-decode": {"steady": True, "after_prefill": True, "mixed_decode": False},
    "steady-line": {
        "steady": True,
        "after_prefill": True,
        "by_seqs": False,
        "mixed_decode": False,
    },  # no per-count departures
    "steady-median": {"steady": True, "after_prefill": True, "center": "median"},
    "steady-mean": {"steady": True, "after_prefill": True, "center": "mean"},
    "steady-no-after": {"steady": True, "after_prefill": False},
    "all-decode": {"steady": False, "after_prefill": False},
}
#: which overhead rounds are fitted: all of them, or the up-front passes only
ROUNDS = {"pooled": lambda r: True, "upfront": lambda r: r.get("round", 0) == 0}
#: which engine-overhead runs are fitted, by how they filled their batches (``engine.overhead_mix``;
#: rows from before the option are ``offline``): all of them, or one mix alone where the run has both
MIXES = {
    "all": lambda r: True,
    "offline": lambda r: r.get("mix", "offline") == "offline",
    "queued": lambda r: r.get("mix") == "queued",
}
#: whose kernel curves the overhead is fitted against and the simulator runs on: the run's final
#: profiles (pooled over its kernel rounds, where it had them) or its up-front route alone (runs with
#: ``engine.kernel_rounds: spread``; the rows are re-priced against those curves)
KERNELS = {"final": "profile-{a}.json", "upfront": "profile-{a}-upfront.json"}


def _json_file(path: str | Path):
    """A JSON file of a run folder, read bounded (size, UTF-8, nesting: sim/inputs.py)."""
    from sim.inputs import load_json, read_text

    return load_json(read_text(path, "refit", "JSON file"), "refit", str(path))


def kernel_profile(path: str | Path):
    """The kernel-route profile under a validation profile: its elementwise bandwidth as measured
    (``with_engine_overhead`` lowered it to carry the per-token overhead); the CPU term is replaced
    by whatever overhead fit comes next."""
    from sim.cost.profile import Profile

    doc = _json_file(path)
    ew = doc["elementwise"]
    if "kernel_route_bandwidth_bytes_per_s" in ew:
        ew["bandwidth_bytes_per_s"] = ew.pop("kernel_route_bandwidth_bytes_per_s")
        ew.pop("engine_per_token_s", None)
    return Profile.from_json(doc, str(path))


def refit(
    run: str | Path,
    variants: dict | None = None,
    rounds: dict | None = None,
    kernel_sets: dict | None = None,
    mixes: dict | None = None,
) -> list[dict]:
    """Every (kernels, rounds, mix, variant) scored on ``run``'s replays: ``{kernels, variant, rounds,
    mix, summary, cells}`` with ``summary`` as ``validation.json``'s (``validate.error_summary``) and
    ``cells`` the rows. A kernel set is used where the run has its files and its rows their shapes
    (``final`` always); a mix other than ``all`` where the run measured more than one."""
    from sim.engine.cluster import simulate

    from .. import kernels
    from .metrics import TARGET_METRICS, error_summary, rel_error, sim_metrics
    from .simulator import sim_scenario
    from .spec import load_spec

    run = Path(run)
    doc = _json_file(run / "validation.json")
    rows_path = run / "overhead_rows.json"
    if not rows_path.is_file():
        raise FileNotFoundError(f"{rows_path}: written by kvsim validate with the engine-overhead calibration on")
    ov_rows = _json_file(rows_path)
    spec = load_spec(doc["spec"])
    model = get_model(doc["shape"]["model"])
    device = doc["device"]["kind"]
    B = int(doc["config"]["kv"]["block_size"])
    fits0 = doc["profile"]["engine_overhead"]
    measured = {(r["load"], r["allocator"], r["metric"]): r["measured"] for r in doc["rows"]}
    cells = sorted({(r["load"], r["allocator"]) for r in doc["rows"]})
    out = []
    sets = {}
    for kname, pattern in (kernel_sets or KERNELS).items():
        files = {a: run / pattern.format(a=a) for a in ov_rows}
        if kname == "final":  # the rows are priced against these already
            if not all(f.is_file() for f in files.values()):  # a run written elsewhere: its recorded paths
                files = {a: Path(doc["profile"]["files"][a]) for a in ov_rows}
            sets[kname] = ({a: kernel_profile(f) for a, f in files.items()}, ov_rows)
        elif all(f.is_file() for f in files.values()) and all("chunks" in r for rows in ov_rows.values() for r in rows):
            profs = {a: kernel_profile(f) for a, f in files.items()}
            sets[kname] = (
                profs,
                {
                    a: kernels.repredict(rows, kernels.kernel_cost(profs[a], model, a, B), fits0[a]["clock"])
                    for a, rows in ov_rows.items()
                },
            )
    present = {r.get("mix", "offline") for rows in ov_rows.values() for r in rows}
    mixes = {k: f for k, f in (mixes or MIXES).items() if k == "all" or (len(present) > 1 and k in present)}
    with tempfile.TemporaryDirectory(prefix="kvsim-refit-") as tmp:  # the run's own files stay as they are
        for (kname, (profs, krows)), (rname, sel), (mname, msel), (vname, kw) in itertools.product(
            sets.items(), (rounds or ROUNDS).items(), mixes.items(), (variants or VARIANTS).items()
        ):
            paths = {}
            for alloc, rows in krows.items():
                fit = kernels.fit_overhead([r for r in rows if sel(r) and msel(r)], fits0[alloc]["clock"], **kw)
                fit.update({k: fits0[alloc][k] for k in ("allocator", "block_size", "dtype", "threads", "clock")})
                path = Path(tmp) / f"profile-{alloc}.json"
                kernels.with_engine_overhead(profs[alloc], fit, model).write(path)
                paths[alloc] = str(path)
            scored = []
            for load, alloc in cells:
                sc = sim_scenario(
                    spec, alloc, trace_path=str(run / f"trace-{load}-{alloc}.csv"), profile=paths[alloc], device=device
                )
                sm = sim_metrics(simulate(sc), B)
                for m in TARGET_METRICS:
                    meas = measured[(load, alloc, m)]
                    scored.append(
                        {
                            "load": load,
                            "allocator": alloc,
                            "metric": m,
                            "measured": meas,
                            "simulated": sm[m],
                            "rel_error": rel_error(meas, sm[m]),
                        }
                    )
            out.append(
                {
                    "kernels": kname,
                    "variant": vname,
                    "rounds": rname,
                    "mix": mname,
                    "summary": error_summary(scored),
                    "cells": scored,
                }
            )
    return out


def _not_a_run(run: Path) -> str | None:
    """Why ``run`` is not a folder refit can read (``None`` when it is)."""
    expected = "expected the --out folder of a kvsim validate run, with validation.json and overhead_rows.json"
    if not run.is_dir():
        return f"no such folder ({expected})"
    for name in ("validation.json", "overhead_rows.json"):
        if not (run / name).is_file():
            note = (
                " (kvsim validate writes it unless run with --no-engine-overhead)"
                if name == "overhead_rows.json"
                else ""
            )
            return f"no {name} there{note}; {expected}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    for run in args:
        problem = _not_a_run(Path(run))
        if problem:
            sys.stderr.write(f"error: {run}: {problem}\n")
            return 2
    for run in args:
        for r in refit(run):
            s = r["summary"]
            print(
                f"{run}  kernels {r['kernels']:<8} rounds {r['rounds']:<8} mix {r['mix']:<8} {r['variant']:<16} {s['within_10pct']:>2}/{s['cells']} within 10 %, "
                f"{s['within_5pct']:>2} within 5 %, median {s['median_rel_error']:.1%}, worst {s['max_rel_error']:.1%} "
                f"({s['worst']})",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
