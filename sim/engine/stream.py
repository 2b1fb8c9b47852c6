"""The server process that streams output tokens to clients, one token at a time.

A serving engine hands every iteration's new tokens to one front-end process (vLLM's API server,
SGLang's tokenizer manager, ``trtllm-serve``) that detokenises them and writes them to their
clients' streams. That process works through the tokens in order, ``per_token_s`` seconds each:
while the engine emits tokens more slowly than that, each batch goes out as soon as it is made;
once it emits them faster, they queue there. A client sees a token when the process has sent it,
so the queue adds to TTFT and to the end of a request (and, in a closed loop, delays the client's
next request). The engine's pace is its own; the TPOT a client measures moves only as the queue
grows or drains during its request. The ceiling, ``1 / per_token_s`` output tokens per second,
does not depend on the GPUs behind it.
"""

from __future__ import annotations


class OutputStream:
    """One server's token-streaming process (times in seconds of simulated time)."""

    __slots__ = ("per_token_s", "free_at")

    def __init__(self, per_token_s: float) -> None:
        #: Seconds the process spends on one output token.
        self.per_token_s = per_token_s
        #: When the process has sent every token handed to it so far.
        self.free_at = 0.0

    def deliver(self, now: float, k: int) -> float:
        """``k`` tokens made by an iteration that ended at ``now``: when their clients see them
        (the mean over the batch, which the process sends in one go once it is free)."""
        start = self.free_at if self.free_at > now else now
        self.free_at = start + k * self.per_token_s
        return start + 0.5 * (k + 1) * self.per_token_s

    def deliver_window(self, t0: float, ends: list[float], m: int, k: int) -> float:
        """The first ``m`` iterations of a window that started at ``t0`` (``ends``: their end
        offsets), ``k`` tokens each: when the last iteration's tokens reach their clients."""
        work = k * self.per_token_s
        free = self.free_at
        start = free
        for i in range(m):
            e = t0 + ends[i]
            start = free if free > e else e
            free = start + work
        self.free_at = free
        return start + 0.5 * (k + 1) * self.per_token_s
