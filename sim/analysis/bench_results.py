"""Result files of ``vllm bench serve --save-result --save-detailed``, read and checked.

A file is one JSON object: a header (``backend, model_id, date, num_prompts, request_rate`` — a
number or the string ``"inf"`` —, ``burstiness, max_concurrency, duration``, aggregate
``mean_/median_/std_/pNN_{ttft,tpot,itl,e2el}_ms``) and, with ``--save-detailed``, one entry
per request in ``input_lens, output_lens, ttfts, itls, errors`` (and ``generated_texts``). vLLM
0.12 saves no send times; later versions add ``start_times`` (``time.perf_counter()`` of each
request's send, any origin) and ``latencies``, which are used when present. Times in the
per-request lists are seconds; the aggregates are milliseconds.

Semantics (vLLM ``benchmarks/serve.py``): a request succeeded when its ``errors`` entry is
empty; TTFT runs from the client's send (after the ``--max-concurrency`` semaphore) to the
first streamed chunk; ``itls[i]`` are the gaps between successive chunks; TPOT is
``(latency − ttft) / (output_len − 1)`` for ``output_len > 1``, and ``latency − ttft`` is the sum
of the request's ITLs when ``latencies`` is absent.

Left out and counted, besides failed requests: requests with ``output_lens[i] = 0``. A request
that ended before its first token has no TTFT or TPOT to compare; it is what vLLM records for a
failed request, which a file without ``errors`` (or with ``errors: null``) cannot tell apart from
a successful one. A file with no request left is refused. A ``num_prompts`` other than the
number of entries is a warning (:attr:`BenchResult.warnings`); the entries are read. A file of
several results, one JSON document per line (``--append-result``, SGLang's JSONL), is read with an
``index``, and refused without one.

Times (per-request ones and ``duration``) are at most :data:`~sim.limits.MAX_TIME_S`; a larger
finite one overflowed the statistics into inf and nan. The header's throughputs
(:data:`THROUGHPUT_FIELDS`), which ``kvsim compare`` reports as measured, are positive numbers when
present (absent or null: computed from the lists over ``duration``).

Every problem is a :class:`ConfigError` whose key names the file and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.errors import ConfigError
from sim.inputs import check_json_depth, number_error, read_text
from sim.limits import MAX_CV, MAX_RATE, MAX_REQUESTS, MAX_TIME_S, MAX_TOKENS

#: Bytes of one result file: a detailed run of many requests keeps every inter-token gap (and
#: possibly the generated texts), far more than the 64 MiB of other input files.
MAX_RESULT_BYTES = 2**30

#: The per-request lists ``kvsim compare`` needs.
REQUIRED_LISTS = ("input_lens", "output_lens", "ttfts", "itls")
#: The header's throughputs ``kvsim compare`` reports as measured: unit and largest value (a fleet's
#: request rate, and that many requests of the longest length per second).
THROUGHPUT_FIELDS = {
    "request_throughput": ("requests/s", MAX_RATE),
    "output_throughput": ("output tokens/s", MAX_RATE * MAX_TOKENS),
    "total_token_throughput": ("total tokens/s", MAX_RATE * MAX_TOKENS),
}
_DETAILED = "a result saved with vllm bench serve --save-result --save-detailed"


@dataclass(frozen=True)
class BenchResult:
    """One benchmark run: its arrival process and the successful requests, in the file's order.

    Seconds throughout; ``None`` where the file does not say."""

    path: Path
    header: dict
    #: ``inf`` when every request was sent at once (``"inf"`` in the file).
    request_rate: float
    burstiness: float
    max_concurrency: int | None
    #: Requests in the file, those that failed, and the successful ones without an output token
    #: (``output_lens[i] = 0``); the last two are left out of everything below.
    num_requests: int
    failed: int
    no_output: int
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    ttft_s: np.ndarray
    #: Per request, the gaps between its streamed chunks.
    itl_s: tuple[np.ndarray, ...]
    #: First chunk to last chunk, per request (``latencies − ttfts``, or the sum of its ITLs).
    decode_s: np.ndarray
    #: Send times from the first send, when the file has ``start_times``.
    start_s: np.ndarray | None
    duration_s: float | None
    #: What was read despite a doubt (one line each): a ``num_prompts`` that differs from the entries.
    warnings: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    @property
    def name(self) -> str:
        return self.path.name

    def tpot_s(self) -> np.ndarray:
        """Per request with more than one output token: ``(latency − ttft) / (output_len − 1)``."""
        multi = self.output_tokens > 1
        return self.decode_s[multi] / (self.output_tokens[multi] - 1)

    def itl_flat_s(self) -> np.ndarray:
        return np.concatenate(self.itl_s) if self.itl_s else np.zeros(0)

    def e2el_s(self) -> np.ndarray:
        return self.ttft_s + self.decode_s


def result_files(paths: list[Path]) -> list[Path]:
    """The result files among ``paths``: files as given, and the ``*.json`` of folders (sorted;
    the ``*.pytorch.json`` companions vLLM writes beside them are skipped)."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(q for q in p.glob("*.json") if not q.name.endswith(".pytorch.json") and q.is_file())
            if not found:
                raise ConfigError(
                    str(p),
                    "a folder without *.json files",
                    "a result file or a folder of them (vllm bench serve --save-result --save-detailed)",
                )
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise ConfigError(
                str(p),
                "no such file or folder",
                "a result file or a folder of them (vllm bench serve --save-result --save-detailed)",
            )
    return out


def _number(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x)


def parse_request_rate(path: Path, doc: dict, field: str, default: float | None) -> float | None:
    """``doc[field]``, a result's request rate (or burstiness) as every reader of result files takes
    it (``kvsim compare``, ``kvsim calibrate``): a positive number or ``"inf"`` (as vLLM writes an
    infinite rate); ``default`` where absent or null."""
    if field not in doc or doc[field] is None:
        return default
    v = doc[field]
    if isinstance(v, str) and v.strip().lower() in ("inf", "infinity"):
        return math.inf
    f = _number(v)
    if f is None or not f > 0 or math.isnan(f):
        raise ConfigError(f"{path}: {field}", v, 'a number > 0 or "inf"')
    return f


def _list(path: Path, doc: dict, field: str, n: int | None) -> list:
    if field not in doc:
        raise ConfigError(f"{path}: {field}", "missing", f"a list with one entry per request ({_DETAILED})")
    v = doc[field]
    if not isinstance(v, list):
        raise ConfigError(f"{path}: {field}", type(v).__name__, "a list with one entry per request")
    if n is not None and len(v) != n:
        raise ConfigError(f"{path}: {field}", f"{len(v)} entries", f"one per request, like input_lens ({n})")
    return v


def _tokens(path: Path, field: str, values: list, rows: list[int], minimum: int, note: str = "") -> np.ndarray:
    """Token counts at ``rows`` of ``values``, integers in ``[minimum, MAX_TOKENS]``."""
    out = np.empty(len(rows), dtype=np.int64)
    for j, i in enumerate(rows):
        v = values[i]
        f = _number(v)
        # isfinite first: math.floor of an inf (JSON's Infinity) raises instead of comparing.
        if f is None or not math.isfinite(f) or f != math.floor(f) or not minimum <= f <= MAX_TOKENS:
            raise ConfigError(f"{path}: {field}[{i}]", v, f"an integer token count in [{minimum}, {MAX_TOKENS}]{note}")
        out[j] = int(f)
    return out


def _seconds(path: Path, field: str, v, i, positive: bool) -> float:
    """A time of one request, at most :data:`MAX_TIME_S` (a larger one overflowed the statistics)."""
    f = _number(v)
    if f is None or not math.isfinite(f) or f < 0 or (positive and f == 0) or f > MAX_TIME_S:
        raise ConfigError(
            f"{path}: {field}[{i}]",
            v,
            f"a finite time in seconds {'> 0' if positive else '>= 0'}, at most {MAX_TIME_S:g}",
        )
    return f


def _header_number(path: Path, doc: dict, field: str, upper: float, what: str) -> float | None:
    """A header number in ``(0, upper]``; ``None`` when absent or null."""
    v = doc.get(field)
    if v is None:
        return None
    f = _number(v)
    if f is None or not 0 < f <= upper:  # NaN compares false
        raise ConfigError(f"{path}: {field}", v, f"a number in (0, {upper:g}] {what}")
    return f


def _gaps(path: Path, i: int, row: list) -> np.ndarray:
    """``itls[i]`` as float64 seconds; a value that is not a number in ``[0, MAX_TIME_S]`` is named."""
    try:
        arr = np.asarray(row) if row else np.zeros(0)
    except (ValueError, TypeError):  # ragged nesting
        arr = np.zeros((0, 0))
    if arr.ndim == 1 and arr.dtype.kind in "iuf":
        arr = arr.astype(np.float64)
        if np.isfinite(arr).all() and (arr >= 0).all() and (arr <= MAX_TIME_S).all():
            return arr
    for j, g in enumerate(row):  # find the first bad one for the message
        _seconds(path, f"itls[{i}]", g, j, False)
    raise ConfigError(
        f"{path}: itls[{i}]", row[:3], "a list of gaps in seconds"
    )  # not reached: a bad value is named above


def json_documents(
    text: str, *, one_per_line: bool = False, parse: Callable[[str, int], Any] | None = None
) -> list[tuple[int, Any]]:
    """The JSON documents of a file holding several (``--append-result`` appends a result per line,
    SGLang's ``bench_serving`` writes JSONL), each with the 1-based line it starts on.

    Default: values one after another anywhere in ``text`` (white space between), parsed by
    ``json.JSONDecoder.raw_decode``; the first that does not parse raises its JSONDecodeError (line
    and column in the whole text). ``one_per_line``: each non-blank line is one document, parsed by
    ``parse(line, number)`` (default ``json.loads``), so a caller's bounded parser names the line in
    its own errors.
    """
    if one_per_line:
        load = parse or (lambda line, number: json.loads(line))
        return [(i + 1, load(ln, i + 1)) for i, ln in enumerate(text.splitlines()) if ln.strip()]
    dec = json.JSONDecoder()
    out: list[tuple[int, Any]] = []
    i, n, line, counted = 0, len(text), 1, 0
    while True:
        while i < n and text[i] in " \t\r\n\ufeff":
            i += 1
        if i >= n:
            return out
        line += text.count("\n", counted, i)  # counted from the last value's start: linear in the text
        counted = i
        doc, i = dec.raw_decode(text, i)
        out.append((line, doc))


def read_bench_result(path: Path, index: int | None = None) -> BenchResult:
    """Read and check one result file (see the module docstring); ``index``: which result of a file
    holding several, one per line (0-based; a file with more than one needs it)."""
    # Bounded (sim/inputs.py): a regular UTF-8 file of at most MAX_RESULT_BYTES, nested at most
    # MAX_NESTING levels, checked on the text before parsing (a deeply nested file raised
    # RecursionError).
    text = read_text(path, str(path), "JSON result file", MAX_RESULT_BYTES)
    check_json_depth(text, str(path), str(path))
    try:
        try:
            docs = [json.loads(text)]
        except json.JSONDecodeError as first:
            if first.msg != "Extra data":
                raise
            docs = [doc for _, doc in json_documents(text)]  # several results, one per line
    except json.JSONDecodeError as exc:
        raise ConfigError(
            str(path), f"invalid JSON at line {exc.lineno} column {exc.colno}", f"a JSON result file ({_DETAILED})"
        ) from None
    except RecursionError:  # not reached after the depth check; kept one line all the same
        raise ConfigError(str(path), "JSON nested too deep", f"a JSON result file ({_DETAILED})") from None
    except ValueError as exc:
        raise number_error(str(path), str(path), exc) from None
    if index is not None and not 0 <= index < len(docs):
        raise ConfigError(
            f"{path}: --index",
            index,
            f"0 to {len(docs) - 1} (the file holds {len(docs)} result{'s' if len(docs) > 1 else ''})",
        )
    if index is None and len(docs) > 1:
        raise ConfigError(
            str(path),
            f"{len(docs)} results, one per line (--append-result, or JSONL)",
            f"one result: pass --index K (0-based, 0 to {len(docs) - 1}) to compare the K-th",
        )
    doc = docs[index or 0]
    if not isinstance(doc, dict):
        raise ConfigError(str(path), type(doc).__name__, f"a JSON object ({_DETAILED})")
    inputs = _list(path, doc, "input_lens", None)
    n = len(inputs)
    if n == 0:
        raise ConfigError(f"{path}: input_lens", "[]", "at least one request")
    if n > MAX_REQUESTS:
        raise ConfigError(f"{path}: input_lens", f"{n} entries", f"at most {MAX_REQUESTS} requests")
    lists = {f: _list(path, doc, f, n) for f in REQUIRED_LISTS[1:]}
    errors = _list(path, doc, "errors", n) if doc.get("errors") is not None else [""] * n
    succeeded = []
    for i, e in enumerate(errors):
        if e is not None and not isinstance(e, str):
            raise ConfigError(f"{path}: errors[{i}]", e, 'a string ("" for a successful request)')
        if not e:
            succeeded.append(i)
    if not succeeded:
        raise ConfigError(f"{path}: errors", f"all {n} requests failed", "at least one successful request")
    warnings: list[str] = []
    num_prompts = doc.get("num_prompts")
    if num_prompts is not None and num_prompts != n:
        # The entries are the requests the benchmark sent (vLLM counts a dataset short of num_prompts,
        # a result edited or cut short): they are replayed, whatever the header says.
        warnings.append(f"num_prompts is {num_prompts!r} but input_lens has {n} entries; the {n} entries are replayed")

    # Output counts pick the requests to compare, so they are checked before the other lists: a
    # request without an output token (a failed one, when the file has no errors) may have a TTFT
    # of 0, which the checks below refuse for a request that is compared.
    counts = _tokens(
        path, "output_lens", lists["output_lens"], succeeded, 0, " (0: no output token, the request is left out)"
    )
    ok_rows = [i for i, c in zip(succeeded, counts.tolist()) if c > 0]
    if not ok_rows:
        raise ConfigError(
            f"{path}: output_lens",
            f"0 in all {len(succeeded)} {'successful ' if len(succeeded) < n else ''}requests",
            "at least one request with an output token (one without has no TTFT or TPOT to compare)",
        )
    prompt = _tokens(path, "input_lens", inputs, ok_rows, 1)
    output = counts[counts > 0]
    total = prompt + output
    if total.max() > MAX_TOKENS:
        j = int(np.argmax(total))
        i = ok_rows[j]
        raise ConfigError(
            f"{path}: input_lens[{i}] + output_lens[{i}]",
            int(total[j]),
            f"at most {MAX_TOKENS} tokens in one request",
        )
    ttft = np.array([_seconds(path, "ttfts", lists["ttfts"][i], i, True) for i in ok_rows])
    itls = []
    for i in ok_rows:
        row = lists["itls"][i]
        if not isinstance(row, list):
            raise ConfigError(
                f"{path}: itls[{i}]",
                type(row).__name__,
                "a list of gaps in seconds (one per streamed chunk after the first)",
            )
        itls.append(_gaps(path, i, row))
    if "latencies" in doc:
        lat = _list(path, doc, "latencies", n)
        decode = np.array([_seconds(path, "latencies", lat[i], i, True) for i in ok_rows]) - ttft
        bad = np.flatnonzero(decode < -1e-9)
        if bad.size:
            i = ok_rows[int(bad[0])]
            raise ConfigError(f"{path}: latencies[{i}]", lat[i], f"a latency >= its ttft ({lists['ttfts'][i]})")
        decode = np.maximum(decode, 0.0)
    else:
        decode = np.array([float(r.sum()) for r in itls])
    start = None
    if "start_times" in doc and doc["start_times"] is not None:
        st = _list(path, doc, "start_times", n)
        raw = []
        for i in ok_rows:
            f = _number(st[i])
            if f is None or not math.isfinite(f):
                raise ConfigError(f"{path}: start_times[{i}]", st[i], "a finite send time in seconds")
            raw.append(f)
        origin = min(raw)
        start = np.array(raw) - origin
        if start.max() > MAX_TIME_S:  # also where a difference overflowed to inf
            j = int(np.argmax(start))
            i = ok_rows[j]
            raise ConfigError(
                f"{path}: start_times[{i}]",
                st[i],
                f"a send time within {MAX_TIME_S:g} s of the first ({origin:g})",
            )

    rate = parse_request_rate(path, doc, "request_rate", None)
    burst = parse_request_rate(path, doc, "burstiness", 1.0)
    mc = doc.get("max_concurrency")
    if mc is not None:
        f = _number(mc)
        # The replay runs one client per slot of the semaphore: as many as a scenario may have.
        if f is None or not math.isfinite(f) or f != math.floor(f) or not 1 <= f <= MAX_REQUESTS:
            raise ConfigError(f"{path}: max_concurrency", mc, f"null or an integer in [1, {MAX_REQUESTS}]")
    if start is None:
        if doc.get("ramp_up_strategy"):
            raise ConfigError(
                f"{path}: ramp_up_strategy",
                doc["ramp_up_strategy"],
                "null (kvsim replays a ramp-up run only from its start_times)",
            )
        if rate is None and mc is None:
            raise ConfigError(
                f"{path}: request_rate",
                "missing",
                'a number > 0 or "inf", or max_concurrency, or start_times: the arrival process to replay',
            )
        # Gamma gaps of shape b have a coefficient of variation of 1 / sqrt(b); a shape far below
        # kvsim's gamma arrivals' bound draws all-zero gaps, which vLLM's rescaling divides by.
        # With max_concurrency the rate still draws the due times (each is sent when a slot frees).
        if rate is not None and math.isfinite(rate) and burst is not None and burst < 1 / MAX_CV**2:
            raise ConfigError(
                f"{path}: burstiness",
                doc["burstiness"],
                f'a number >= {1 / MAX_CV**2:g} or "inf" (gaps with a coefficient of variation of at most {MAX_CV:g})',
            )
        if rate is not None and len(ok_rows) / rate > MAX_TIME_S:
            # vLLM sends the last request at N / rate, and so does the replay.
            raise ConfigError(
                f"{path}: request_rate",
                rate,
                f'"inf" or a number >= {len(ok_rows) / MAX_TIME_S:g} (the last of the {len(ok_rows)} requests '
                f"is sent at N / rate, within {MAX_TIME_S:g} s)",
            )
    duration = _header_number(path, doc, "duration", MAX_TIME_S, "seconds")
    for field, (unit, upper) in THROUGHPUT_FIELDS.items():
        _header_number(
            path, doc, field, upper, f"{unit} (null or absent: computed from the per-request lists over duration)"
        )
    header = {k: v for k, v in doc.items() if not isinstance(v, (list, dict))}
    return BenchResult(
        path=Path(path),
        header=header,
        request_rate=rate if rate is not None else math.inf,
        burstiness=burst if burst is not None else 1.0,
        max_concurrency=int(mc) if mc is not None else None,
        num_requests=n,
        failed=n - len(succeeded),
        no_output=len(succeeded) - len(ok_rows),
        prompt_tokens=prompt,
        output_tokens=output,
        ttft_s=ttft,
        itl_s=tuple(itls),
        decode_s=decode,
        start_s=start,
        duration_s=duration,
        warnings=tuple(warnings),
    )
