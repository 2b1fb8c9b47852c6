"""What the reference engine records: a request's times and tokens, and a run's requests and iterations."""

from __future__ import annotations

from dataclasses import dataclass, field


class EngineRequest:
    __slots__ = (
        "id",
        "prompt",
        "output",
        "arrival",
        "tokens",
        "computed",
        "generated",
        "admitted",
        "first_token",
        "finish",
        "preemptions",
        "enqueued",
        "status",
        "seq_no",
    )

    def __init__(self, rid: int, arrival: float, prompt_ids: list[int], output: int):
        self.id, self.arrival, self.output = rid, float(arrival), int(output)
        self.prompt = len(prompt_ids)
        self.tokens = list(prompt_ids)
        self.computed = self.generated = self.preemptions = 0
        self.admitted = self.first_token = self.finish = self.enqueued = -1.0
        self.status = ""
        self.seq_no = -1


@dataclass
class EngineResult:
    requests: list[dict]
    iterations: list[dict]
    config: dict
    info: dict = field(default_factory=dict)

    def peak_blocks(self) -> float:
        return max((it["blocks_in_use"] for it in self.iterations), default=0)

    def preemptions(self) -> int:
        return sum(it["preempted"] for it in self.iterations)
