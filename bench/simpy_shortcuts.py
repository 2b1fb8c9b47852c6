"""What the SimPy shortcuts of ``sim/engine/simpy_shortcuts.py`` save, against SimPy's public API.

    python -m bench.simpy_shortcuts [--compiled] [--repeat N]

* reading the clock: ``env.now`` (a property: a Python call per read) against ``env._now`` (an
  attribute), in nanoseconds per read, interpreted and (``--compiled``: a small module built with
  mypyc in a temporary folder, as ``kvsim native build`` builds the engine) compiled;
* cutting a decode window short when a request arrives: ``Process.interrupt`` (an Interruption
  event, the exception thrown into the generator, which then waits for the end of the iteration
  in progress) against moving the process's wait to a new timeout (``retarget``), in
  microseconds per cut, the scheduling of the cut itself subtracted.

Each figure is the best of ``--repeat`` runs (default 5): the machine is shared, and the
minimum is the least disturbed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
import timeit
from pathlib import Path

import simpy

from sim.engine.simpy_shortcuts import now, retarget

READS = 1_000_000
CUTS = 100_000


def clock_ns(repeat: int) -> dict[str, float]:
    env = simpy.Environment()
    env.run(until=1.5)
    out = {}
    for label, stmt in (
        ("env.now (property)", "env.now"),
        ("env._now (attribute)", "env._now"),
        ("now(env) (the helper)", "now(env)"),
    ):
        t = min(timeit.repeat(stmt, globals={"env": env, "now": now}, number=READS, repeat=repeat))
        out[label] = 1e9 * t / READS
    return out


def _cuts(n: int, mode: str) -> float:
    """Seconds for ``n`` cuts of a waiting process (``mode``: interrupt | retarget | none)."""
    env = simpy.Environment()

    def worker():
        while True:
            try:
                yield env.timeout(10.0)  # a decode window
            except simpy.Interrupt:
                yield env.timeout(0.25)  # the rest of the iteration in progress

    proc = env.process(worker())
    left = [n]

    def cut(_event=None):
        if mode == "interrupt":
            proc.interrupt()
        elif mode == "retarget":
            retarget(proc, env.timeout(0.25))
        left[0] -= 1
        if left[0] > 0:
            env.timeout(1.0).callbacks.append(cut)

    env.timeout(0.5).callbacks.append(cut)
    t0 = time.perf_counter()
    env.run(until=n + 1.0)
    return time.perf_counter() - t0


def cut_us(repeat: int) -> dict[str, float]:
    base = min(_cuts(CUTS, "none") for _ in range(repeat))
    out = {
        label: 1e6 * (min(_cuts(CUTS, mode) for _ in range(repeat)) - base) / CUTS
        for label, mode in (("Process.interrupt", "interrupt"), ("retarget", "retarget"))
    }
    out["(scheduling the cut, subtracted)"] = 1e6 * base / CUTS
    return out


_COMPILED = textwrap.dedent("""
    import simpy

    def read_property(env: simpy.Environment, n: int) -> float:
        s = 0.0
        for _ in range(n):
            s += env.now
        return s

    def read_attribute(env: simpy.Environment, n: int) -> float:
        s = 0.0
        for _ in range(n):
            s += env._now
        return s

    def clock(env: simpy.Environment) -> float:
        return env._now

    def read_helper(env: simpy.Environment, n: int) -> float:
        s = 0.0
        for _ in range(n):
            s += clock(env)
        return s

    def empty(env: simpy.Environment, n: int) -> float:
        s = 0.0
        for _ in range(n):
            s += 1.5
        return s
""")


def compiled_clock_ns(repeat: int) -> dict[str, float]:
    """The same reads from mypyc-compiled code (the loop's own cost subtracted)."""
    with tempfile.TemporaryDirectory(prefix="kvsim-shortcuts-") as tmp:
        Path(tmp, "clockbench.py").write_text(_COMPILED)
        subprocess.run([sys.executable, "-m", "mypyc", "clockbench.py"], cwd=tmp, check=True, capture_output=True)
        sys.path.insert(0, tmp)
        try:
            import clockbench as cb  # type: ignore[import-not-found]
        finally:
            sys.path.remove(tmp)
        assert cb.__file__.endswith(".so"), cb.__file__
        env = simpy.Environment()
        env.run(until=1.5)

        n = 10 * READS

        def best(fn) -> float:
            return min(timeit.repeat(lambda: fn(env, n), number=1, repeat=repeat))

        loop = best(cb.empty)
        return {
            "env.now (property)": 1e9 * (best(cb.read_property) - loop) / n,
            "env._now (attribute)": 1e9 * (best(cb.read_attribute) - loop) / n,
            "clock(env) (compiled helper)": 1e9 * (best(cb.read_helper) - loop) / n,
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.simpy_shortcuts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--compiled", action="store_true", help="also time the clock reads from mypyc-compiled code")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    out = {"simpy": simpy.__version__, "clock_ns_interpreted": clock_ns(args.repeat), "cut_us": cut_us(args.repeat)}
    if args.compiled:
        out["clock_ns_compiled"] = compiled_clock_ns(args.repeat)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
