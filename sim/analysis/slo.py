"""Service-level objectives and their attainment over a run's requests.

Definitions (DistServe, Zhong et al. 2024, §2):

* A request **meets** the SLO when it completed without truncation, its TTFT (first token −
  arrival, s) is ≤ the TTFT bound, and its TPOT ((finish − first token) / (generated − 1), s)
  is ≤ the TPOT bound. A request that generated a single token has no TPOT and meets that
  bound trivially. Rejected requests and truncated ones (a static reservation's ``truncate``
  overflow) are **misses**: the user did not get the answer.
* **Attainment** = requests meeting the SLO ÷ all requests of the run (rejected included).
* An SLO written ``ttft_p90_s=0.5`` means: the request-level TTFT bound is 0.5 s, and the
  percentile in the name is the attainment target (0.9): "90 % of requests must meet every
  bound". The target is shared by all bounds (attainment is joint), so their percentiles must
  agree, or ``--attainment`` must say which target to use; ``ttft_s=0.5`` (no percentile) takes
  ``--attainment`` or the default 0.9.
* **Two classes** (``long:ttft_p90_s=5`` with ``--long-prompt-tokens 8192``): a request whose prompt
  has at least that many tokens meets the ``long:`` bounds where they are given, and the others
  where not; every other request meets the others. Attainment stays one share of all requests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from sim.errors import ConfigError
from sim.limits import MAX_TOKENS

DEFAULT_ATTAINMENT = 0.9
_METRICS = ("ttft", "tpot", "e2e")
_BOUND = "a finite latency bound in seconds (> 0)"
_SLO_RE = re.compile(r"^(ttft|tpot|e2e)(?:_p(\d{1,2}(?:\.\d+)?))?_s$")


@dataclass(frozen=True)
class SLO:
    """Per-request latency bounds (s; ``None`` = no bound) and the attainment target (0–1]; with
    ``long_prompt_tokens``, the ``long_*`` bounds replace the others for requests whose prompt has
    at least that many tokens (``None``: the other bound holds for them too)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    attainment: float = DEFAULT_ATTAINMENT
    long_prompt_tokens: int | None = None
    long_ttft_s: float | None = None
    long_tpot_s: float | None = None
    long_e2e_s: float | None = None

    def bound(self, metric: str, prompt_tokens: int) -> float | None:
        """The ``metric`` bound (s) of a request with ``prompt_tokens`` prompt tokens (``None``: none)."""
        if self.long_prompt_tokens is not None and prompt_tokens >= self.long_prompt_tokens:
            v = getattr(self, f"long_{metric}_s")
            if v is not None:
                return v
        return getattr(self, f"{metric}_s")

    def bounds(self, metric: str, prompt_tokens: np.ndarray) -> np.ndarray | None:
        """:meth:`bound` per request (``inf`` where a request has none); ``None`` when none has one."""
        general = getattr(self, f"{metric}_s")
        long = getattr(self, f"long_{metric}_s") if self.long_prompt_tokens is not None else None
        if general is None and long is None:
            return None
        out = np.full(len(prompt_tokens), math.inf if general is None else float(general))
        if long is not None:
            out[prompt_tokens >= self.long_prompt_tokens] = float(long)
        return out

    def describe(self) -> str:
        bounds = [
            f"{m.upper()} ≤ {getattr(self, m + '_s'):g} s" for m in _METRICS if getattr(self, m + "_s") is not None
        ]
        text = f"{percent_text(self.attainment)} of requests with " + (" and ".join(bounds) or "no bound")
        longs = [
            f"{m.upper()} ≤ {getattr(self, f'long_{m}_s'):g} s"
            for m in _METRICS
            if getattr(self, f"long_{m}_s") is not None
        ]
        if self.long_prompt_tokens is not None and longs:
            text += f" (prompts of {self.long_prompt_tokens}+ tokens: " + " and ".join(longs) + ")"
        return text

    def as_dict(self) -> dict:
        return {
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "e2e_s": self.e2e_s,
            "attainment": self.attainment,
            "long_prompt_tokens": self.long_prompt_tokens,
            "long_ttft_s": self.long_ttft_s,
            "long_tpot_s": self.long_tpot_s,
            "long_e2e_s": self.long_e2e_s,
        }


def percent_text(fraction: float) -> str:
    """``0.999`` → ``"99.9%"``: every digit the target has, since rounding to whole percents would
    print a 99.9 % target as 100 %."""
    # 12 significant digits drop the float noise of the ×100 (0.9 × 100 = 90.00000000000001).
    return f"{fraction * 100:.12g}%"


@dataclass(frozen=True)
class _Names:
    """How the user spelled the SLO, for the errors: command-line flags or a sweep file's keys."""

    slo: str
    attainment: str
    long_tokens: str
    example: str
    long_example: str
    #: ``True``: entries are ``key: value`` under ``slo`` (``long`` a mapping of its own); else ``KEY=VALUE``.
    mapping: bool = False

    def entry(self, key: str, is_long: bool) -> str:
        if self.mapping:
            return f"{self.slo}.{'long.' if is_long else ''}{key}"
        return f"{self.slo} {'long:' if is_long else ''}{key}"

    def item(self, key: str, is_long: bool, raw: object) -> str:
        return f"{self.entry(key, is_long)}: {raw}" if self.mapping else f"{'long:' if is_long else ''}{key}={raw}"

    def named(self, key: str, is_long: bool) -> str:
        return self.entry(key, is_long) if self.mapping else f"{'long:' if is_long else ''}{key}"


_FLAGS = _Names(
    "--slo",
    "--attainment",
    "--long-prompt-tokens",
    "--slo ttft_p90_s=0.5 --slo tpot_p90_s=0.05",
    "--slo long:ttft_p90_s=5",
)
_SWEEP = _Names(
    "slo",
    "slo.attainment",
    "slo.long_prompt_tokens",
    "slo: {ttft_p90_s: 0.5, tpot_p90_s: 0.05}",
    "slo.long: {ttft_p90_s: 5}",
    mapping=True,
)
#: The keys of a sweep file's ``slo`` mapping besides the bounds.
SLO_MAPPING_KEYS = ("attainment", "long_prompt_tokens", "long")


def parse_slos(items: list[str], attainment: float | None = None, long_prompt_tokens: int | None = None) -> SLO:
    """``["ttft_p90_s=0.5", "tpot_p90_s=0.05", "long:ttft_p90_s=5"]`` → :class:`SLO` (see the module
    docstring); ``long:`` entries need ``long_prompt_tokens`` (``--long-prompt-tokens``)."""
    entries = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        is_long = key.startswith("long:")
        key = key.removeprefix("long:").strip()
        if not sep or _SLO_RE.match(key) is None:
            raise ConfigError(
                "--slo",
                item,
                "METRIC=SECONDS with METRIC one of ttft_s, tpot_s, e2e_s, "
                "optionally with a percentile: ttft_p90_s, tpot_p99_s, and long: in front for the "
                "bound of long prompts (--long-prompt-tokens)",
            )
        entries.append((key, is_long, raw))
    return _build(entries, attainment, long_prompt_tokens, _FLAGS)


def slo_from_mapping(data: object) -> SLO:
    """A sweep file's ``slo`` mapping → :class:`SLO`: the bounds as keys (``ttft_p90_s: 0.5``),
    optionally ``attainment``, ``long_prompt_tokens`` and ``long`` (a mapping of bounds for long
    prompts), read as :func:`parse_slos` reads the flags; errors name ``slo.<key>``."""
    what = (
        "a mapping of latency bounds in seconds, e.g. slo: {ttft_p90_s: 0.5, tpot_p90_s: 0.05}, optionally "
        "with attainment, long_prompt_tokens and long: {ttft_p90_s: 5}"
    )
    if not isinstance(data, dict):
        raise ConfigError("slo", data, what)
    allowed = "ttft_s, tpot_s, e2e_s, optionally with a percentile (ttft_p90_s, tpot_p99_s); " + ", ".join(
        SLO_MAPPING_KEYS
    )
    entries: list[tuple[str, bool, object]] = []
    long = data.get("long")
    if long is not None and not isinstance(long, dict):
        raise ConfigError("slo.long", long, "a mapping of bounds for long prompts, e.g. {ttft_p90_s: 5}")
    for is_long, section in ((False, data), (True, long or {})):
        for key, raw in section.items():
            if not is_long and key in SLO_MAPPING_KEYS:
                continue
            if not isinstance(key, str) or _SLO_RE.match(key) is None:
                where = "slo.long" if is_long else "slo"
                raise ConfigError(
                    f"{where}.{key}", raw, "a bound named " + (allowed.split(";")[0] if is_long else allowed)
                )
            entries.append((key, is_long, raw))
    attainment = data.get("attainment")
    if attainment is not None and (isinstance(attainment, bool) or not isinstance(attainment, (int, float))):
        raise ConfigError("slo.attainment", attainment, "a fraction of requests in (0, 1]")
    tokens = data.get("long_prompt_tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)):
        raise ConfigError("slo.long_prompt_tokens", tokens, f"an integer in [1, {MAX_TOKENS}]")
    return _build(entries, attainment, tokens, _SWEEP)


def _build(
    entries: Sequence[tuple[str, bool, object]], attainment: float | None, long_prompt_tokens: int | None, names: _Names
) -> SLO:
    """The checks and the :class:`SLO` of :func:`parse_slos` and :func:`slo_from_mapping`:
    ``entries`` are ``(bound key, for long prompts, value as given)`` with keys already matched."""
    bounds: dict[str, float] = {}
    long_bounds: dict[str, float] = {}
    percentiles: set[float] = set()
    with_percentile: list[str] = []
    for key, is_long, raw in entries:
        m = _SLO_RE.match(key)
        assert m is not None
        try:
            value = float(raw) if not isinstance(raw, bool) else math.nan  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ConfigError(names.entry(key, is_long), raw, _BOUND) from None
        # An infinite bound is no bound: every rate would meet it, and plan.json cannot hold it.
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(names.entry(key, is_long), raw, _BOUND)
        target = long_bounds if is_long else bounds
        if m.group(1) in target:
            raise ConfigError(
                names.slo, names.item(key, is_long, raw), f"one bound per metric ({m.group(1)} given twice)"
            )
        target[m.group(1)] = value
        if m.group(2) is not None:
            pct = float(m.group(2))
            if not pct > 0:
                # Checked here, not as the attainment below: the user typed this entry, not that one.
                raise ConfigError(
                    names.slo,
                    names.item(key, is_long, raw),
                    "a percentile in (0, 100) in the name, the share of requests that must meet the "
                    "bound, e.g. ttft_p90_s",
                )
            percentiles.add(pct / 100.0)
            with_percentile.append(names.named(key, is_long))
    if not bounds and not long_bounds:
        raise ConfigError(names.slo, None, f"at least one bound, e.g. {names.example}")
    if long_prompt_tokens is not None:
        if isinstance(long_prompt_tokens, bool) or not 1 <= long_prompt_tokens <= MAX_TOKENS:
            raise ConfigError(names.long_tokens, long_prompt_tokens, f"an integer in [1, {MAX_TOKENS}]")
        if not long_bounds:
            raise ConfigError(
                names.long_tokens,
                long_prompt_tokens,
                f"given with at least one bound for long prompts, e.g. {names.long_example}",
            )
    elif long_bounds:
        raise ConfigError(
            names.slo,
            ", ".join(names.named(k, True) for k in long_bounds),
            f"bounds for long prompts with {names.long_tokens}{'' if names.mapping else ' N'}, the prompt length "
            "(tokens) from which a request is long",
        )
    if attainment is None:
        if len(percentiles) > 1:
            raise ConfigError(
                names.slo,
                ", ".join(with_percentile),
                "one percentile for all bounds (the SLO is joint: one share of requests meets every "
                f"bound), e.g. ttft_p90_s and tpot_p90_s; or give {names.attainment}, which overrides them",
            )
        attainment = percentiles.pop() if percentiles else DEFAULT_ATTAINMENT
    if not 0 < attainment <= 1:
        raise ConfigError(names.attainment, attainment, "a fraction of requests in (0, 1]")
    return SLO(
        ttft_s=bounds.get("ttft"),
        tpot_s=bounds.get("tpot"),
        e2e_s=bounds.get("e2e"),
        attainment=attainment,
        long_prompt_tokens=long_prompt_tokens,
        long_ttft_s=long_bounds.get("ttft"),
        long_tpot_s=long_bounds.get("tpot"),
        long_e2e_s=long_bounds.get("e2e"),
    )


def _latencies(requests: pa.Table, slo: SLO) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``(metric, latency s, bound s)`` per request for each metric the SLO bounds."""
    from sim.analysis.columns import column

    arrival = column(requests, "arrival_s")
    first = column(requests, "first_token_s")
    finish = column(requests, "finish_s")
    gen = column(requests, "generated_tokens")
    # Read only where the SLO has classes: a table of latencies alone needs no prompt lengths.
    prompt = (
        column(requests, "prompt_tokens")
        if slo.long_prompt_tokens is not None
        else np.zeros(requests.num_rows, dtype=np.int64)
    )
    out = []
    for metric in _METRICS:
        bound = slo.bounds(metric, prompt)
        if bound is None:
            continue
        if metric == "ttft":
            lat = first - arrival
        elif metric == "tpot":
            with np.errstate(divide="ignore", invalid="ignore"):
                lat = np.where(gen > 1, (finish - first) / np.maximum(gen - 1, 1), 0.0)
        else:
            lat = finish - arrival
        out.append((metric, lat, bound))
    return out


def meets(requests: pa.Table, slo: SLO) -> np.ndarray:
    """Boolean per request row: completed, not truncated, and within every bound."""
    status = np.asarray(requests.column("status").to_pylist())
    truncated = np.asarray(requests.column("truncated").to_pylist(), dtype=bool)
    ok = (status == "completed") & ~truncated
    for _, lat, bound in _latencies(requests, slo):
        ok &= lat <= bound
    return ok


def miss_shares(requests: pa.Table, slo: SLO) -> dict[str, float]:
    """Share of all requests that miss the SLO, by cause: ``refused`` (not completed), ``truncated``,
    and for requests completed whole each bound they exceed (``ttft``, ``tpot``, ``e2e``, where the
    SLO has it; one request may exceed several). Empty for an empty run."""
    n = requests.num_rows
    if not n:
        return {}
    status = np.asarray(requests.column("status").to_pylist())
    done = status == "completed"
    truncated = np.asarray(requests.column("truncated").to_pylist(), dtype=bool)
    out = {"refused": float((~done).sum()) / n, "truncated": float((done & truncated).sum()) / n}
    done &= ~truncated
    for metric, lat, bound in _latencies(requests, slo):
        out[metric] = float((done & (lat > bound)).sum()) / n
    return out


def attainment(requests: pa.Table, slo: SLO) -> float:
    """Fraction of all requests that meet ``slo`` (0 for an empty run)."""
    n = requests.num_rows
    return float(meets(requests, slo).sum()) / n if n else 0.0


def slo_columns(requests: pa.Table, slo: SLO) -> dict[str, float | bool | None]:
    """A run's SLO figures as a sweep's dataset holds them: ``slo.attainment`` (share of all
    requests meeting the SLO), ``slo.met`` (attainment ≥ the target), ``slo.miss.<cause>``
    (:func:`miss_shares`) and, with classes, ``slo.attainment.long`` / ``slo.attainment.short``:
    the share of long-prompt (other) requests meeting their bounds (``None`` where the run has none)."""
    ok = meets(requests, slo)
    n = requests.num_rows
    share = float(ok.sum()) / n if n else 0.0
    out: dict[str, float | bool | None] = {"slo.attainment": share, "slo.met": bool(n) and share >= slo.attainment}
    out.update({f"slo.miss.{k}": v for k, v in miss_shares(requests, slo).items()})
    if slo.long_prompt_tokens is not None:
        from sim.analysis.columns import column

        long = column(requests, "prompt_tokens") >= slo.long_prompt_tokens
        for name, rows in (("long", long), ("short", ~long)):
            out[f"slo.attainment.{name}"] = float(ok[rows].mean()) if rows.any() else None
    return out
