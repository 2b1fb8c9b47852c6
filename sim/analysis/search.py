"""The goodput search: the highest arrival rate at which SLO attainment meets its target.

Both searches are pure functions of callbacks that simulate (``rate → attainment``), so they are
tested on synthetic curves. They return the same contract: ``status == "ok"`` means a **full**
simulation at ``goodput`` met the target and one at ``goodput × (1 + tol)`` did not.

* :func:`find_goodput` (``exhaustive``): double or halve from a start rate until the target is
  bracketed, bisect geometrically until hi ≤ lo·(1 + tol), verify lo·(1 + tol); every
  evaluation is a full run.
* :func:`find_goodput_guided` (``guided``, the planner's default): start at a rate the caller
  estimates (the cost model's saturation rate, or another seed's goodput) and step by (1 + tol),
  so that a good start settles in two runs; widen the step while the target is not bracketed;
  narrow a wide bracket at the crossing interpolated from the attainments seen. Runs stop as
  soon as their answer is decided (:mod:`sim.analysis.sequential`) while they only steer; the
  verification pair is always two complete runs (one re-run to the end if it was stopped).

:func:`interpolated_goodput` places the crossing inside the final bracket (linear in attainment
against log rate); the recommendation ranks candidates whose goodputs lie within the tolerance
of each other by it, since the bracket ends themselves are only known to the tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_TOL = 0.05
MAX_EVALS = 24
_BRACKET_STEPS = 12


@dataclass
class GoodputSearch:
    #: Highest rate found with attainment ≥ target (0 when none was found).
    goodput: float
    #: ``ok`` (bracketed and verified), ``infeasible`` (no rate down to start/2^12 passes),
    #: ``unbounded`` (start·2^12 still passes), ``budget`` (evaluations ran out; goodput is a lower bound).
    status: str
    #: rate → attainment of every full evaluation.
    probes: dict[float, float] = field(default_factory=dict)
    #: The verification pair: goodput × (1 + tol), and its attainment (< target when status is ok).
    next_rate: float | None = None
    next_attainment: float | None = None
    #: rate → (passes, estimated attainment) of every run stopped early (guided search only).
    quick: dict[float, tuple[bool, float]] = field(default_factory=dict)

    def estimate(self, target: float) -> float:
        """The crossing interpolated inside [goodput, next_rate] (the goodput when not verified)."""
        if self.status != "ok" or self.next_rate is None or self.next_attainment is None:
            return self.goodput
        a_lo = self.probes.get(self.goodput)
        if a_lo is None:
            return self.goodput
        return interpolated_goodput(self.goodput, a_lo, self.next_rate, self.next_attainment, target)


def interpolated_goodput(lo: float, a_lo: float, hi: float, a_hi: float, target: float) -> float:
    """Rate in [lo, hi) where attainment, linear in log rate between (lo, a_lo) and (hi, a_hi), meets ``target``."""
    if not a_lo > a_hi or hi <= lo:
        return lo
    f = min(max((a_lo - target) / (a_lo - a_hi), 0.0), 1.0)
    return math.exp(math.log(lo) + f * (math.log(hi) - math.log(lo))) if f < 1.0 else lo


def _logit(a: float) -> float:
    a = min(max(a, 1e-3), 1 - 1e-3)
    return math.log(a / (1 - a))


def find_goodput(
    evaluate: Callable[[float], float],
    start: float,
    target: float,
    tol: float = DEFAULT_TOL,
    max_evals: int = MAX_EVALS,
) -> GoodputSearch:
    """Bracket by doubling/halving from ``start``, then bisect (geometric mean) until
    hi ≤ lo·(1 + tol), then verify that lo·(1 + tol) misses the target."""
    probes: dict[float, float] = {}

    def passes(r: float) -> bool:
        if r not in probes:
            probes[r] = evaluate(r)
        return probes[r] >= target

    def budget() -> bool:
        return len(probes) >= max_evals

    lo: float | None = None
    hi: float | None = None
    if passes(start):
        lo = start
    else:
        hi = start
        r = start
        for _ in range(_BRACKET_STEPS):
            r /= 2
            if passes(r):
                lo = r
                break
            hi = r
        if lo is None:
            return GoodputSearch(0.0, "infeasible", probes)
    while not budget():
        if hi is None or hi <= lo:
            # Look for a failing rate above lo.
            r, hi = lo, None
            for _ in range(_BRACKET_STEPS):
                r *= 2
                if passes(r):
                    lo = r
                else:
                    hi = r
                    break
                if budget():
                    break
            if hi is None:
                return GoodputSearch(lo, "unbounded" if not budget() else "budget", probes)
            continue
        if hi <= lo * (1 + tol):
            check = lo * (1 + tol)
            if passes(check):
                lo = check  # non-monotone: a higher rate passes; keep searching above it
                continue
            return GoodputSearch(lo, "ok", probes, check, probes[check])
        mid = math.sqrt(lo * hi)
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return GoodputSearch(lo, "budget", probes)


@dataclass
class Evaluation:
    """One run's answer to the guided search."""

    passes: bool
    #: Attainment: exact when ``complete``, else an estimate from the requests that ended.
    attainment: float
    #: The pass/fail decision is exact (a complete run, or a run stopped when the rest could not change it).
    exact: bool
    complete: bool


#: Complete runs the guided search may add after its budget, to confirm a rate that quick runs passed.
_BUDGET_VERIFICATIONS = 3


def find_goodput_guided(
    evaluate: Callable[[float, bool], Evaluation],
    start: float,
    target: float,
    tol: float = DEFAULT_TOL,
    max_evals: int = MAX_EVALS,
) -> GoodputSearch:
    """The guided search (module docstring). ``evaluate(rate, complete)`` runs the scenario at
    ``rate``; with ``complete`` to the end (the verification pair: exact attainments on both sides
    of the target, which the interpolated edge is computed from). The first steps from ``start`` are
    ×(1 + tol), so a good start settles in two runs; each further step in the same direction
    squares the factor; a bracket wider than (1 + tol) is narrowed at the interpolated crossing."""
    s = GoodputSearch(0.0, "budget")
    seen: dict[float, Evaluation] = {}

    def ev(r: float, complete: bool = False) -> Evaluation:
        if r not in seen or (complete and not seen[r].complete):
            e = seen[r] = evaluate(r, complete)
            if e.complete:
                s.probes[r] = e.attainment
                s.quick.pop(r, None)
            else:
                s.quick[r] = (e.passes, e.attainment)
        return seen[r]

    lo: float | None = None
    hi: float | None = None
    lowest, highest = start / 2.0**_BRACKET_STEPS, start * 2.0**_BRACKET_STEPS
    grow = 1 + tol
    step, last_dir = grow, 0
    moved, last_side_moved = 0, 0
    r = start
    while len(seen) < max_evals:
        if lo is None or hi is None:
            direction = 0 if lo is None and hi is None else (1 if hi is None else -1)
            if direction and direction == last_dir:
                step *= step  # still not bracketed: widen
            last_dir = direction or last_dir
            if not direction:
                r = start
            elif direction > 0:
                assert lo is not None  # only the upper end is missing
                r = lo * step
            else:
                assert hi is not None  # only the lower end is missing
                r = hi / step
            if r < lowest:
                s.goodput, s.status = 0.0, "infeasible"
                return s
            if r > highest:
                s.goodput, s.status = lo or 0.0, "unbounded"
                return s
            e = ev(r)
            if e.passes:
                lo = r
            else:
                hi = r
            if not 0.0 < e.attainment < 1.0:
                step *= step  # all or nothing met: the edge is far, stride faster
            continue
        if hi <= lo:  # an exact re-run contradicted a quick decision: bracket again around it
            if seen[lo].passes:
                hi, step, last_dir = None, grow, 0
            else:
                lo, step, last_dir = None, grow, 0
            continue
        if hi <= lo * grow * (1 + 1e-9):
            if not seen[lo].complete and not ev(lo, True).passes:
                hi, lo, step, last_dir = lo, None, grow, 0
                continue
            v = lo * grow
            e = ev(v, True)
            if not e.passes:
                s.goodput, s.status, s.next_rate = lo, "ok", v
                s.next_attainment = e.attainment
                return s
            lo = v  # a higher rate passes: keep searching above it
            if hi <= v:
                hi, step, last_dir = None, grow, 0
            continue
        # A bracket wider than the tolerance: a run just below the interpolated crossing, so that
        # it and the next one up by (1 + tol) are likely the verification pair. Interpolation
        # creeps when the curve is curved (the same end keeps moving): then bisect instead.
        a_lo, a_hi = seen[lo].attainment, seen[hi].attainment
        span = math.log(hi / lo)
        # Interpolate only between informative ends: an attainment of 1 or 0 says little about where
        # the curve crosses the target.
        if last_side_moved == 1 and moved == 1 and lo * grow < hi:
            c = lo * grow  # the run above the last pass: it completes the verification pair if it misses
        elif a_lo > a_hi and moved < 2 and a_lo < 1.0 and a_hi > 0.0:
            # In logit(attainment): curves flatten towards 1 below the edge and fall steeply above it.
            guess = interpolated_goodput(lo, _logit(a_lo), hi, _logit(a_hi), _logit(target))
            c = min(max(guess / math.sqrt(grow), lo * math.exp(0.1 * span)), max(hi / grow, lo * math.exp(0.5 * span)))
        else:
            c = math.sqrt(lo * hi)
        e = ev(c)
        side = 1 if e.passes else -1
        moved = moved + 1 if side == last_side_moved else 1
        last_side_moved = side
        if e.passes:
            lo = c
        else:
            hi = c
    passing = [r for r, e in seen.items() if e.passes and e.exact]
    if not passing:
        # Every pass so far came from a run stopped early (a steep edge keeps the sequential test
        # undecided): complete the highest of them below every exact miss, or a goodput of 0 would
        # read as "no rate meets the SLO" while lower rates were seen to pass.
        misses = [r for r, e in seen.items() if e.exact and not e.passes]
        below = min(misses, default=math.inf)
        quick = sorted((r for r, e in seen.items() if e.passes and r < below), reverse=True)
        for r in quick[:_BUDGET_VERIFICATIONS]:
            if ev(r, True).passes:
                passing = [r]
                break
    s.goodput, s.status = (max(passing) if passing else 0.0), "budget"
    return s


def fewest_replicas(
    passes: Callable[[int], bool], start: int, limit: int = 4096, lowest: int = 1
) -> tuple[int | None, dict[int, bool]]:
    """Smallest n ≥ ``lowest`` with ``passes(n)``, searching from ``start`` and assuming ``passes``
    is monotone; ``None`` when even ``limit`` fails. Down: ``start − 1`` first, then halving, then
    bisection; up: doubling, then bisection."""
    seen: dict[int, bool] = {}

    def ok(n: int) -> bool:
        if n not in seen:
            seen[n] = passes(n)
        return seen[n]

    n = max(lowest, min(start, limit))
    if ok(n):
        # start − 1 first: a good start settles in two runs. Past it the start overshoots (one
        # replica's goodput understates what pooled replicas serve: 2.7× for static on qwen3-32b), and
        # stepping down by one would cost a run per replica, each over n replicas' requests.
        good, bad = n, n - 1
        if n > lowest and ok(n - 1):
            good, bad = n - 1, lowest - 1
            while good > lowest:
                cand = max(good // 2, lowest)
                if ok(cand):
                    good = cand
                else:
                    bad = cand
                    break
    else:
        bad = n
        while True:
            if bad >= limit:
                return None, seen
            cand = min(bad * 2, limit)
            if ok(cand):
                good = cand
                break
            bad = cand
    while good - bad > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good, seen
