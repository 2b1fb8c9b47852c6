"""The planner's recommendation: which candidate to use, and why, from the measured numbers.

:func:`recommend` reads a plan (``plan.json``'s dict, :func:`sim.analysis.planner.plan`) and picks
a candidate: with a target rate among those needing the fewest GPUs, else among all; goodputs per
GPU within the search tolerance (and, with ``--seeds``, within noise) tie, and ties are broken by
the steps of :class:`TieStep` (fewer requests refused or truncated, higher goodput, the seed
article's 10 % jitter rule, steadier decode steps, less memory waste, the candidate list's order).
Its reasons give every number that decided, what binds above the chosen candidate's goodput
(:func:`binding_line`), and the article's measures (waste, fragmentation, jitter) at each operating
point. Goodputs are requests/s; jitter is p99/p50 of the decode-step time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from sim.analysis.sequential import DEFAULT_CONFIDENCE

#: The seed article's jitter rule: a decode-step spike above 10 % of p50 calls for static.
JITTER_RULE = 1.10
#: Differences the recommendation's tie-breaks do not act on: goodput edges within 2 % (the
#: interpolated edges of two searches of the same candidate differ by up to 0.5 %, bench/planner.py),
#: decode jitter within 0.05 (p99/p50), memory waste within one point.
GOODPUT_RESOLUTION = 0.02
JITTER_RESOLUTION = 0.05
WASTE_RESOLUTION = 0.01
#: A replica whose reserved KV memory peaks at this share of its capacity has run out of it.
KV_FULL = 0.95
_BOUND_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "e2e latency", "refused": "refused", "truncated": "truncated"}


def jitter_text(j: float) -> str:
    """A decode jitter (p99/p50) at two decimals, or more where two would print a value on the
    wrong side of the article's rule as the rule itself (1.104 is above 1.10, not at it)."""
    for d in range(2, 7):
        text = f"{j:.{d}f}"
        if float(text) != JITTER_RULE or j == JITTER_RULE:
            return text
    return repr(float(j))


def binding_run(c: dict, base_replicas: int, target: float) -> dict | None:
    """The lowest-rate run of ``c`` at the base replica count that missed the ``target`` above the
    goodput (a probe record), or ``None``."""
    goodput = c.get("goodput_rps") or 0.0
    runs = [
        r
        for r in [*c.get("probes", []), *c.get("quick_probes", [])]
        if r.get("replicas") == base_replicas
        and r.get("misses")
        and r.get("attainment") is not None
        and r["attainment"] < target
        and r["rate"] > goodput
    ]
    return min(runs, key=lambda x: x["rate"]) if runs else None


def split_text(b: dict, top: int = 4) -> str:
    """A step-time breakdown (:mod:`sim.cost.breakdown`) in a few words: its ``top`` largest parts,
    then the paged layout's and the allocator's shares where they are not among them."""
    share = {k: v for k, v in b["share"].items() if v > 0}
    named = sorted(share, key=lambda k: -share[k])[:top]
    text = ", ".join(f"{_PART_NAMES.get(k, k)} {share[k]:.0%}" for k in named)
    extra = [
        f"{_PART_NAMES[k]} {share[k]:.1%}"
        for k in ("attention_layout", "kv_memory_ops")
        if k in share and k not in named
    ]
    return text + (f" ({', '.join(extra)})" if extra else "")


#: The parts of an iteration as a reason line names them.
_PART_NAMES = {
    "linear": "GEMMs",
    "lm_head": "LM head",
    "attention": "attention",
    "attention_layout": "paged layout",
    "allreduce": "all-reduce",
    "elementwise": "elementwise",
    "host": "host",
    "launch": "eager launches",
    "host_bound": "waiting on the host",
    "kv_memory_ops": "allocator work",
    "other": "other",
}


def binding_line(c: dict, base_replicas: int, target: float) -> str | None:
    """What stops ``c`` above its goodput, from :func:`binding_run`: which bound its requests
    missed, and whether KV memory filled (reserved peak ≥ :data:`KV_FULL` of capacity,
    preemptions, refusals) or not; with ``c["binding_split"]`` (that run's step-time breakdown,
    which the planner adds), where its iteration time went."""
    r = binding_run(c, base_replicas, target)
    if r is None:
        return None
    m = r["misses"]
    parts = ", ".join(f"{_BOUND_NAMES[k]} {v:.1%}" for k, v in m.items() if v > 0) or "none"
    peak = r.get("kv_reserved_peak")
    full = (peak is not None and peak >= KV_FULL) or r["preemptions"] > 0 or m.get("refused", 0) > 0
    memory = f"KV memory reserved at most {peak:.0%} of capacity" if peak is not None else "KV memory unknown"
    memory += f", {r['preemptions']} preemptions" if r["preemptions"] else ", no preemptions"
    latency = max(("ttft", "tpot", "e2e"), key=lambda k: m.get(k, 0.0))
    if full:
        verdict = (
            "KV memory binds: it fills, so requests wait for room, are preempted or refused; memory wasted less "
            "(another allocator), more of it (a larger GPU, a wider --tp) or shorter max_model_len lifts the goodput"
        )
    elif m.get(latency, 0.0) > 0:
        why = {
            "ttft": "time in the queue and in prefill",
            "tpot": "the decode step at that batch size",
            "e2e": "time in the queue, prefill and decode",
        }[latency]
        verdict = (
            f"not KV memory but {_BOUND_NAMES[latency]} binds ({why}): an allocator that saves memory would not "
            "lift the goodput, faster iterations would (a wider --tp, a faster GPU)"
        )
    else:
        verdict = "no single bound stands out"
    split = c.get("binding_split")
    where = f"; its iterations there: {split_text(split)}" if split else ""
    return (
        f"what binds above the goodput: at {r['rate']:.3g} req/s ({r['attainment']:.1%} within the SLO) the misses "
        f"are {parts} of requests; {memory} — {verdict}{where}"
    )


def mean_interval(values: list[float], confidence: float) -> tuple[float, float, float]:
    """Mean and the two-sided Student-t confidence interval of the mean of ``values``."""
    x = np.asarray(values, dtype=np.float64)
    m = float(x.mean())
    if len(x) < 2:
        return m, m, m
    from scipy.stats import t as student_t

    h = float(student_t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return m, m - h, m + h


def seed_intervals(cands: list[dict], confidence: float) -> None:
    """Each candidate's goodput over seeds: mean and confidence interval (of the interpolated goodputs)."""
    for c in cands:
        seeds = c.get("seed_goodputs") or []
        if len(seeds) < 2 or any(s["status"] != "ok" for s in seeds):
            continue
        m, lo, hi = mean_interval([s["goodput_est_rps"] for s in seeds], confidence)
        c["goodput_mean_rps"], c["goodput_ci_rps"] = m, [lo, hi]


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


#: Why a search's goodput is only a lower bound (``search_status``), in the recommendation's words.
_LOWER_BOUND_WHY = {
    "unbounded": "every rate the search tried met the SLO, up to the highest it tries",
    "budget": "the search's evaluation budget ran out before any rate missed the SLO",
}


def lower_bound_mark(c: dict) -> str:
    """``"≥"`` for a candidate whose goodput is only a lower bound (its search never saw a rate
    miss the SLO), else ``""``."""
    return "≥" if c.get("search_status") in _LOWER_BOUND_WHY else ""


def _upper_bound_reasons(p: dict, basis: str) -> list[str]:
    """One line per upper-bound candidate: what it reached, beside the real candidates of its kind
    (goodputs on the recommendation's ``basis``)."""
    label = basis_label(basis, p)
    named = f" ({label})" if label else ""
    out = []
    for u in p["candidates"]:
        if not u.get("upper_bound"):
            continue
        kind = u["overrides"].get("allocator.kind")
        peers = [
            c
            for c in p["candidates"]
            if not c.get("upper_bound") and c["overrides"].get("allocator.kind") == kind and c["status"] == "ok"
        ]
        got = f"{_basis_value(u, basis):.3g} req/s" if u["status"] == "ok" else u["status"]
        vs = ", ".join(f"{c['name']} {_basis_value(c, basis):.3g} req/s" for c in peers)
        out.append(
            f"{u['name']} is an upper bound, not a candidate (it routes by each request's true output length, "
            f"which no server knows): goodput{named} {got}" + (f" vs {vs}" if vs else "")
        )
    return out


def _within(a: float, b: float, resolution: float, relative: bool = False) -> bool:
    """Whether ``a`` and ``b`` measure the same: within ``resolution`` of each other (absolute, or
    relative to the larger); an unmeasured (infinite) value is the same only as another."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b
    gap = abs(a - b)
    if relative:
        gap /= max(abs(a), abs(b), 1e-300)
    return gap <= resolution * (1 + 1e-9)


def _apart(
    cands: list[dict],
    ref: dict,
    key: Callable[[dict], float],
    unit: str,
    resolution: float,
    relative: bool = False,
    decimals: int | None = None,
    percent: bool = False,
) -> dict[str, str]:
    """Each candidate's ``key`` as text (name → text), all at one precision: the fewest decimals
    (from three significant digits, or from ``decimals``) at which every value that differs from
    ``ref``'s prints apart from it, and every one beyond ``resolution`` of it prints beyond it (a
    waste of 0.65 % against 1.33 % is not shown as 1 % against 1 %)."""
    scale = 100.0 if percent else 1.0
    vals = {c["name"]: key(c) * scale for c in cands}
    r = key(ref) * scale
    res = resolution if relative else resolution * scale
    finite = [abs(v) for v in vals.values() if math.isfinite(v)]
    if decimals is None:
        top = max(finite, default=0.0)
        decimals = 0 if percent or top == 0 else max(0, 2 - math.floor(math.log10(top)))
    d = decimals
    for d in range(decimals, decimals + 5):
        if all(
            v == r
            or not (math.isfinite(v) and math.isfinite(r))
            or (
                round(v, d) != round(r, d)
                and (_within(v, r, res, relative) or not _within(round(v, d), round(r, d), res, relative))
            )
            for v in vals.values()
        ):
            break
    sep = "" if unit in ("", "%") else " "
    return {n: (f"{v:.{d}f}{sep}{unit}" if math.isfinite(v) else "not measured") for n, v in vals.items()}


class TieStep:
    """One tie-break of the recommendation: ``best(cands)`` is the best of those in the running,
    ``same(best, c)`` whether ``c`` measures the same as it; ``show(cands, ref)`` gives each one's
    value as text (at a precision that separates it from ``ref``'s); ``out`` and ``within`` word a
    candidate dropped or kept beside the best."""

    def __init__(
        self,
        criterion: str,
        short: str,
        best: Callable[[list[dict]], dict],
        same: Callable[[dict, dict], bool],
        show: Callable[[list[dict], dict], dict[str, str]],
        out: str,
        within: str,
    ):
        self.criterion, self.short, self.best, self.same = criterion, short, best, same
        self.show, self.out, self.within = show, out, within

    def clause(self, keep: list[dict], ref: dict, nxt: list[dict]) -> str:
        """The reason's words for this step: who it dropped, against which best and value."""
        vals = self.show(keep, ref)
        dropped = [c for c in keep if not any(c is k for k in nxt)]
        kept = [c for c in nxt if c is not ref]

        def named(cs: list[dict]) -> str:
            return ", ".join(f"{c['name']} ({vals[c['name']]})" for c in cs)

        text = (
            f"{self.criterion}: {named(dropped)} {'is' if len(dropped) == 1 else 'are'} out, {self.out} {named([ref])}"
        )
        if kept and self.within:
            text += f"; {named(kept)} {self.within} of it"
        return text


def _list_order_clause(keep: list[dict], steps: list[TieStep]) -> str:
    """The reason's words when the candidates left after every tie-break are picked from by list order."""
    first, rest = keep[0], keep[1:]
    facts = []
    for step in steps:
        if not step.short:
            continue  # a step that only restates another's value (the jitter rule and the jitter)
        vals = step.show(keep, first)
        facts.append(f"{step.short} " + ", ".join(f"{c['name']} {vals[c['name']]}" for c in keep))
    return (
        f"{', '.join(c['name'] for c in rest)} {'measures' if len(rest) == 1 else 'measure'} the same as "
        f"{first['name']} on every tie-break ({'; '.join(facts)}), so the order of the candidate list "
        f"decides: {first['name']} comes first"
    )


#: The goodput statistics the recommendation can rank by, best first, and how the reasons name
#: each: the mean edge over seeds (``--seeds``, docs/sweeps.md), the edge of one search, the verified
#: goodput (a candidate without a search, such as the guide's variants).
_BASES = {"goodput_mean_rps": "mean edge over {seeds} seeds", "goodput_est_rps": "edge", "goodput_rps": ""}


def goodput_basis(cands: list[dict]) -> str:
    """The key of the first statistic of :data:`_BASES` that every one of ``cands`` has.

    One basis for the ranking, the table's per-GPU column and every reason: ranking by the mean
    over seeds while the reasons quoted the first seed's goodput is how a plan once recommended the
    candidate its own reasons showed behind. A candidate whose seeds did not all settle has no mean,
    and then no candidate is ranked by its mean (comparing one's mean with another's single seed
    mixes two statistics)."""
    for key in _BASES:
        if all(c.get(key) for c in cands):
            return key
    return "goodput_rps"


def basis_label(basis: str, p: dict) -> str:
    """How the reasons and the table name ``basis`` ("" for the verified goodput)."""
    return _BASES[basis].format(seeds=p.get("seeds") or 1)


def _basis_value(c: dict, basis: str) -> float:
    """``c``'s goodput (req/s, whole deployment) on ``basis``."""
    return c.get(basis) or c.get("goodput_rps") or 0.0


def per_gpu(c: dict, basis: str) -> float:
    """``c``'s goodput per GPU on ``basis`` (GPUs of the base scenario, as ``goodput_per_gpu_rps``)."""
    g = c.get("goodput_rps")
    return c["goodput_per_gpu_rps"] * _basis_value(c, basis) / g if g else c.get("goodput_per_gpu_rps", 0.0)


def noise_comparison(a: dict, b: dict, confidence: float) -> dict | None:
    """Paired goodput difference a − b over the seeds both searched (common random numbers:
    the same workload draws per seed), with its confidence interval; None without seeds."""
    # Without a mean the seed goodputs are not current (a seed that did not settle, or a candidate
    # re-planned at another constant by the break-even search, which keeps the nominal seeds).
    if not (a.get("goodput_mean_rps") and b.get("goodput_mean_rps")):
        return None
    sa = {s["seed"]: s for s in a.get("seed_goodputs") or [] if s["status"] == "ok"}
    sb = {s["seed"]: s for s in b.get("seed_goodputs") or [] if s["status"] == "ok"}
    common = sorted(set(sa) & set(sb))
    if len(common) < 2:
        return None
    m, lo, hi = mean_interval([sa[k]["goodput_est_rps"] - sb[k]["goodput_est_rps"] for k in common], confidence)
    return {"other": b["name"], "diff_rps": m, "ci_rps": [lo, hi], "seeds": len(common), "within_noise": lo <= 0 <= hi}


def one_line(text: object) -> str:
    """``text`` on one line (an exception's message may span several)."""
    return " ".join(str(text).split())


def problem_lines(p: dict) -> list[str]:
    """One line per candidate that was skipped or failed for a cause other than the SLO, with the cause."""
    lines = [f"skipped {s['name']}: {one_line(s['reason'])}" for s in p.get("skipped") or []]
    for c in p["candidates"]:
        if c["status"] == "failed":
            lines.append(f"failed {c['name']}: {one_line(c['message'])}")
        elif c["status"] not in ("ok", "infeasible"):
            lines.append(f"{c['name']}: no goodput ({c['status']}): {one_line(c['message'])}")
    return lines


_SLO_ADVICE = "relax the SLO, add memory (tensor parallelism) or shorten max_model_len"


def _no_recommendation(p: dict) -> dict:
    """Why nothing is recommended. The SLO advice is given only for candidates the SLO stopped: for
    one that crashed or was refused, relaxing the SLO changes nothing."""
    real = [c for c in p["candidates"] if not c.get("upper_bound")]
    slo_bound = [c for c in real if c["status"] == "infeasible"]
    other = [c["name"] for c in real if c["status"] not in ("ok", "infeasible")]
    other += [s["name"] for s in p.get("skipped") or []]
    reasons = [f"{c['name']} never meets the SLO: {c['message']}" for c in slo_bound]
    names = ", ".join(c["name"] for c in slo_bound)
    if slo_bound and not other:
        text = f"No candidate meets the SLO at any rate tried: {_SLO_ADVICE}."
    elif slo_bound:
        text = (
            f"No candidate meets the SLO: {names} {'never meets' if len(slo_bound) == 1 else 'never meet'} it at "
            f"any rate tried ({_SLO_ADVICE}); {', '.join(other)} "
            f"{'was' if len(other) == 1 else 'were'} not planned for another cause (listed above)."
        )
    elif other:
        text = (
            f"No recommendation: every candidate ({', '.join(other)}) failed or was skipped for a cause other "
            "than the SLO (listed above); relaxing the SLO would not help."
        )
    else:
        text = "No recommendation: only upper bounds were planned, and an upper bound is never recommended."
    reasons += _upper_bound_reasons(p, "goodput_rps")
    return {"candidate": None, "text": text, "reasons": reasons, "basis": None}


def recommend(p: dict) -> dict:
    """Pick a candidate and say why, in the seed article's terms, from the measured numbers.
    Upper-bound candidates (``upper_bound``) are reported, never picked."""
    feasible = [
        c for c in p["candidates"] if c["status"] == "ok" and c.get("goodput_rps", 0) > 0 and not c.get("upper_bound")
    ]
    if not feasible:
        return _no_recommendation(p)
    d = _Decision(p, feasible)
    reasons = _comparison_reasons(d) + _measure_reasons(d)
    text = _headline(d)
    text, noise = _noise(d, text, reasons)
    return {"candidate": d.best["name"], "text": text, "reasons": reasons, "noise": noise, "basis": d.basis}


def _jitter(c: dict) -> float:
    j = c["operating_point"].get("decode_jitter")
    return j if j is not None else math.inf


def _over_rule(c: dict) -> bool:
    return _jitter(c) > JITTER_RULE


def _rule_text(cs: list[dict], ref: dict) -> dict[str, str]:
    # At digits that print every jitter apart from the rule's 1.10 (1.1004 is above it, not at it).
    rule = {"name": "", "operating_point": {"decode_jitter": JITTER_RULE}}
    return _apart([*cs, rule], rule, _jitter, "", JITTER_RESOLUTION, decimals=2)


def _waste(c: dict) -> float:
    return c["operating_point"].get("memory_waste") or 0.0


def _unserved(c: dict) -> int:
    o = c["operating_point"]
    return o["rejected"] + (o.get("truncated") or 0)


def _unserved_share(c: dict) -> float:
    return round(_unserved(c) / max(c["operating_point"]["requests"], 1), 3)


class _Decision:
    """The recommendation's working state: the ranking basis, the pool the pick is made from (the
    fewest GPUs with a target rate, else every feasible candidate), its leader and the candidates
    tied with it, and the pick after the tie-break steps (:meth:`tie_steps`)."""

    def __init__(self, p: dict, feasible: list[dict]):
        self.p, self.feasible = p, feasible
        self.tol = p["tolerance"]
        self.target = p.get("target_rate")
        self.conf = p.get("confidence", DEFAULT_CONFIDENCE)
        self.basis = goodput_basis(feasible)
        label = basis_label(self.basis, p)
        self.named = f" ({label})" if label else ""
        if self.target:
            sized = [c for c in feasible if c.get("replicas_needed")]
            pool = sized or feasible
            fewest = min(c.get("gpus_needed") or math.inf for c in pool)
            pool = [c for c in pool if (c.get("gpus_needed") or math.inf) == fewest]
        else:
            pool = feasible
        self.pool = pool
        self.leader = max(pool, key=self.ranked)
        self.kinds = {c["name"]: self.tie_kind(c) for c in pool}
        self.tied = [c for c in pool if self.kinds[c["name"]]]
        self.steps = self.tie_steps()
        keep, self.decided = self.tied, []
        for step in self.steps:
            ref = step.best(keep)
            nxt = [c for c in keep if c is ref or step.same(ref, c)]
            if len(nxt) < len(keep):
                self.decided.append(step.clause(keep, ref, nxt))
            keep = nxt
        self.best = keep[0]
        if len(keep) > 1:
            self.decided.append(_list_order_clause(keep, self.steps))
        self.others = [c for c in feasible if c is not self.best]
        self.gpus = self.best.get("gpus_needed") if self.target else self.best["gpus"]

    def value(self, c: dict) -> float:
        return _basis_value(c, self.basis)

    def ranked(self, c: dict) -> float:
        return per_gpu(c, self.basis)

    def tie_kind(self, c: dict) -> str | None:
        """Why ``c`` ties with the leader (``None``: it does not). Goodputs within the search
        tolerance are a tie: the search cannot tell them apart. With seeds, so are those whose paired
        difference from the leader is within noise: the seeds cannot."""
        if c is self.leader:
            return "leader"
        if self.ranked(c) >= self.ranked(self.leader) / (1 + self.tol):
            return f"within the {self.tol:.0%} search tolerance"
        n = noise_comparison(self.leader, c, self.conf) if self.basis == "goodput_mean_rps" else None
        if n and n["within_noise"]:
            return (
                f"within noise over {n['seeds']} seeds (paired difference {n['diff_rps']:+.3g} req/s, "
                f"{self.conf:.0%} interval {n['ci_rps'][0]:+.3g} … {n['ci_rps'][1]:+.3g})"
            )
        return None

    def goodput_same(self, b: dict, c: dict) -> bool:
        if _within(self.ranked(b), self.ranked(c), GOODPUT_RESOLUTION, relative=True):
            return True
        n = noise_comparison(b, c, self.conf) if self.basis == "goodput_mean_rps" else None
        return bool(n and n["within_noise"])

    def tie_steps(self) -> list[TieStep]:
        """Among ties, in turn: fewer requests refused or cut short; higher goodput (the interpolated
        edges, since the brackets are only known to the tolerance); the article's jitter rule (a
        candidate within it over one above it, however close their jitters: the rule is the
        article's line, the resolution only says which gaps are noise); the article's preference for
        steady decode steps; less reserved-but-unused memory; the order of the candidate list (the
        simpler strategy first). Each step keeps the best of the candidates still in the running and
        every one that measures the same as that best (within the step's resolution of it: judged
        against the best, never from one kept candidate to the next, so that small gaps do not chain
        into a large one), so that differences smaller than the measurement can resolve do not decide."""
        named, seeds = self.named, self.basis == "goodput_mean_rps"
        return [
            TieStep(
                "fewer requests refused or truncated at the operating point",
                "refused or truncated",
                best=lambda cs: min(cs, key=_unserved_share),
                same=lambda b, c: _unserved_share(b) == _unserved_share(c),
                show=lambda cs, ref: {c["name"]: f"{_unserved(c)} of {c['operating_point']['requests']}" for c in cs},
                out="more than",
                within="",
            ),
            TieStep(
                f"higher goodput{named}",
                f"goodput{named}",
                best=lambda cs: max(cs, key=self.ranked),
                same=self.goodput_same,
                show=lambda cs, ref: _apart(cs, ref, self.value, "req/s", GOODPUT_RESOLUTION, relative=True),
                out=f"more than {GOODPUT_RESOLUTION:.0%} below" + (" and not within noise of" if seeds else ""),
                within=f"within {GOODPUT_RESOLUTION:.0%}" + (" or within noise" if seeds else ""),
            ),
            TieStep(
                f"the article's 10 % rule on decode jitter (p99/p50 at most {JITTER_RULE:.2f})",
                "",
                best=lambda cs: min(cs, key=_jitter),
                same=lambda b, c: _over_rule(b) == _over_rule(c),
                show=_rule_text,
                out="above the rule, unlike",
                within="",
            ),
            TieStep(
                "steadier decode steps (p99/p50)",
                "decode jitter",
                best=lambda cs: min(cs, key=_jitter),
                same=lambda b, c: _within(_jitter(b), _jitter(c), JITTER_RESOLUTION),
                show=lambda cs, ref: _apart(cs, ref, _jitter, "", JITTER_RESOLUTION, decimals=2),
                out=f"more than {JITTER_RESOLUTION:g} above",
                within=f"within {JITTER_RESOLUTION:g}",
            ),
            TieStep(
                "less memory waste",
                "memory waste",
                best=lambda cs: min(cs, key=_waste),
                same=lambda b, c: _within(_waste(b), _waste(c), WASTE_RESOLUTION),
                show=lambda cs, ref: _apart(cs, ref, _waste, "%", WASTE_RESOLUTION, percent=True),
                out="more than one point above",
                within="within one point",
            ),
        ]


def _comparison_reasons(d: _Decision) -> list[str]:
    """The GPU count, what binds, the tie and how the pick compares with every other candidate."""
    p, best, target, named, value = d.p, d.best, d.target, d.named, d.value
    op = best["operating_point"]
    reasons = []
    if target and best.get("replicas_needed"):
        n = best["replicas_needed"]
        fewer = f"{n - 1 or 'fewer'} replica(s) do not"
        if p.get("router") == "length_split" and n <= 2:
            fewer = "router length_split needs 2 at least (a pool for long prompts and one for the others)"
        reasons.append(
            f"{n} replica(s) × TP{p['tensor_parallel']} = {d.gpus} GPU(s) sustain "
            f"{target:g} req/s with {op['attainment']:.1%} of requests within the SLO "
            f"({p['slo_text']}); {fewer}"
        )
    target_share = p.get("attainment_target")
    binds = binding_line(best, p.get("replicas") or 1, target_share) if target_share else None
    if binds:
        reasons.append(f"{best['name']}: {binds}")
    if len(d.tied) > 1:
        why = "; ".join(f"{c['name']} is {d.kinds[c['name']]}" for c in d.tied if c is not d.leader)
        reasons.append(
            f"a tie on goodput{named}: {d.leader['name']} is the highest; {why} — {best['name']} is picked: "
            + "; ".join(d.decided)
        )
    for c in d.others:
        ratio = value(best) / value(c) if value(c) else math.inf
        more = "∞" if ratio == math.inf else f"{ratio:.3g}×"
        if lower_bound_mark(best) or lower_bound_mark(c):
            more = "ratio unknown: a lower bound"
        extra = f", needs {c['gpus_needed']} GPU(s)" if target and c.get("gpus_needed") else ""
        tie = "; a tie" if any(c is t for t in d.tied) else ""
        reasons.append(
            f"goodput{named} {lower_bound_mark(best)}{value(best):.3g} req/s vs {c['name']} "
            f"{lower_bound_mark(c)}{value(c):.3g} req/s ({more}{extra}{tie})"
        )
    for c in [best, *d.others]:
        if lower_bound_mark(c):
            reasons.append(f"{c['name']}: {c['message']} (marked ≥ in the table)")
    for c in p["candidates"]:
        if c["status"] == "infeasible" and not c.get("upper_bound"):
            reasons.append(f"{c['name']} never meets the SLO: {c['message']}")
    return reasons + _upper_bound_reasons(p, d.basis)


def _measure_reasons(d: _Decision) -> list[str]:
    """The article's measures at each operating point: waste, reservations, fragmentation, jitter,
    refusals, preemptions."""
    best, everyone = d.best, [d.best, *d.others]
    op = best["operating_point"]
    reasons = []
    wastes = ", ".join(f"{c['name']} {pct(c['operating_point'].get('memory_waste'))}" for c in everyone)
    reasons.append(f"memory waste (reserved but unused KV, time-weighted) at each operating point: {wastes}")
    statics = [c for c in everyone if c["overrides"].get("allocator.kind") == "static"]
    if statics:
        s = statics[0]
        rt = s["operating_point"].get("reserve_tokens")
        if rt:
            reasons.append(
                f"{s['name']} reserves {rt} tokens per request up front: the article's 'memory you can't use' "
                f"— it caps concurrency at capacity ÷ reservation whatever the real lengths"
            )
    frag = ", ".join(
        f"{c['name']} {pct(c['operating_point'].get('external_frag_mean'))} "
        f"(max {pct(c['operating_point'].get('external_frag_max'))})"
        for c in everyone
    )
    reasons.append(f"external fragmentation (1 − largest free extent / free, time-weighted mean): {frag}")
    jitter = _jitter_reason(d)
    if jitter:
        reasons.append(jitter)
    for c in d.others:
        o = c["operating_point"]
        if o["rejected"] or o.get("truncated"):
            reasons.append(
                f"{c['name']} refuses {o['rejected']} and truncates {o.get('truncated') or 0} of "
                f"{o['requests']} requests at its operating point (the cost of a length ceiling)"
            )
    reasons.append(
        f"at the operating point: {op['preemptions']} preemptions, {op['rejected']} rejected"
        + (f" ({', '.join(f'{k}: {v}' for k, v in op['rejected_by_reason'].items())})" if op["rejected"] else "")
        + (f", {op['truncated']} truncated" if op.get("truncated") else "")
    )
    return reasons


def _jitter_reason(d: _Decision) -> str | None:
    """Decode-step jitter at each operating point against the article's 10 % rule, and what it means."""
    best, target, named, value = d.best, d.target, d.named, d.value
    everyone = [best, *d.others]
    jit = ", ".join(
        f"{c['name']} {jitter_text(c['operating_point']['decode_jitter'])}"
        for c in everyone
        if c["operating_point"].get("decode_jitter") is not None
    )
    if not jit:
        return None
    over = [c for c in everyone if (c["operating_point"].get("decode_jitter") or 0) > JITTER_RULE]
    under = [c for c in everyone if c not in over and c["operating_point"].get("decode_jitter") is not None]

    def batch(c):
        o = c["operating_point"]
        return f"{o['decode_batch_p50']:.0f}–{o['decode_batch_p99']:.0f}"

    charged = {c["name"]: c["operating_point"].get("allocation_time_s") or 0.0 for c in everyone}
    alloc_note = (
        "the cost model charged no allocation work in these runs"
        if not any(charged.values())
        else "allocation work charged (s, whole run): " + ", ".join(f"{k} {v:.3g}" for k, v in charged.items())
    )
    if not over:
        note = "all within the article's 10 % rule, so jitter does not call for static"
    elif not under:
        note = (
            "every strategy exceeds the article's 10 % rule, so the spikes come from batch composition, "
            "not from allocation: static would not remove them"
        )
    elif best not in over:
        note = f"{best['name']} is within the article's 10 % rule; above it: {', '.join(c['name'] for c in over)}"
    else:
        u = max(under, key=value)
        if d.goodput_same(best, u):
            # No goodput to trade: what kept u out is a tie-break before the rule, or its GPU count.
            if any(c is u for c in d.tied):
                why_not = f"; {best['name']} is picked on the tie-break above"
            elif target and u.get("gpus_needed") != best.get("gpus_needed"):
                why_not = f", but needs {u.get('gpus_needed') or 'more'} GPU(s) against {d.gpus}"
            else:
                why_not = ""
            trade = (
                f"{u['name']} stays within the rule at the same goodput{named} ({value(u):.3g} vs "
                f"{value(best):.3g} req/s, within {GOODPUT_RESOLUTION:.0%}){why_not}"
            )
        else:
            trade = (
                f"{u['name']} stays within the rule; choose it only if steady decode steps matter more "
                f"than goodput{named} ({value(u):.3g} vs {value(best):.3g} req/s)"
            )
        note = (
            f"{best['name']} is above the article's 10 % rule. Decode batch (p50–p99 sequences): "
            + ", ".join(f"{c['name']} {batch(c)}" for c in everyone)
            + f": the step time follows the batch size; {alloc_note}. {trade}"
        )
    return f"decode-step jitter p99/p50: {jit} — {note}"


def _headline(d: _Decision) -> str:
    """``Use X — strategy (set knobs) on GPU: how many``, and what the pick refuses or truncates."""
    p, best, target, basis, gpus = d.p, d.best, d.target, d.basis, d.gpus
    knobs = ", ".join(f"{k}={v}" for k, v in best["overrides"].items())
    if target:
        how_many = (
            f"{best['replicas_needed']} replica(s), {gpus} GPU(s) for {target:g} req/s"
            if best.get("replicas_needed")
            else f"more than {p.get('max_replicas', 256)} replicas"
        )
    elif lower_bound_mark(best):
        # The search never found a rate that misses: no capacity, only a floor under it.
        why = _LOWER_BOUND_WHY.get(best.get("search_status", ""), "")
        how_many = (
            f"{best['gpus']} GPU(s) serve at least {best['goodput_rps']:.3g} req/s within the SLO — a lower "
            f"bound, not a capacity ({why}), so no GPU count follows from it: check a rate with --target-rate"
        )
    else:
        # The verified goodput, not the ranking basis: a complete run at this rate met the target.
        edge = _basis_value(best, basis)
        # The reasons compare the ranking statistic (the interpolated edge): say why two rates appear.
        edge_note = (
            f" (the highest rate a complete run met; the reasons compare the {basis_label(basis, p)}, "
            f"{edge:.3g} req/s, interpolated between it and the first rate that missed)"
            if basis != "goodput_rps" and f"{edge:.3g}" != f"{best['goodput_rps']:.3g}"
            else ""
        )
        how_many = (
            f"{best['gpus']} GPU(s) serve up to {best['goodput_rps']:.3g} req/s within the SLO{edge_note}; "
            f"for a rate R plan ⌈R / {best['goodput_per_gpu_rps']:.3g}⌉ GPUs (check with --target-rate)"
        )
    text = f"Use {best['name']} — {best['strategy']} (set {knobs}) on {p['gpu']}: {how_many}."
    o = best.get("operating_point") or {}
    if o.get("rejected") or o.get("truncated"):
        # Refused and truncated requests only count as SLO misses: a length ceiling can win within
        # the SLO's slack by not serving its longest requests, which the headline must say.
        text += (
            f" It does so by refusing {o.get('rejected') or 0} and truncating {o.get('truncated') or 0} of "
            f"{o.get('requests')} requests at its operating point: serve them and compare the others."
        )
    return text


def _noise(d: _Decision, text: str, reasons: list[str]) -> tuple[str, list[dict]]:
    """With seeds: the headline names the candidates within noise of the pick, and a reason line per
    paired comparison goes first (``reasons`` is changed in place)."""
    best, pool, conf, value = d.best, d.pool, d.conf, d.value
    noise = [n for n in (noise_comparison(best, c, conf) for c in pool if c is not best) if n is not None]
    close = [n for n in noise if n["within_noise"]]
    if close:
        text += (
            " Within noise of "
            + ", ".join(
                f"{n['other']} (goodput difference {n['diff_rps']:+.2g} req/s, {conf:.0%} interval "
                f"{n['ci_rps'][0]:+.2g} … {n['ci_rps'][1]:+.2g} over {n['seeds']} seeds)"
                for n in close
            )
            + ": the seeds do not separate them."
        )
    by_name = {c["name"]: c for c in pool}
    for n in noise:
        # A real difference below the goodput tie-break's resolution does not decide: said so here,
        # beside the tie line that shows what did.
        share = abs(n["diff_rps"]) / max(value(best), value(by_name[n["other"]]), 1e-300)
        verdict = (
            "within noise"
            if n["within_noise"]
            else "a real difference"
            + (
                f", but {share:.1%} of the goodput: less than the {GOODPUT_RESOLUTION:.0%} the goodput "
                "tie-break acts on"
                if share <= GOODPUT_RESOLUTION
                else ""
            )
        )
        reasons.insert(
            0,
            f"{best['name']} − {n['other']} goodput: {n['diff_rps']:+.3g} req/s, {conf:.0%} interval "
            f"{n['ci_rps'][0]:+.3g} … {n['ci_rps'][1]:+.3g} over {n['seeds']} seeds (same workloads per "
            f"seed) — {verdict}",
        )
    return text, noise
