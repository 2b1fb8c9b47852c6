"""Predicting a request's total length (prompt + output tokens) when a server admits it.

A server knows a request's prompt when it arrives, and after a preemption the tokens it has
generated so far; it never knows how long the answer will be. Allocators that route requests by
length (``hybrid_tail``: static slots for predicted-long requests, a block pool for the rest) ask a
:class:`LengthPredictor` (``allocator.length_predictor``):

* ``prompt`` (the default): the known length (prompt + tokens generated so far) is the prediction:
  a request is long only once what is known of it is long.
* ``quantile``: the prompt plus the ``q``-quantile of the output length among reference requests
  with a similar prompt (``allocator.predictor_quantile``, the stated coverage: on the reference
  lengths, a fraction ``q`` of requests are no longer than predicted). The reference is the length
  distribution the scenario draws from — the whole trace file for trace and empirical lengths,
  a separate sample of the distribution for parametric lengths — never the run's own draws
  (:meth:`sim.workload.generator.Workload.reference_lengths`).
* ``oracle``: the true total, output included. No server can do this; it is kept as the upper
  bound of a length-routed strategy and labelled so (``upper_bound``) in every output.

Every prediction is at least the known length. Only ``oracle`` reads ``Request.output``
(``tests/test_predictor.py`` holds the others to that).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from sim.request import Request

#: Prompt bins of the quantile fit: at most this many, each with at least ``_MIN_PER_BIN`` reference requests.
_MAX_BINS = 32
_MIN_PER_BIN = 200

PREDICTORS = ("prompt", "quantile", "oracle")


class LengthPredictor(ABC):
    """Predicts total tokens (prompt + output) of a request at admission."""

    #: ``allocator.length_predictor``.
    kind: str = ""
    #: Reads what a server cannot know (the true output length): results are an upper bound.
    upper_bound: bool = False

    @abstractmethod
    def predict_total(self, req: Request) -> int:
        """Predicted prompt + output tokens of ``req`` (≥ its prompt + tokens generated so far)."""

    def describe(self) -> dict:
        """What the summary reports about the predictor."""
        return {"kind": self.kind, "upper_bound": self.upper_bound}


class OraclePredictor(LengthPredictor):
    """The true total length: an upper bound, not a prediction a server can make."""

    kind = "oracle"
    upper_bound = True

    def predict_total(self, req: Request) -> int:
        return req.prompt + req.output


class PromptPredictor(LengthPredictor):
    """What is known: the prompt and the tokens generated so far (after a preemption)."""

    kind = "prompt"

    def predict_total(self, req: Request) -> int:
        return req.prompt + req.generated


class QuantilePredictor(LengthPredictor):
    """Prompt + the ``coverage`` quantile of the output length in the prompt's bin.

    ``edges`` are the bins' upper prompt bounds (a prompt ``p`` falls in bin ``bisect_left(edges,
    p)``: bin ``i`` holds ``edges[i-1] < p <= edges[i]``, the last one everything above);
    ``output_quantile[i]`` is bin ``i``'s quantile, in tokens.
    """

    kind = "quantile"

    def __init__(
        self,
        coverage: float,
        edges: list[int],
        output_quantile: list[int],
        reference_requests: int,
        reference_coverage: float,
    ):
        assert len(output_quantile) == len(edges) + 1
        self.coverage = coverage
        self.edges = edges
        self.output_quantile = output_quantile
        self.reference_requests = reference_requests
        #: Fraction of reference requests whose total is at most the prediction (≥ ``coverage``).
        self.reference_coverage = reference_coverage

    def predict_total(self, req: Request) -> int:
        p = req.prompt
        guess = p + self.output_quantile[bisect_left(self.edges, p)]
        known = p + req.generated
        return guess if guess > known else known

    def describe(self) -> dict:
        return {
            **super().describe(),
            "coverage": self.coverage,
            "reference_requests": self.reference_requests,
            "reference_coverage": self.reference_coverage,
            "prompt_bins": len(self.output_quantile),
        }


def fit_quantile(prompts: np.ndarray, outputs: np.ndarray, coverage: float) -> QuantilePredictor:
    """Fit :class:`QuantilePredictor` on reference lengths (token counts, one pair per request).

    Prompt bins are quantiles of the reference prompts (ties merged), at most 32 with at least 200
    requests each; within a bin the output quantile is the smallest output at least ``coverage``
    of the bin's requests do not exceed (``inverted_cdf``), so the stated coverage holds on the
    reference in every bin.
    """
    p = np.asarray(prompts, dtype=np.int64)
    o = np.asarray(outputs, dtype=np.int64)
    if p.size == 0:
        raise ValueError("the quantile predictor needs reference lengths")
    bins = int(max(1, min(_MAX_BINS, p.size // _MIN_PER_BIN)))
    cuts = np.quantile(p, np.linspace(0, 1, bins + 1)[1:-1], method="inverted_cdf") if bins > 1 else np.array([])
    edges = sorted({int(c) for c in cuts.tolist()})
    idx = np.searchsorted(np.asarray(edges, dtype=np.int64), p, side="left")
    overall = int(np.quantile(o, coverage, method="inverted_cdf"))
    oq = []
    for i in range(len(edges) + 1):
        sel = o[idx == i]
        oq.append(int(np.quantile(sel, coverage, method="inverted_cdf")) if sel.size else overall)
    covered = float(np.mean(o <= np.asarray(oq, dtype=np.int64)[idx]))
    return QuantilePredictor(coverage, edges, oq, int(p.size), covered)


def make_predictor(
    kind: str, coverage: float = 0.9, reference: tuple[np.ndarray, np.ndarray] | None = None
) -> LengthPredictor:
    """The predictor of ``allocator.length_predictor`` (``quantile`` needs ``reference``: prompt and
    output token counts of the lengths the workload is drawn from)."""
    if kind == "oracle":
        return OraclePredictor()
    if kind == "prompt":
        return PromptPredictor()
    if kind == "quantile":
        if reference is None:
            raise ValueError("the quantile predictor needs the workload's reference lengths")
        return fit_quantile(reference[0], reference[1], coverage)
    raise ValueError(f"unknown length predictor {kind!r}; one of {', '.join(PREDICTORS)}")


@dataclass
class PredictionTally:
    """How a predictor's long/short calls compare with the truth, over requests at their first
    admission (a request above ``threshold_tokens`` in total is long). Kept by the scheduler, which
    sees the true length only to count here; the predictor never does."""

    threshold_tokens: int
    long_predicted_long: int = 0
    long_predicted_short: int = 0
    short_predicted_long: int = 0
    short_predicted_short: int = 0

    def record(self, predicted_total: int, true_total: int) -> None:
        thr = self.threshold_tokens
        if true_total > thr:
            if predicted_total > thr:
                self.long_predicted_long += 1
            else:
                self.long_predicted_short += 1
        elif predicted_total > thr:
            self.short_predicted_long += 1
        else:
            self.short_predicted_short += 1

    def add(self, other: PredictionTally) -> None:
        self.long_predicted_long += other.long_predicted_long
        self.long_predicted_short += other.long_predicted_short
        self.short_predicted_long += other.short_predicted_long
        self.short_predicted_short += other.short_predicted_short

    def as_dict(self) -> dict:
        return {
            "long_threshold_tokens": self.threshold_tokens,
            "long_predicted_long": self.long_predicted_long,
            "long_predicted_short": self.long_predicted_short,
            "short_predicted_long": self.short_predicted_long,
            "short_predicted_short": self.short_predicted_short,
        }
