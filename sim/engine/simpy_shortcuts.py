"""The only place kvsim reaches into SimPy's internals, and why.

The engine runs once per batch change of every replica, so SimPy's per-call overheads show.
Three things are done here without SimPy's public API; every other module calls these
functions. They rely on attributes of ``simpy.Environment`` and ``simpy.Process`` that SimPy
does not document (checked against SimPy 4.1): a SimPy that renamed them would fail the engine
tests at once, not drift silently.

* :func:`now` reads ``env._now``. ``Environment.now`` is a property: one Python call per read,
  about ten reads per request.
* :func:`retarget` moves a waiting process onto another event: what ``Process.interrupt`` does
  inside SimPy, minus the Interruption event and the exception thrown into the generator (which
  would then have to wait for the rest of the iteration itself). The engine uses it to end a
  fast-forwarded decode window at the end of the iteration in progress when a request arrives
  that could join the batch. The abandoned event still fires, with no one waiting on it.
* :func:`events_scheduled` reads SimPy's event counter (``env._eid``), which has no public
  reader; ``summary.json`` reports it as ``sim_events``.

Measured with ``python -m bench.simpy_shortcuts --compiled --repeat 7`` (SimPy 4.1.2, Python 3.11, the
shared 2-core development machine under load, best of 7 runs; "compiled" = a module built with
mypyc, as ``kvsim native build`` builds this one and its callers):

===============================  =================================  ======================
per operation                    public API                         shortcut
===============================  =================================  ======================
read the clock, compiled         113 ns (``env.now``)               25 ns (``now(env)``)
read the clock, interpreted      83 ns (``env.now``)                56 ns (``now(env)``)
cut a window short               9.3 µs (``Process.interrupt``)     3.8 µs (``retarget``)
===============================  =================================  ======================

Compiled, ``now(env)`` is even cheaper than ``env._now`` written inline (59 ns): SimPy types the
clock ``int | float``, so an inline read stays a boxed Python object, while ``now`` returns a C
double. Interpreted, the call costs more than an inline ``env._now`` (18 ns); that engine is the
readable reference, not the fast one. A run of ``bench-1m`` reads the clock about 8 times and
cuts 0.34 windows per request (``bench-saturated``: 12 and 0.01), so on the compiled engine the
shortcuts save about 0.7 µs + 1.9 µs per request there.
"""

from __future__ import annotations

import simpy


def now(env: simpy.Environment) -> float:
    """Simulated seconds now (``env.now`` without the property call)."""
    return env._now


def retarget(proc: simpy.Process, event: simpy.Event) -> None:
    """Make ``proc``, which is waiting on an event, wait on ``event`` instead; it resumes when
    ``event`` fires, with its value, as if it had yielded it."""
    proc._target.callbacks.remove(proc._resume)
    event.callbacks.append(proc._resume)
    proc._target = event


def events_scheduled(env: simpy.Environment) -> int:
    """Events scheduled so far in ``env`` (read once, after the run: it advances the counter)."""
    return next(env._eid)
