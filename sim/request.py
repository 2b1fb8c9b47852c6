"""A request's life inside the simulator."""

from __future__ import annotations

COMPLETED = "completed"
REJECTED = "rejected"

#: Rejection reasons written to requests.parquet.
EXCEEDS_MAX_MODEL_LEN = "exceeds_max_model_len"
EXCEEDS_RESERVATION = "exceeds_reservation"
PROMPT_EXCEEDS_RESERVATION = "prompt_exceeds_reservation"
STALE = "stale"
#: Unchunked, the tokens it has to compute exceed what one iteration may hold
#: (``scheduler.max_num_batched_tokens`` with ``chunked_prefill: false``, TensorRT-LLM's default).
PROMPT_EXCEEDS_TOKEN_BUDGET = "prompt_exceeds_token_budget"
#: Nothing runs on its replica and it still cannot be admitted: its KV does not fit the memory
#: it may use even when empty (a static reservation smaller than its prompt,
#: or an allocator that cannot place it at all), so it would wait for ever.
CANNOT_FIT_EMPTY_REPLICA = "cannot_fit_empty_replica"


class Request:
    """Mutable per-request state; times in simulated seconds.

    ``computed`` tokens have K/V in the cache; the sequence is
    ``prompt + generated`` tokens long, so ``prompt + generated − computed``
    tokens are still to compute (1 while decoding, more in (re)prefill).
    """

    __slots__ = (
        "id",
        "prompt",
        "output",
        "arrival",
        "admitted",
        "first_token",
        "finish",
        "computed",
        "generated",
        "preemptions",
        "replica",
        "status",
        "reason",
        "truncated",
        "client",
        "seq_no",
        "swapped",
        "last_progress",
        "hashes",
        "priority",
    )

    def __init__(
        self, rid: int, prompt: int, output: int, arrival: float, client: int = -1, hashes=None, priority: int = 0
    ):
        self.id = rid
        self.prompt = prompt
        self.output = output
        self.arrival = arrival
        self.admitted = -1.0
        self.first_token = -1.0
        self.finish = -1.0
        self.computed = 0
        self.generated = 0
        self.preemptions = 0
        self.replica = -1
        self.status = ""
        self.reason = ""
        self.truncated = False
        self.client = client
        #: Order of (re)admission on its replica; the running list is sorted by it.
        self.seq_no = -1
        #: Preempted by swap: its ``computed`` tokens wait in host memory.
        self.swapped = False
        #: When it last advanced (arrival, or its preemption): hybrid_reserve drops stale ones.
        self.last_progress = arrival
        #: Prefix block ids of the prompt (prefix caching), or ``None``.
        self.hashes = hashes
        #: Larger = more important; ``lowest_priority`` preemption takes the smallest first.
        self.priority = priority

    @property
    def tokens(self) -> int:
        return self.prompt + self.generated

    def __repr__(self) -> str:
        return f"Request({self.id}, p={self.prompt}, o={self.output}, c={self.computed}, g={self.generated})"
