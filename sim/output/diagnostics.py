"""Warnings drawn from a finished run's ``summary.json``: the run finished, but not the way its
owner probably meant it to.

Each rule reads only summary fields (older summaries lacking one give no warning), so a sweep's
rows, the explorer's runs and ``kvsim report`` can apply the same rule to any stored run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.config import Scenario

#: Heavy preemption: more preemptions than completed requests (the average finished request was
#: evicted more than once) ...
PREEMPTIONS_PER_COMPLETED = 1.0
#: ... or more prefill tokens recomputed than the prompt tokens the run served (over half of all
#: prefill work thrown away and redone). Either is a break-even point: past it the server spends
#: more on undoing admissions than the admissions gain. A saturated offline batch (batch-offline:
#: 0.56 preemptions per request, recompute 0.57 of the prompt tokens) stays below both; a run that
#: thrashes (a prompt near the KV capacity) is two orders of magnitude above.
RECOMPUTED_PER_SERVED_PROMPT = 1.0
#: A token budget at or below this (tokens per iteration) is not suggested smaller: chunks that
#: small already cost more in iterations than they save in KV.
MIN_SUGGESTED_BUDGET = 512


@dataclass(frozen=True)
class PreemptionLoad:
    """A run's preemption figures, from its summary."""

    preemptions: int
    completed: int
    #: Prefill tokens computed again after a recompute preemption (prompt + generated tokens).
    recomputed_tokens: int
    #: Prompt tokens of the completed requests.
    served_prompt_tokens: int
    #: KV capacity per replica in tokens (``kv_capacity_bytes_per_replica / kv_bytes_per_token``);
    #: ``None`` when the summary lacks either.
    capacity_tokens: int | None

    @property
    def per_completed(self) -> float:
        """Preemptions per completed request (``inf`` with preemptions and none completed)."""
        if self.completed:
            return self.preemptions / self.completed
        return float("inf") if self.preemptions else 0.0

    @property
    def recomputed_share(self) -> float:
        """Share of all prefill work (served prompt tokens + recomputed tokens) that was recomputed, 0–1."""
        total = self.recomputed_tokens + self.served_prompt_tokens
        return self.recomputed_tokens / total if total else 0.0

    @property
    def heavy(self) -> bool:
        """Whether either threshold is passed (strictly)."""
        return (
            self.preemptions > PREEMPTIONS_PER_COMPLETED * self.completed
            or self.recomputed_tokens > RECOMPUTED_PER_SERVED_PROMPT * self.served_prompt_tokens
        )


def served_prompt_tokens(summary: dict) -> int:
    """Prompt tokens of the completed requests, from the throughputs: (prompt + output tokens/s −
    output tokens/s) × makespan seconds, rounded (summary.json has no count of its own)."""
    makespan = summary.get("makespan_s") or 0.0
    both = summary.get("throughput_tokens_per_s") or 0.0
    out = summary.get("output_tokens_per_s") or 0.0
    return max(round((both - out) * makespan), 0)


def preemption_load(summary: dict) -> PreemptionLoad | None:
    """The preemption figures of ``summary``; ``None`` when it lacks the fields."""
    try:
        preemptions = int(summary["preemptions"])
        completed = int(summary["completed"])
    except (KeyError, TypeError, ValueError):
        return None
    cap_bytes = summary.get("kv_capacity_bytes_per_replica")
    bpt = summary.get("kv_bytes_per_token")
    return PreemptionLoad(
        preemptions=preemptions,
        completed=completed,
        recomputed_tokens=int(summary.get("recomputed_tokens") or 0),
        served_prompt_tokens=served_prompt_tokens(summary),
        capacity_tokens=int(cap_bytes // bpt) if cap_bytes and bpt else None,
    )


def heavy_preemption(summary: dict) -> bool:
    """Whether ``summary``'s run preempted heavily (:data:`PREEMPTIONS_PER_COMPLETED`,
    :data:`RECOMPUTED_PER_SERVED_PROMPT`)."""
    load = preemption_load(summary)
    return load is not None and load.heavy


def preemption_warning(
    summary: dict, longest_prompt_tokens: int | None = None, scenario: Scenario | None = None
) -> str | None:
    """One line (no ``warning:`` prefix) saying the run preempted heavily, why it likely did and what
    to change, or ``None`` when it did not. ``longest_prompt_tokens``: the longest prompt among the
    completed requests (tokens), for the cause; ``scenario``: the run's as it ran (the serving
    engine's defaults filled in: ``with_engine_defaults``), for the current knob values."""
    load = preemption_load(summary)
    if load is None or not load.heavy:
        return None
    per = f"{load.per_completed:.1f}" if load.completed else "no request completed"
    text = (
        f"heavy preemption: {load.preemptions:,} preemptions for {load.completed:,} completed requests "
        f"({per} per request); {load.recomputed_tokens:,} prefill tokens recomputed, "
        f"{load.recomputed_share:.1%} of all prefill work ({load.served_prompt_tokens:,} prompt tokens served)"
    )
    cap = load.capacity_tokens
    fallback = _fallback_region(scenario, cap)
    region = None if fallback is None else fallback[0]
    if longest_prompt_tokens and cap:
        # A static arena with a paged fallback holds what outgrows its reservation in the fallback
        # region alone: that region, not the whole capacity, is what the longest prompt competes for.
        room = cap if region is None else region
        where = (
            f"the KV capacity ({cap:,} tokens per replica)"
            if fallback is None
            else f"the fallback region that holds requests beyond their reservation ({region:,} tokens: "
            f"allocator.fallback_fraction {fallback[1]:g} of {cap:,})"
        )
        fit = room // longest_prompt_tokens
        text += (
            f". Likely cause: the longest prompt ({longest_prompt_tokens:,} tokens) is "
            f"{longest_prompt_tokens / room:.0%} of {where}, "
            f"room for {fit} such prompt{'' if fit == 1 else 's'} at a time"
        )
        if fit < 2:
            # vLLM v1 allocates KV chunk by chunk and preempts the newest running request when one
            # cannot grow: a request admitted beside a long one is evicted by its own next chunk.
            text += ": each request admitted beside it is preempted when its next prefill chunk does not fit"
    elif cap:
        text += f". The running requests' KV outgrows the capacity ({cap:,} tokens per replica)"
    # Fewer sequences beside a long prompt help where they share its memory, not the reservations'.
    longest = longest_prompt_tokens if fallback is None else None
    return text + ". Remedies: " + ", ".join(_remedies(scenario, longest, cap))


def _fallback_region(sc: Scenario | None, cap: int | None) -> tuple[int, float] | None:
    """Tokens of a static allocator's paged fallback region (``overflow: fallback``) and its share of
    the capacity, else ``None``."""
    if sc is None or cap is None or sc.allocator.kind != "static" or sc.allocator.overflow != "fallback":
        return None
    return int(cap * sc.allocator.fallback_fraction), sc.allocator.fallback_fraction


def _remedies(sc: Scenario | None, longest: int | None, cap: int | None) -> list[str]:
    if sc is None:
        return [
            "more KV memory (gpu.gpu_memory_utilization, a bigger gpu.name, gpu.tensor_parallel)",
            "fewer concurrent sequences (scheduler.max_num_seqs)",
            "a smaller token budget (scheduler.max_num_batched_tokens)",
            "scheduler.reserve_output=true",
            "allocator.preemption.mode=swap",
        ]
    gpu, sched = sc.gpu, sc.scheduler
    memory = (
        f"more KV memory (gpu.gpu_memory_utilization, {gpu.gpu_memory_utilization:g} now; a bigger GPU than {gpu.name}"
    )
    if gpu.tensor_parallel < 8:
        memory += f"; gpu.tensor_parallel={2 * gpu.tensor_parallel}"
    out = [memory + ")"]
    if sc.allocator.kind == "static" and sc.allocator.overflow == "fallback":
        out.append(
            f"a larger fallback region (allocator.fallback_fraction, {sc.allocator.fallback_fraction:g} now) "
            "or a larger reservation (allocator.reserve)"
        )
    if sched.max_num_seqs > 1:
        seqs = f"fewer concurrent sequences (scheduler.max_num_seqs, {sched.max_num_seqs} now"
        if longest and cap and 1 <= cap // longest < sched.max_num_seqs:
            seqs += f"; down to {cap // longest} for prompts this long"
        out.append(seqs + ")")
    if sched.max_num_batched_tokens > MIN_SUGGESTED_BUDGET:
        out.append(f"a smaller token budget (scheduler.max_num_batched_tokens, {sched.max_num_batched_tokens} now)")
    if sched.kind == "continuous" and not sched.reserve_output:
        out.append("scheduler.reserve_output=true (admit a request only when its prompt and whole output fit)")
    if sc.allocator.preemption.mode != "swap":
        out.append("allocator.preemption.mode=swap (no recompute)")
    return out
