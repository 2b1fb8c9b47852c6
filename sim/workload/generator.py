"""Requests to simulate: when they arrive and how long they are.

A :class:`Workload` is fully determined by the scenario and its seed. Open-loop
arrivals (Poisson, gamma, trace replay) are drawn up front as arrays; a
closed-loop workload draws lengths up front and lets the engine decide arrival
times (each client sends its next request ``think_time_s`` after its last
one finished). With ``max_concurrency``, open-loop arrival times are when requests
become due; the engine sends each when fewer than that many are in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.config import LENGTH_KINDS, LengthsConfig, Scenario, count_needed
from sim.errors import ConfigError
from sim.limits import MAX_REQUESTS, MAX_TIME_S, MAX_TOKENS
from sim.workload.traces import Trace, read_trace

#: Requests drawn at a time when the count is open-ended (duration-bounded runs).
_CHUNK = 4096
#: Sampled lengths are clipped here before they become int64: a lognormal tail or an outlier
#: multiplier can exceed int64, and anything above ``max_model_len`` (at most MAX_TOKENS) is
#: rejected as ``exceeds_max_model_len`` whatever its exact size.
_LENGTH_CAP = float(2 * MAX_TOKENS)


def _tokens(x: np.ndarray) -> np.ndarray:
    """Rounded token counts of at least 1, clipped to :data:`_LENGTH_CAP`, as int64."""
    return np.clip(np.rint(x), 1, _LENGTH_CAP).astype(np.int64)


#: Draws of a length distribution that stand for it as a length predictor's reference.
REFERENCE_SAMPLE = 20_000
#: The seed's child stream for those draws (0–2: arrivals, lengths, prefixes; 3: priorities).
_REFERENCE_STREAM = 5


@dataclass
class Workload:
    """``arrival_s`` is ``None`` for closed loop; lengths are per request id."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    arrival_s: np.ndarray | None
    closed_loop_clients: int = 0
    think_time_s: float = 0.0
    duration_s: float | None = None
    #: Per request, the ids of its prompt's prefix blocks (``hash_block_tokens`` tokens each):
    #: equal ids = shared prefix. ``None`` when the workload has no prefix identity.
    hashes: list[tuple[int, ...] | None] | None = None
    hash_block_tokens: int = 512
    #: Per request priority (0 or 1), or ``None`` when every request is equal.
    priority: np.ndarray | None = None
    #: Closed loop: per-client start offsets as a fraction in [0, 1) of the start spread, and
    #: per-request think times (s, after the previous response); ``None`` = none.
    start_offsets: np.ndarray | None = None
    think_s: np.ndarray | None = None
    #: Per request, the factor (mean 1) that spreads its client and front-end time; ``None`` = 1.
    frontend_jitter: np.ndarray | None = None
    #: Open loop: the client's cap on requests in flight (``workload.arrival.max_concurrency``); a
    #: request due at ``arrival_s`` is sent when fewer are in flight. ``None``: no cap.
    max_concurrency: int | None = None
    #: What the lengths were drawn from, and the scenario (for :meth:`reference_lengths`).
    sampler: LengthSampler | None = None
    scenario: Scenario | None = None
    #: :meth:`reference_lengths` once drawn: a reservation, a length threshold and a predictor
    #: each ask for it.
    _reference: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def reference_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Prompt and output token counts of the lengths this workload is drawn from, not of its own
        requests: every row of a trace or length-stats file, or :data:`REFERENCE_SAMPLE` draws of a
        distribution from a stream of its own (shared prefixes added as the workload adds them).
        What a length predictor may be fitted on (``sim/workload/predictor.py``)."""
        if self._reference is not None:
            return self._reference
        assert self.sampler is not None and self.scenario is not None, "a Workload from build_workload"
        sc = self.scenario
        rng = np.random.default_rng(np.random.SeedSequence(sc.seed).spawn(_REFERENCE_STREAM + 1)[_REFERENCE_STREAM])
        p, o = self.sampler.reference(rng)
        pre = sc.workload.prefix
        if pre.fraction > 0:
            p = p + np.where(rng.random(len(p)) < pre.fraction, pre.prefix_tokens, 0)
        self._reference = (p, o)
        return p, o


class LengthSampler:
    """Draws (prompt, output) token counts for ``n`` requests from a lengths block."""

    def __init__(
        self, cfg: LengthsConfig, scenario: Scenario, key: str = "workload.lengths", trace: Trace | None = None
    ):
        self.cfg = cfg
        self.key = key
        self.trace = trace
        self.base: LengthSampler | None = None
        if cfg.kind == "mixture":
            assert cfg.base is not None  # the config requires base for a mixture
            self.base = LengthSampler(cfg.base, scenario, key + ".base", trace)
        #: Trace rows behind the last sample (for prefix hashes), when lengths came from a trace.
        self.last_rows: np.ndarray | None = None
        if cfg.kind == "empirical":
            assert cfg.path is not None  # the config requires a path for empirical lengths
            self.trace = read_trace(scenario.resolve_path(cfg.path, key + ".path"), cfg.format, key + ".path")
        if cfg.kind == "trace" and cfg.path:
            # A file's rows in order, whatever the arrivals: a closed loop replays a benchmark's requests.
            self.trace = read_trace(scenario.resolve_path(cfg.path, key + ".path"), cfg.format, key + ".path")
        elif cfg.kind == "trace" and trace is None:
            raise ConfigError(
                key + ".kind",
                "trace",
                "lengths from the trace need workload.arrival.kind: trace, "
                "or workload.lengths.path (a file whose rows are used in order)",
            )

    def hashes(self) -> tuple[tuple[tuple[int, ...], ...] | None, int]:
        """Prefix block ids of the trace rows behind the last sample, and their block size."""
        src = self.trace if self.trace is not None else (self.base.trace if self.base is not None else None)
        if src is None or src.hash_ids is None or self.last_rows is None:
            return None, 512
        return tuple(src.hash_ids[i] for i in self.last_rows.tolist()), 512

    def sample(self, rng: np.random.Generator, n: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        c = self.cfg
        if c.kind == "fixed":
            return np.full(n, c.prompt_tokens, np.int64), np.full(n, c.output_tokens, np.int64)
        if c.kind == "uniform":
            return (
                rng.integers(c.prompt_min, c.prompt_max + 1, n, dtype=np.int64),
                rng.integers(c.output_min, c.output_max + 1, n, dtype=np.int64),
            )
        if c.kind == "lognormal":
            p = _tokens(c.prompt_median * np.exp(c.prompt_sigma * rng.standard_normal(n)))
            o = _tokens(c.output_median * np.exp(c.output_sigma * rng.standard_normal(n)))
            return p, o
        if c.kind in ("empirical", "trace"):
            tr = self.trace
            assert tr is not None  # read in __init__, or the arrivals' trace
            idx = rng.integers(0, len(tr), n) if c.kind == "empirical" else np.arange(start, start + n) % len(tr)
            self.last_rows = idx
            return tr.prompt_tokens[idx], tr.output_tokens[idx]
        # mixture: a fraction of requests scaled by a multiplier (both prompt and output).
        assert self.base is not None
        p, o = self.base.sample(rng, n, start)
        self.last_rows = self.base.last_rows
        return self._outliers(rng, p, o)

    def _outliers(self, rng: np.random.Generator, p: np.ndarray, o: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = self.cfg
        out = rng.random(len(p)) < c.outlier_fraction
        if c.outlier_scales != "output":
            p = np.where(out, _tokens(p * c.outlier_multiplier), p).astype(np.int64)
        if c.outlier_scales != "prompt":
            o = np.where(out, _tokens(o * c.outlier_multiplier), o).astype(np.int64)
        return p, o

    def reference(self, rng: np.random.Generator, n: int = REFERENCE_SAMPLE) -> tuple[np.ndarray, np.ndarray]:
        """The lengths this block draws from: a trace's every row, else ``n`` fresh draws from ``rng``."""
        c = self.cfg
        if c.kind in ("empirical", "trace"):
            assert self.trace is not None
            return self.trace.prompt_tokens, self.trace.output_tokens
        if c.kind == "mixture":
            assert self.base is not None
            return self._outliers(rng, *self.base.reference(rng, n))
        return self.sample(rng, n)


def _streams(seed: int) -> list[np.random.Generator]:
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)]


def build_workload(sc: Scenario) -> Workload:
    """Draw every request of the scenario (deterministic in ``sc.seed``)."""
    wl, sampler = _draw(sc)
    _add_client_timing(sc, wl)
    wl.sampler, wl.scenario = sampler, sc
    hashes, block = sampler.hashes()
    if hashes is not None:
        wl.hashes, wl.hash_block_tokens = list(hashes), block
    pre = sc.workload.prefix
    if pre.fraction > 0:
        if wl.hashes is not None:
            raise ConfigError(
                "workload.prefix.fraction", pre.fraction, "0 with a trace that carries its own prefix hashes (Mooncake)"
            )
        _add_shared_prefixes(sc, wl)
    if sc.workload.priority.high_fraction > 0:
        # Its own stream, so adding classes does not change arrivals or lengths.
        rng = np.random.default_rng(np.random.SeedSequence(sc.seed).spawn(4)[3])
        wl.priority = (rng.random(len(wl)) < sc.workload.priority.high_fraction).astype(np.int64)
    return wl


#: Synthetic prefix ids are hashed per 16 tokens and kept apart from trace ids.
_SYNTH_BLOCK = 16
_SYNTH_BASE = 1 << 40


def _add_shared_prefixes(sc: Scenario, wl: Workload) -> None:
    pre = sc.workload.prefix
    rng = _streams(sc.seed)[2]
    n = len(wl)
    shared = rng.random(n) < pre.fraction
    group = rng.integers(0, pre.groups, n)
    blocks = -(-pre.prefix_tokens // _SYNTH_BLOCK)
    wl.prompt_tokens = wl.prompt_tokens + np.where(shared, pre.prefix_tokens, 0)
    wl.hash_block_tokens = _SYNTH_BLOCK
    # One tuple per group, shared by its requests (equal tuples, one copy in memory).
    ids: dict[int, tuple[int, ...]] = {}
    for g in set(group[shared].tolist()):
        ids[g] = tuple(range(_SYNTH_BASE + g * blocks, _SYNTH_BASE + (g + 1) * blocks))
    wl.hashes = [ids[g] if s else None for s, g in zip(shared.tolist(), group.tolist())]


def request_bound(sc: Scenario) -> int | None:
    """Requests the scenario will simulate, known before anything is drawn: ``num_requests`` where
    it bounds the count, the mean count ``rate × duration_s`` of a duration-only Poisson or gamma
    workload, ``None`` where only drawing tells (a trace or closed loop cut by ``duration_s``)."""
    w = sc.workload
    explicit_n = "num_requests" in w.model_fields_set or w.duration_s is None
    if explicit_n and w.num_requests is not None:
        return w.num_requests
    if w.arrival.kind in ("poisson", "gamma") and w.duration_s is not None and w.arrival.rate is not None:
        return int(w.arrival.rate * w.duration_s)
    return None


def _draw(sc: Scenario) -> tuple[Workload, LengthSampler]:
    w = sc.workload
    arr = w.arrival
    rng_arrival, rng_len, _ = _streams(sc.seed)
    explicit_n = "num_requests" in w.model_fields_set or w.duration_s is None
    n_cap = w.num_requests if explicit_n else None
    trace = None
    if arr.kind == "trace":
        assert arr.path is not None  # the config requires a path for trace arrivals
        trace = read_trace(sc.resolve_path(arr.path, "workload.arrival.path"), arr.format, "workload.arrival.path")
        if trace.arrival_s is None:
            raise ConfigError(
                "workload.arrival.path",
                arr.path,
                "a trace with arrival times (length-stats files have none; use lengths.kind: empirical)",
            )
    lengths_cfg = w.lengths or (LengthsConfig(kind="trace") if trace is not None else None)
    if lengths_cfg is None:
        # Validation fills in a lengths block; only a scenario built around it gets here.
        raise ConfigError("workload.lengths", None, f"a lengths block ({', '.join(LENGTH_KINDS)})")
    sampler = LengthSampler(lengths_cfg, sc, trace=trace)

    if arr.kind == "closed_loop":
        n = n_cap if n_cap is not None else _CHUNK * 64
        p, o = sampler.sample(rng_len, n)
        assert arr.concurrency is not None  # the config requires it for closed_loop
        return Workload(p, o, None, arr.concurrency, arr.think_time_s, w.duration_s), sampler

    t: np.ndarray
    if arr.kind == "trace":
        assert trace is not None and trace.arrival_s is not None  # read and checked above
        t = trace.arrival_s * arr.time_scale
        if len(t) and not t[-1] <= MAX_TIME_S:
            raise ConfigError(
                "workload.arrival.time_scale",
                arr.time_scale,
                f"a scale that keeps the trace within {MAX_TIME_S:g} s (its last arrival is at "
                f"{trace.arrival_s[-1]:g} s)",
            )
        keep = len(t) if n_cap is None else min(n_cap, len(t))
        if w.duration_s is not None:
            keep = min(keep, int(np.searchsorted(t, w.duration_s, side="right")))
        p, o = sampler.sample(rng_len, keep)
        return Workload(p, o, t[:keep].copy(), duration_s=w.duration_s, max_concurrency=arr.max_concurrency), sampler

    rate = arr.rate
    assert rate is not None  # the config requires it for poisson and gamma arrivals

    def gaps(m: int) -> np.ndarray:
        if arr.kind == "poisson":
            return rng_arrival.exponential(1.0 / rate, m)
        shape = 1.0 / arr.cv**2  # gamma with mean 1/rate and coefficient of variation cv
        return rng_arrival.gamma(shape, 1.0 / (rate * shape), m)

    if w.duration_s is None:
        if n_cap is None:  # validation refuses this; a scenario changed after it may not be
            raise ConfigError("workload.num_requests", None, count_needed())
        t = np.cumsum(gaps(n_cap))
    else:
        parts, last, drawn = [], 0.0, 0
        while True:
            g = np.cumsum(gaps(_CHUNK)) + last
            parts.append(g)
            last = g[-1]
            drawn += len(g)
            if last > w.duration_s or (n_cap is not None and drawn >= n_cap):
                break
            if drawn > MAX_REQUESTS:
                raise ConfigError(
                    "workload.duration_s",
                    w.duration_s,
                    f"a duration with at most {MAX_REQUESTS} arrivals at rate {arr.rate:g}/s "
                    f"(or set workload.num_requests)",
                )
        t = np.concatenate(parts)
        t = t[t <= w.duration_s][:n_cap]
    if len(t) == 0:
        raise ConfigError("workload.duration_s", w.duration_s, "a duration long enough for at least one arrival")
    p, o = sampler.sample(rng_len, len(t))
    return Workload(p, o, t, duration_s=w.duration_s, max_concurrency=arr.max_concurrency), sampler


def _gamma(rng: np.random.Generator, mean: float, cv: float, n: int) -> np.ndarray:
    """``n`` gamma draws with this mean and coefficient of variation."""
    shape = 1.0 / cv**2
    return rng.gamma(shape, mean / shape, n)


def _add_client_timing(sc: Scenario, wl: Workload) -> None:
    """Start offsets, think times and front-end spread, from a stream of their own (lengths and
    arrivals do not change when these keys do)."""
    arr = sc.workload.arrival
    spread = arr.start_spread_s > 0 or arr.start_spread_cycles > 0
    if not spread and arr.think_time_cv <= 0 and arr.client_cv <= 0:
        return
    rng = np.random.default_rng(np.random.SeedSequence(sc.seed).spawn(5)[4])
    n = len(wl)
    if wl.arrival_s is None and spread:
        wl.start_offsets = rng.uniform(0.0, 1.0, wl.closed_loop_clients)
    if wl.arrival_s is None and arr.think_time_s > 0 and arr.think_time_cv > 0:
        wl.think_s = _gamma(rng, arr.think_time_s, arr.think_time_cv, n)
    if arr.client_cv > 0:
        wl.frontend_jitter = _gamma(rng, 1.0, arr.client_cv, n)


def total_length_percentile(wl: Workload, q: float) -> int:
    """The ``q``-th percentile of prompt + output tokens, in tokens, over the lengths the workload
    is drawn from (:meth:`Workload.reference_lengths`), not over its own requests: a reservation
    sized as ``p95`` must not move with ``num_requests``, or one plan or sweep would compare
    deployments that reserve different amounts for the same traffic."""
    p, o = wl.reference_lengths()
    return int(np.ceil(np.percentile(p + o, q)))
