"""Benchmarks of the simulator itself: ``python -m bench <name> [--quick] [--out DIR]``.

* ``ff-vs-step``: fast-forward against per-iteration stepping on the same scenarios (wall time,
  SimPy events, windows/iterations, largest relative metric difference);
* ``scale``: 10k / 100k / 1M requests of ``bench-1m``, each in a subprocess (wall, requests/s,
  peak RSS, cost per request), then the compiled hot path against the plain sources side by side;
* ``saturated``: ``bench-saturated`` (the Vidur comparison workload) wall time, preemptions,
  TTFT/TPOT percentiles;
* ``profile``: cProfile top entries of a run, to choose the next optimisation from data;
* ``costmodel``: per-call time of the calibrated cost model against the roofline prior on the
  batch shapes a run actually prices;
* ``opcount``: Python bytecodes and calls per request (``sys.settrace``), per function: the same
  count on every run, so small engine changes can be compared on a host whose speed drifts.
* ``host-modes``: how the host's speed changes move each kind of reference-engine iteration against
  the ``cpu_norm`` probe;
* ``decode-spread``: the reference engine's paged decode kernel per KV token at one length and at
  spread lengths, in three layouts (does it cost what the cost model prices?).
* ``hostile``: 749 hostile and careless inputs in nine classes (bombs, hangs, non-finite numbers,
  profiles, I/O, coercion, conservation, interrupts, security), each judged handled or not
  (``--quick``: the fixed corpus CI runs, written to ``hostile-quick.json``; ``--classes 2,5``: those
  classes only, ``hostile-classes-2-5.json``; not part of ``all``); see ``bench/hostile.py``.
* ``attention``: paged vs contiguous decode attention at several block sizes on every attention
  backend that runs on this device (sdpa, flex; flashinfer and vllm on CUDA when installed), side by side
  (docs/calibration.md, "Attention kernel backends"; not part of ``all``: compiling flex on a CPU takes
  minutes).
* ``planner``: the planner's guided goodput search against the exhaustive one on every plannable
  built-in scenario (same recommendation, goodputs within the tolerance; wall and CPU seconds,
  simulations; ``--quick``: four scenarios, medians of three, the table in docs/sweeps.md, about
  1.5 minutes compiled and 6 interpreted on 2 cores, a line on stderr per finished candidate; not
  part of ``all``: it plans every scenario twice).

Two helpers run on their own: ``python -m bench.identity`` fingerprints every built-in
scenario's results (to show a change left them byte-identical), and ``python -m
bench.simpy_shortcuts`` times the SimPy shortcuts of ``sim/engine/simpy_shortcuts.py`` against
SimPy's public API.

``profile`` and ``opcount`` look inside the Python, so they measure the interpreted engine
(``KVSIM_NATIVE=0``); the others run whichever engine ``import sim`` finds (``kvsim native status``).

Each prints a rich table and writes ``<out>/<name>.json`` (``hostile``: see above) with the
machine's load average, since wall times on a shared machine are only comparable side by side. See
docs/performance.md.
"""
