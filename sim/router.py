"""Which replica gets an arriving request."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .replica import Replica


class Router:
    """``round_robin`` cycles; ``least_outstanding`` picks the fewest running + waiting (lowest index on ties)."""

    def __init__(self, policy: str, replicas: list["Replica"]):
        self.policy = policy
        self.replicas = replicas
        self._next = 0

    def pick(self) -> "Replica":
        reps = self.replicas
        if len(reps) == 1:
            return reps[0]
        if self.policy == "round_robin":
            r = reps[self._next]
            self._next = (self._next + 1) % len(reps)
            return r
        return min(reps, key=lambda r: r.outstanding())
