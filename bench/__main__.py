"""``python -m bench <name> [--quick] [--out DIR]`` (``hostile`` also ``[--classes 2,5]``) — see ``bench/__init__.py``."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from .common import console, machine, warn_debug, write_json

NAMES = [
    "ff-vs-step",
    "scale",
    "saturated",
    "profile",
    "costmodel",
    "opcount",
    "host-modes",
    "decode-spread",
    "attention",
    "hostile",
    "planner",
]
#: Not run by ``all``: compiling the flex kernels on a CPU takes minutes (docs/calibration.md); the hostile
#: corpus is a correctness check, not a speed measurement; the planner comparison plans every scenario
#: twice (docs/sweeps.md).
NOT_IN_ALL = {"attention", "hostile", "planner"}
#: ``--quick``'s help, measured: the benchmarks of ``all`` 2-28 s each and hostile 22 s with
#: ``KVSIM_NATIVE=0`` on the shared 2-core development machine at load 2-7; attention 96 s compiling its
#: flex kernels with an empty inductor cache (docs/calibration.md); planner 71 s of plans compiled on
#: the idle machine (docs/sweeps.md), 6 min 12 s with ``KVSIM_NATIVE=0`` at load 1-5.
QUICK_HELP = (
    "small variants: those of 'all' and hostile under a minute each; attention about 1.5 min on a CPU "
    "(compiling flex kernels); planner --quick about 1.5 min compiled on an idle 2-core machine, 6 min or "
    "more interpreted or loaded (a line per finished candidate on stderr)"
)
#: These look inside the engine's Python (bytecodes, cProfile), which compiled code hides: they
#: measure the interpreted engine (``KVSIM_NATIVE=0``, see sim/native.py), in a child if need be.
INTERPRETED = {"profile", "opcount"}


def _module(name: str):
    if name == "ff-vs-step":
        from . import ff_vs_step as m
    elif name == "scale":
        from . import scale as m
    elif name == "saturated":
        from . import saturated as m
    elif name == "profile":
        from . import profiling as m
    elif name == "opcount":
        from . import opcount as m
    elif name == "host-modes":
        from . import host_modes as m
    elif name == "decode-spread":
        from . import decode_spread as m
    elif name == "attention":
        from . import attention_backends as m
    elif name == "hostile":
        from . import hostile as m
    elif name == "planner":
        from . import planner as m
    else:
        from . import costmodel as m
    return m


def _classes(text: str):
    from .hostile import parse_classes

    return parse_classes(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument(
        "name",
        choices=NAMES + ["all"],
        help=f"benchmark to run ('all': every one but {', '.join(sorted(NOT_IN_ALL))}, in this order)",
    )
    ap.add_argument("--quick", action="store_true", help=QUICK_HELP)
    ap.add_argument(
        "--classes",
        type=_classes,
        default=None,
        help="hostile only: comma-separated class numbers, 1 to 9 (default: all)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("runs/bench"),
        help="folder for <name>.json (default runs/bench; hostile: hostile-quick.json with --quick, "
        "-classes-2-5 added with --classes 2,5)",
    )
    args = ap.parse_args(argv)
    if args.classes is not None and args.name != "hostile":
        ap.error(f"argument --classes: only for hostile, not {args.name}")
    names = [n for n in NAMES if n not in NOT_IN_ALL] if args.name == "all" else [args.name]
    if args.name in INTERPRETED:
        os.environ["KVSIM_NATIVE"] = "0"  # before anything imports sim
    warn_debug()
    info = machine()
    console.print(
        f"[dim]load average {info['load_avg_start']} on {info['cpus']} CPUs; python {info['python']}, "
        f"numpy {info['numpy']}, simpy {info['simpy']}; compiled hot path: {info['native']}[/]"
    )
    for name in names:
        if name in INTERPRETED and info["native"] != "off":
            flags = ["--quick"] if args.quick else []
            subprocess.run(
                [sys.executable, "-m", "bench", name, *flags, "--out", str(args.out)],
                env=dict(os.environ, KVSIM_NATIVE="0"),
                check=True,
            )
            continue
        if name == "hostile":
            from .hostile import result_name, run

            data = run(args.quick, args.out, args.classes)
            stem = result_name(args.quick, args.classes)  # as python -m bench.hostile names it
        else:
            data = _module(name).run(args.quick, args.out)
            stem = name
        data["machine"] = info
        path = write_json(args.out, stem, data)
        console.print(f"[dim]wrote {path}[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
