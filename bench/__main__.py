"""``python -m bench <name> [--quick] [--out DIR]`` — see ``bench/__init__.py``."""

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument(
        "name",
        choices=NAMES + ["all"],
        help=f"benchmark to run ('all': every one but {', '.join(sorted(NOT_IN_ALL))}, in this order)",
    )
    ap.add_argument("--quick", action="store_true", help="small variants (each under a minute)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench"), help="folder for <name>.json (default runs/bench)")
    args = ap.parse_args(argv)
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
        data = _module(name).run(args.quick, args.out)
        data["machine"] = info
        path = write_json(args.out, name, data)
        console.print(f"[dim]wrote {path}[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
