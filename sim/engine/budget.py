"""Resource budgets of one run: requests, simulated events and wall-clock seconds.

``kvsim run`` has none by default (``--max-requests``, ``--max-events`` and ``--max-wall-s`` set
them); the explorer runs every scenario under :data:`EXPLORER_BUDGET`, so a page cannot be made to
hang or to hold a server core for minutes. The request count is checked before anything is drawn
(from ``num_requests``, or rate × duration) and again, exactly, before the event loop starts;
events and wall time while it runs, by stepping the SimPy
environment instead of ``env.run()`` — one counter and one comparison per event, and a clock read
every :data:`CHECK_EVERY` events, only when a budget is given. Exceeding a budget raises
:class:`BudgetExceeded` (a :class:`~sim.errors.ConfigError`: one line, exit 2 in the CLI).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import simpy
from simpy.core import EmptySchedule

from sim.errors import ConfigError

if TYPE_CHECKING:
    from sim.config import Scenario
    from sim.workload.generator import Workload

#: Events between two reads of the wall clock.
CHECK_EVERY = 4096


class BudgetExceeded(ConfigError):
    """A run passed one of its budgets (names which, and the limit)."""


@dataclass(frozen=True)
class RunBudget:
    """Limits of one run; ``None`` = unlimited."""

    max_requests: int | None = None
    max_events: int | None = None
    max_wall_s: float | None = None
    #: Says where the budget comes from, in the error (e.g. ``explorer``, ``--max-events``).
    source: str = "budget"

    def check_requests(self, n: int) -> None:
        if self.max_requests is not None and n > self.max_requests:
            raise BudgetExceeded(
                f"{self.source}: requests",
                n,
                f"at most {self.max_requests} requests per run (lower workload.num_requests or workload.duration_s)",
            )

    def check_scenario(self, sc: Scenario) -> None:
        """Before anything is drawn: the request count the scenario states (or implies)."""
        from sim.workload.generator import request_bound

        n = request_bound(sc)
        if n is not None:
            self.check_requests(n)

    def check_workload(self, wl: Workload) -> None:
        """After the draw, before the event loop: the exact count of an open-loop workload (a closed
        loop's lengths are a pool; its requests are bounded by events and wall time)."""
        if wl.arrival_s is not None:
            self.check_requests(len(wl))


def budget_from_options(max_requests: int | None, max_events: int | None, max_wall_s: float | None) -> RunBudget | None:
    """The budget of ``kvsim run --max-requests/--max-events/--max-wall-s`` (``None`` when none is given)."""
    import math

    for name, v in (("--max-requests", max_requests), ("--max-events", max_events), ("--max-wall-s", max_wall_s)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ConfigError(name, v, "a positive finite number")
    if max_requests is None and max_events is None and max_wall_s is None:
        return None
    return RunBudget(max_requests, max_events, max_wall_s, source="--max-* budget")


#: The explorer's budget: a run of the page answers within a minute. The engine handles about
#: 50,000-75,000 events per CPU second; the largest built-in scenario the page offers
#: (bench-saturated, 10,000 requests) has 35,000.
EXPLORER_BUDGET = RunBudget(max_requests=200_000, max_events=2_000_000, max_wall_s=60.0, source="explorer budget")


def run_within(env: simpy.Environment, budget: RunBudget, started: float, until: simpy.Event | None = None) -> None:
    """``env.run()`` until the schedule is empty (or ``until`` has been triggered), or
    :class:`BudgetExceeded` when ``budget``'s event count or wall time (from ``started``, a
    ``time.perf_counter()``) runs out."""
    step = env.step
    max_events = budget.max_events
    limit = max_events if max_events is not None else float("inf")
    deadline = None if budget.max_wall_s is None else started + budget.max_wall_s
    events = 0
    next_check = CHECK_EVERY
    try:
        while True:
            step()
            events += 1
            if until is not None and until.triggered:
                return
            if events > limit:
                raise BudgetExceeded(
                    f"{budget.source}: simulated events",
                    f"more than {max_events}",
                    f"at most {max_events} events per run (fewer requests, or the fast_forward engine)",
                )
            if events >= next_check:
                next_check += CHECK_EVERY
                if deadline is not None and time.perf_counter() > deadline:
                    raise BudgetExceeded(
                        f"{budget.source}: wall time",
                        f"more than {budget.max_wall_s:g} s",
                        f"at most {budget.max_wall_s:g} s per run (fewer requests)",
                    )
    except EmptySchedule:
        return
