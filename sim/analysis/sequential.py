"""Stop a simulation as soon as its SLO attainment is decided.

The planner asks one question of a run of N requests: is its attainment (requests meeting the
SLO ÷ N, :mod:`sim.analysis.slo`) at least the target ``a``? :class:`AttainmentTest` watches the
requests end (``simulate(..., stop=test)``) and answers as soon as it can:

* **certain** — more than ``(1 − a)·N`` requests have missed the SLO: the rest of the run
  cannot change the answer (fail). It stops the run when the attainment among the requests
  that ended is below ``a −`` :data:`NEAR_MISS`; a near miss runs to the end, since the planner
  interpolates the goodput between exact attainments on either side of the target. A certain
  pass (``a·N`` met) does not stop the run either: it comes late, for the same reason.
* **tested** — a sequential test on the requests in arrival order. Only a prefix of requests
  1..k that have *all* ended is used (requests end out of order, short ones first, so the set of
  ended requests is a biased sample; the arrival order is not). On that prefix:

  1. *warm-up*: the run starts empty, so the first requests are served faster than the rest.
     MSER (White 1997: the truncation point that minimises the standard error of the mean of
     what remains), searched over the first half of the prefix, on batch means of each request's
     *slack* — its worst latency ÷ bound, capped at :data:`SLACK_CAP` (misses are > 1) — gives
     the warm-up length ``w``; the requests before it are not used to estimate the rate of meets.
  2. *trend*: an overloaded run is not stationary (the queue grows, later requests miss more).
     The least-squares slopes of the batch means of the slack and of the TTFT after the warm-up,
     as t statistics: a worsening trend in either (t > :data:`TREND_T`) forbids a pass, an
     improving one forbids a fail.
  3. *projection*: after the warm-up the outcomes are treated as a stationary 0/1 series with
     mean p̂ and asymptotic variance σ² from batch means (batches of ⌈√m⌉ requests, σ² at least
     the binomial p̃(1 − p̃) with p̃ = (meets + 2)/(m + 4)). The run's attainment is projected as
     ``A = (meets in the prefix + (N − k)·p̂) / N`` with variance
     ``((N − k)²σ²/m + (N − k)σ²) / N²`` (the estimate's error plus the remaining requests' own
     noise). Pass when ``A − z·sd ≥ a``, fail when ``A + z·sd < a``.

  Looks happen at prefixes of :data:`FIRST_LOOK` requests and then every ×:data:`LOOK_GROWTH`;
  ``z`` is the normal quantile of ``1 − (1 − confidence)/looks`` (Bonferroni over the looks), so
  under the test's model a run is wrongly decided with probability at most ``1 − confidence``.
  The model is approximate (batch means of a correlated series); the planner's comparison with
  full runs (``tests/test_planner_search.py``, ``bench/planner.py``) measures how often it errs.

Units: seconds for latencies; slack is dimensionless.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from sim.analysis.slo import SLO
from sim.request import COMPLETED, Request

#: Slack of a miss that has no latency to compare (rejected, truncated), and the cap of all slacks.
SLACK_CAP = 4.0
#: Requests in the arrival-ordered prefix at the first look, and the growth factor between looks.
FIRST_LOOK = 200
LOOK_GROWTH = 1.5
#: Requests per batch of the MSER warm-up search.
WARMUP_BATCH = 10
#: |t| of the slack's trend above which a run counts as non-stationary.
TREND_T = 2.0
#: Fewest requests after the warm-up, and fewest batches, before a tested decision.
MIN_AFTER_WARMUP = 150
MIN_BATCHES = 8
DEFAULT_CONFIDENCE = 0.95
#: A certain fail stops the run only when the ended requests' attainment is below target − this.
NEAR_MISS = 0.10


def request_outcome(req: Request, slo: SLO) -> tuple[bool, float]:
    """(meets the SLO, slack) of an ended request; the same rule as :func:`sim.analysis.slo.meets`."""
    if req.status != COMPLETED or req.truncated:
        return False, SLACK_CAP
    ttft_s, tpot_s, e2e_s = (slo.bound(m, req.prompt) for m in ("ttft", "tpot", "e2e"))
    slack = 0.0
    if ttft_s is not None:
        slack = max(slack, (req.first_token - req.arrival) / ttft_s)
    if tpot_s is not None and req.generated > 1:
        slack = max(slack, (req.finish - req.first_token) / (req.generated - 1) / tpot_s)
    if e2e_s is not None:
        slack = max(slack, (req.finish - req.arrival) / e2e_s)
    ok = True
    if ttft_s is not None:
        ok = (req.first_token - req.arrival) <= ttft_s
    if ok and tpot_s is not None and req.generated > 1:
        ok = (req.finish - req.first_token) / (req.generated - 1) <= tpot_s
    if ok and e2e_s is not None:
        ok = (req.finish - req.arrival) <= e2e_s
    return bool(ok), min(slack, SLACK_CAP)


def mser_truncation(y: np.ndarray) -> int:
    """Index d ≤ n/2 minimising the MSER statistic ``Σ(y[d:] − mean)² / (n − d)²`` (the search is
    kept to the first half, as MSER's authors advise: near the end the statistic favours the few
    last values whatever they are)."""
    n = len(y)
    if n < 3:
        return 0
    # Suffix sums give every candidate d in one pass.
    rev = y[::-1]
    s1 = np.cumsum(rev)[::-1]
    s2 = np.cumsum(rev * rev)[::-1]
    cnt = np.arange(n, 0, -1, dtype=np.float64)
    sse = s2 - s1 * s1 / cnt
    half = n // 2 + 1
    stat = sse[:half] / cnt[:half] ** 2
    return int(np.argmin(stat))


def batch_means(x: np.ndarray, size: int) -> np.ndarray:
    nb = len(x) // size
    return x[: nb * size].reshape(nb, size).mean(axis=1) if nb else np.empty(0)


def trend_t(y: np.ndarray) -> float:
    """t statistic of the least-squares slope of ``y`` against its index (0 when flat or short)."""
    n = len(y)
    if n < 4:
        return 0.0
    t = np.arange(n, dtype=np.float64)
    tc = t - t.mean()
    sxx = float(tc @ tc)
    slope = float(tc @ (y - y.mean())) / sxx
    resid = y - y.mean() - slope * tc
    s2 = float(resid @ resid) / (n - 2)
    if s2 <= 0:
        return 0.0 if slope == 0 else math.copysign(math.inf, slope)
    return slope / math.sqrt(s2 / sxx)


class AttainmentTest:
    """``simulate(sc, stop=AttainmentTest(slo, n))``: decides whether the run's attainment ≥ ``slo.attainment``.

    After the run and :meth:`finish`: :attr:`decision` is ``"pass"`` or ``"fail"``, :attr:`how` ``"certain"``, ``"tested"`` or ``"complete"``,
    :attr:`estimate` the attainment (exact when every request ended, projected otherwise),
    :attr:`ended` the requests that had ended. With ``statistical=False`` only certain decisions
    stop the run (exact); with ``tested_pass=False`` the statistical test may only fail a run (the
    planner's choice near saturation, where a prefix of the run cannot see the long queue
    excursions that make a run that looks fine miss later; the reverse error needs the queue to
    shrink, which the trend check forbids).
    """

    def __init__(
        self,
        slo: SLO,
        n_requests: int,
        confidence: float = DEFAULT_CONFIDENCE,
        statistical: bool = True,
        tested_pass: bool = True,
    ):
        self.slo, self.n, self.target = slo, int(n_requests), slo.attainment
        self.statistical = statistical
        self.tested_pass = tested_pass
        self.met = np.zeros(self.n, dtype=np.float64)
        self.slack = np.zeros(self.n, dtype=np.float64)
        self.ttft = np.zeros(self.n, dtype=np.float64)
        self.done = np.zeros(self.n, dtype=bool)
        self.meets = 0
        self.misses = 0
        self.prefix = 0
        self.next_look = min(FIRST_LOOK, self.n)
        looks = 1 + max(0, math.ceil(math.log(max(self.n / FIRST_LOOK, 1.0)) / math.log(LOOK_GROWTH)))
        self.z = NormalDist().inv_cdf(1.0 - (1.0 - confidence) / looks)
        self.confidence = confidence
        self.decision: str | None = None
        self.how: str | None = None
        self.estimate: float | None = None
        self.warmup: int | None = None

    @property
    def ended(self) -> int:
        return self.meets + self.misses

    def __call__(self, req: Request) -> bool:
        ok, slack = request_outcome(req, self.slo)
        i = req.id
        self.met[i] = ok
        self.slack[i] = slack
        # A request refused before its first token waited as long as the run has lasted so far.
        self.ttft[i] = (req.first_token if req.first_token >= 0 else req.finish) - req.arrival
        self.done[i] = True
        if ok:
            self.meets += 1
        else:
            self.misses += 1
        # Certain: the rest cannot change the answer (the same float test as slo.attainment).
        if (self.n - self.misses) / self.n < self.target:
            if self.meets / self.ended < self.target - NEAR_MISS:
                return self._decide("fail", "certain", None)
            return False  # a near miss: run on for its exact attainment
        if not self.statistical:
            return False
        done, k = self.done, self.prefix
        while k < self.n and done[k]:
            k += 1
        self.prefix = k
        if k >= self.next_look and k < self.n:
            self.next_look = max(k + 1, int(self.next_look * LOOK_GROWTH))
            return self._look(k)
        return False

    def _decide(self, decision: str, how: str, estimate: float | None) -> bool:
        self.decision, self.how = decision, how
        # A certain decision's estimate: the requests still running meet the SLO as often as
        # those that ended (exact when every request has ended).
        self.estimate = estimate if estimate is not None else self.meets / max(self.ended, 1)
        return True

    def _look(self, k: int) -> bool:
        y = batch_means(self.slack[:k], WARMUP_BATCH)
        w = mser_truncation(y) * WARMUP_BATCH
        self.warmup = w
        x = self.met[w:k]
        m = len(x)
        size = max(5, math.ceil(math.sqrt(m)))
        bm = batch_means(x, size)
        if m < MIN_AFTER_WARMUP or len(bm) < MIN_BATCHES:
            return False
        p = float(x.mean())
        s2 = float(bm.var(ddof=1)) * size
        pt = (float(x.sum()) + 2.0) / (m + 4.0)
        s2 = max(s2, pt * (1.0 - pt))
        rest = self.n - k
        proj = (float(self.met[:k].sum()) + rest * p) / self.n
        sd = math.sqrt(rest * rest * s2 / m + rest * s2) / self.n
        t_slack = trend_t(batch_means(self.slack[w:k], size))
        t_ttft = trend_t(batch_means(self.ttft[w:k], size))
        if self.tested_pass and max(t_slack, t_ttft) <= TREND_T and proj - self.z * sd >= self.target:
            return self._decide("pass", "tested", proj)
        if min(t_slack, t_ttft) >= -TREND_T and proj + self.z * sd < self.target:
            return self._decide("fail", "tested", proj)
        return False

    def finish(self) -> None:
        """After a run that ended without a decision: every request ended, so the answer is exact."""
        if self.decision is None:
            self._decide("pass" if self.meets / self.n >= self.target else "fail", "complete", None)

    def result(self) -> dict:
        """The probe record's fields: decision, how, attainment (estimate), requests ended."""
        return {
            "decision": self.decision,
            "how": self.how,
            "attainment": self.estimate,
            "ended": self.ended,
            "warmup": self.warmup,
        }
