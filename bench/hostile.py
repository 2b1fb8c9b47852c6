"""Hostile and careless input, class by class: ``python -m bench hostile [--quick] [--classes 2,5]``
(or ``python -m bench.hostile``, which also takes ``--timeout S`` per case).

Builds a corpus of bad inputs in nine classes (1 security, 2 decompression and expansion bombs,
3 values that pass validation and then hang or exhaust memory, 4 non-finite and absurd numbers,
5 profile files, 6 I/O errors, 7 silent coercion, 8 conservation, 9 interrupted runs) against the
``kvsim`` commands, the sweep runner and the explorer's upload functions, and runs every case in a
child forked from this warm process, in its own process group, under a memory limit (3 GiB of
address space beyond what it maps when forked: ``RLIMIT_AS``) and a wall-clock limit; cases about unreadable files and read-only folders run as
``nobody`` when started as root. Class 9 starts real ``kvsim`` processes and signals them by PID.

A case is **handled** when it

* exits 0 with finite, conserved results: every request of the run is one row, completed or
  rejected, a completed one with a first token at or after its arrival, at least one generated
  token and finite times; the summary's counts add up and its latency means are finite and >= 0
  (``check_run``); or
* exits 2 with exactly one ``error: ...`` line on stderr (at most 2,000 characters) and no
  traceback;

and passes its own check where it has one (a canary file never opened, nothing written outside the
case folder, an earlier run's files unchanged, no process left behind). A case marked ``reject``
must exit 2. ``kvsim sweep`` may exit 1 when some points are invalid for their values (documented:
they are recorded ``failed``), provided every listed failure is a ``ConfigError``. Anything else is
**mishandled**: a traceback, a hang past the wall limit, the memory limit, a signal, an exit 0 on a
``reject`` case, or results that are not finite and conserved.

Writes ``<out>/hostile.json`` (per class: cases tried and mishandled, each mishandled case with its
symptom) and prints the table; a ``--quick`` or ``--classes`` run writes a name of its own
(``hostile-quick.json``, ``hostile-classes-2-5.json``, ``hostile-quick-classes-2-5.json``:
:func:`result_name`), so it never replaces the full corpus's result. ``tests/test_hostile_corpus.py`` runs the fixed corpus of
concrete hostile cases (:func:`corpus` with ``quick=True``) in CI; class 9 runs there as
``tests/test_interrupts.py``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import pwd
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 30.0
#: The explorer stops a run after this many seconds (sim.engine.budget.EXPLORER_BUDGET).
EXPLORER_WALL_S = 60.0
#: Address space each case's child may add to what it maps when forked (``RLIMIT_AS``): far above
#: what a 40-request run needs (~0.5 GB), far below what an unbounded memory bomb takes (6 GB,
#: 74.5 GiB): such a case fails alone, at the memory limit, instead of the host.
MEM_BYTES = 3 * 2**30


def _limit_memory() -> None:
    """RLIMIT_AS = this process's current address space + :data:`MEM_BYTES` (a fork of a large
    parent, such as a pytest worker, starts with gigabytes of mappings it never touches)."""
    size = 0
    try:
        with open("/proc/self/status") as f:
            size = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    resource.setrlimit(resource.RLIMIT_AS, (size + MEM_BYTES, size + MEM_BYTES))


MAX_ERROR_CHARS = 2000

CLASSES = {
    1: "security: files named in uploads, run/sweep names, symlinked outputs",
    2: "decompression and expansion bombs (rows, YAML aliases, nesting)",
    3: "values that pass validation, then hang or exhaust memory",
    4: "non-finite and absurd numbers (scenario, traces, seeds)",
    5: "profile files not validated as a format",
    6: "I/O errors (--out paths, unreadable/binary/UTF-16 files, YAML lists, JSONL lines)",
    7: "silent coercion (bool as number, '' profile, YAML false, base_dir)",
    8: "conservation: prompt beyond its static reservation, sentinel values in the summary",
    9: "interrupted runs and killed sweeps",
}


@dataclass
class Case:
    cls: int
    name: str
    #: ``kvsim`` arguments (CLI cases).
    argv: list[str] = field(default_factory=list)
    #: Files written into the case folder before the run (relative name → bytes or text).
    files: dict[str, bytes | str] = field(default_factory=dict)
    #: ``reject``: must exit 2; ``any``: exit 0 with sound results or exit 2.
    expect: str = "any"
    #: Explorer calls instead of the CLI: ``(kind, file name, bytes)`` with kind trace, profile,
    #: scenario (parsed, resolved and run as the page does) or sweep (an uploaded dataset).
    uploads: list[tuple[str, str, bytes]] = field(default_factory=list)
    #: Run in the parent (as root) before the child starts, with the case folder.
    setup: Callable[[Path], None] | None = None
    #: Extra check after the child: the case folder and the outcome → a problem, or None.
    verify: Callable[[Path, Outcome], str | None] | None = None
    #: Class 9: a function of the case folder that runs real processes and returns a problem or None.
    live: Callable[[Path], str | None] | None = None
    #: Part of the fixed corpus of concrete hostile cases that CI runs.
    ci: bool = False
    #: Run as ``nobody`` when started as root (unreadable files and read-only folders mean
    #: nothing to root). Other cases keep the user: this Python may be unreachable for nobody.
    unprivileged: bool = False


@dataclass
class Outcome:
    code: int | None
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool = False
    signal: int | None = None
    maxrss_mb: float = 0.0
    opened: list[str] = field(default_factory=list)


# --- running one case ---------------------------------------------------------------------


def _drop_privileges() -> None:
    if os.getuid() == 0:
        nobody = pwd.getpwnam("nobody")
        os.setgroups([])
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)


def _upload_child(case: Case, work: Path) -> int:
    from sim import explorer as X
    from sim.errors import ConfigError

    store = X.UploadStore()
    try:
        for kind, name, data in case.uploads:
            if kind == "trace":
                store.add_trace(name, data)
            elif kind == "profile":
                store.add_profile(name, data)
            elif kind == "sweep":
                X.read_sweep_upload(name, data)
            else:
                doc = store.parse_scenario(name, data)
                sc = X.resolve_scenario(doc, store.trace_paths(), store.profiles)
                run = X.run_canonical(X.canonical_json(sc))
                out = work / "out"
                out.mkdir()
                import pyarrow.parquet as pq

                (out / "summary.json").write_text(json.dumps(run.summary))
                pq.write_table(run.requests, out / "requests.parquet")
        return 0
    except ConfigError as exc:
        sys.stderr.write(f"error: {X.error_text(exc)}\n")
        return 2
    finally:
        store.close()


def _child(case: Case, work: Path, out_path: Path, err_path: Path, watch: list[str]) -> None:
    """The forked child: never returns."""
    code = 1
    try:
        os.setpgid(0, 0)
        fo = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        fe = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fo, 1)
        os.dup2(fe, 2)
        # Under pytest, sys.stdout/err are capture objects of their own: write to the fds.
        sys.stdout = open(1, "w", closefd=False, buffering=1)
        sys.stderr = open(2, "w", closefd=False, buffering=1)
        if case.unprivileged:
            _drop_privileges()
        _limit_memory()
        os.chdir(work)
        os.environ["HOME"] = str(work)
        os.environ["TMPDIR"] = str(work)
        tempfile.tempdir = str(work)
        if watch:
            opened_log = work.parent / "opened.log"

            def audit(event: str, args: tuple) -> None:
                if event == "open" and args and str(args[0]) in watch:
                    with open(opened_log, "a") as f:  # not a watched path
                        f.write(str(args[0]) + "\n")

            sys.addaudithook(audit)
        if case.uploads:
            code = _upload_child(case, work)
        else:
            sys.argv = ["kvsim", *case.argv]
            from sim.cli.main import main

            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - what the real CLI would print
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        os._exit(code)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_case(case: Case, folder: Path, timeout_s: float = TIMEOUT_S) -> tuple[Outcome, str | None]:
    """Run one case in ``folder`` (made here); returns its outcome and the problem (None = handled)."""
    work = folder / "work"
    work.mkdir(parents=True)
    os.chmod(folder, 0o777)
    os.chmod(work, 0o777)
    for rel, data in case.files.items():
        p = work / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            p.write_text(data)
        else:
            p.write_bytes(data)
        os.chmod(p, 0o666)
    if case.setup is not None:
        case.setup(work)
    if case.live is not None:
        t0 = time.perf_counter()
        try:
            problem = case.live(work)
        except Exception as exc:  # noqa: BLE001 - a harness failure is reported, not hidden
            problem = f"harness: {type(exc).__name__}: {exc}"
        return Outcome(None, "", "", time.perf_counter() - t0), problem
    watch = [str(work / "canary.csv")] if (work / "canary.csv").exists() else []
    if any(kind == "scenario" for kind, _, _ in case.uploads):
        timeout_s = max(timeout_s, EXPLORER_WALL_S + 15)  # the page's own wall budget, and some
    out_path, err_path = folder / "stdout", folder / "stderr"
    sys.stdout.flush()
    sys.stderr.flush()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        _child(case, work, out_path, err_path, watch)
    timed_out = False
    status, rusage = 0, None
    while True:
        wpid, status, rusage = os.wait4(pid, os.WNOHANG)
        if wpid == pid:
            break
        if time.perf_counter() - t0 > timeout_s:
            timed_out = True
            _kill_group(pid)
            _, status, rusage = os.wait4(pid, 0)
            break
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    _kill_group(pid)  # sweep workers and anything else the case started
    code = os.waitstatus_to_exitcode(status)
    sig = -code if code < 0 else None
    read = lambda p: p.read_text(errors="replace") if p.exists() else ""  # noqa: E731
    opened_log = folder / "opened.log"
    err = read(err_path)
    if "Traceback (most recent call last)" in err[:-20000]:  # keep the marker when cutting
        err = "Traceback (most recent call last) ...\n" + err[-20000:]
    out = Outcome(
        None if sig else code,
        read(out_path)[-20000:],
        err[-20000:],
        wall,
        timed_out,
        sig,
        (rusage.ru_maxrss / 1024) if rusage else 0.0,
        read(opened_log).split() if opened_log.exists() else [],
    )
    return out, judge(case, work, out)


# --- judging ---------------------------------------------------------------------------------


def _error_line(stderr: str) -> str | None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    if len(lines) != 1 or not lines[0].startswith("error: "):
        return None
    return lines[0]


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_run(out: Path) -> str | None:
    """Sound results in a run directory: finite and conserved (see the module docstring)."""
    import numpy as np
    import pyarrow.parquet as pq

    try:
        summary = json.loads((out / "summary.json").read_text())
        req = pq.read_table(out / "requests.parquet").to_pydict()
    except Exception as exc:  # noqa: BLE001
        return f"unreadable results: {type(exc).__name__}: {str(exc)[:120]}"
    n = len(req["id"])
    if n != summary.get("requests") or summary.get("completed", -1) + summary.get("rejected", -1) != n:
        return (
            f"not conserved: {n} rows, summary requests {summary.get('requests')}, completed "
            f"{summary.get('completed')} + rejected {summary.get('rejected')}"
        )
    if len(set(req["id"])) != n:
        return "a request recorded twice"
    status = np.array(req["status"])
    if not set(status.tolist()) <= {"completed", "rejected"}:
        return f"unknown statuses {set(status.tolist())}"
    ok = status == "completed"
    arr, first, fin = (np.array(req[k], dtype=float) for k in ("arrival_s", "first_token_s", "finish_s"))
    gen, outp = np.array(req["generated_tokens"]), np.array(req["output_tokens"])
    if not np.isfinite(arr).all() or (arr < 0).any():
        return "non-finite or negative arrival times"
    if ok.any():
        if not (np.isfinite(first[ok]).all() and np.isfinite(fin[ok]).all()):
            return "a completed request with non-finite times"
        if (first[ok] < arr[ok]).any():
            return (
                f"{int((first[ok] < arr[ok]).sum())} completed requests without a first token (first_token_s < arrival)"
            )
        if (fin[ok] < first[ok]).any():
            return "a completed request that finished before its first token"
        if (gen[ok] < 1).any() or (gen[ok] > outp[ok]).any():
            return f"{int(((gen[ok] < 1) | (gen[ok] > outp[ok])).sum())} completed requests with 0 or too many tokens"
        for key in ("makespan_s", "throughput_tokens_per_s", "throughput_requests_per_s"):
            if not _finite(summary.get(key)):
                return f"summary {key} = {summary.get(key)!r}"
        for key in ("ttft_s", "e2e_s"):
            m = (summary.get(key) or {}).get("mean")
            if not _finite(m) or m < 0:
                return f"summary {key}.mean = {m!r}"
    return None


def check_dataset(out: Path) -> str | None:
    """Sound sweep results: every ``ok`` point with finite, conserved headline metrics."""
    import pyarrow.parquet as pq

    for f in sorted(out.glob("part-*.parquet")):
        try:
            row = pq.read_table(f).to_pylist()[0]
        except Exception as exc:  # noqa: BLE001
            return f"unreadable point {f.name}: {type(exc).__name__}"
        if row.get("status") != "ok":
            if not str(row.get("error") or "").startswith("ConfigError:"):
                return f"point {row.get('point_id')} failed: {str(row.get('error'))[:120]}"
            continue
        if row.get("completed", -1) + row.get("rejected", -1) != row.get("requests"):
            return f"point {row.get('point_id')} not conserved"
        for key in ("makespan_s", "ttft_s.mean", "e2e_s.mean"):
            v = row.get(key)
            if row.get("completed") and (not _finite(v) or v < 0):
                return f"point {row.get('point_id')}: {key} = {v!r}"
    return None


def judge(case: Case, work: Path, o: Outcome) -> str | None:
    if o.opened:
        return f"opened {o.opened[0]}"
    if o.timed_out:
        return f"hang: killed after {o.wall_s:.0f} s"
    if o.signal:
        return f"killed by signal {o.signal}"
    if "MemoryError" in o.stderr:
        return "memory limit (MemoryError)"
    if "Traceback (most recent call last)" in o.stderr:
        last = [ln for ln in o.stderr.splitlines() if ln.strip()][-1]
        return f"traceback: {last[:160]}"
    problem = None
    if o.code == 2:
        line = _error_line(o.stderr)
        if line is None:
            problem = f"exit 2 without one error line: {o.stderr.strip()[:160]!r}"
        elif len(line) > MAX_ERROR_CHARS:
            problem = f"error line of {len(line)} characters"
    elif o.code == 0:
        if case.expect == "reject":
            problem = "accepted (exit 0)"
        elif (work / "out" / "summary.json").exists():
            problem = check_run(work / "out")
    elif o.code == 1 and case.argv[:1] == ["sweep"]:
        lines = [ln for ln in o.stderr.splitlines() if ln.strip()]
        bad = [ln for ln in lines[1:] if "ConfigError:" not in ln]
        if not lines or not re.match(r"^\d+ of \d+ points failed:$", lines[0]) or bad:
            problem = f"sweep exit 1: {(bad or lines or [''])[0][:160]}"
        elif case.expect == "reject":
            problem = None  # invalid points recorded failed, as documented
    elif o.code == 1 and case.argv[:1] == ["plan"] and "Traceback" not in o.stderr:
        problem = None  # no candidate meets the SLO
    else:
        problem = f"exit {o.code}: {o.stderr.strip()[-160:]!r}"
    if problem is None and case.argv[:1] == ["sweep"] and o.code in (0, 1):
        ds = next((Path(case.argv[i + 1]) for i, a in enumerate(case.argv[:-1]) if a == "--out"), None)
        if ds is not None and (work / ds).is_dir():
            problem = check_dataset(work / ds)
    if problem is None and case.verify is not None:
        problem = case.verify(work, o)
    return problem


# --- building blocks ---------------------------------------------------------------------------

#: 40 requests of the default scenario: a second or less per case.
SMALL = ["--set", "workload.num_requests=40"]


def run_argv(*sets: str, scenario: str = "chat-api") -> list[str]:
    argv = ["run", scenario, "-q", "--out", "out", *SMALL]
    for s in sets:
        argv += ["--set", s]
    return argv


def _yaml(doc) -> str:
    import yaml

    return yaml.safe_dump(doc, sort_keys=False)


def _chat(**over) -> dict:
    """chat-api with 40 requests, as a mapping (the trace path made absolute)."""
    import yaml

    from sim.config import SCENARIO_DIR, apply_overrides

    doc = yaml.safe_load((SCENARIO_DIR / "chat-api.yaml").read_text())
    doc["workload"]["num_requests"] = 40
    doc["workload"]["lengths"]["path"] = str(SCENARIO_DIR / "traces" / "AzureLLMInferenceTrace_conv.csv")
    return apply_overrides(doc, over)


def _trace_csv(rows: list[tuple], header: str = "arrival_s,prompt_tokens,output_tokens") -> str:
    return header + "\n" + "\n".join(",".join(str(v) for v in r) for r in rows) + "\n"


def _good_rows(n: int = 30) -> list[tuple]:
    return [(round(i * 0.1, 3), 100 + i, 20 + i % 7) for i in range(n)]


def _mooncake(rows: list) -> str:
    return "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n"


def _mc_rows(n: int = 30) -> list[dict]:
    return [
        {"timestamp": i * 100, "input_length": 100 + i, "output_length": 20 + i % 7, "hash_ids": [i]} for i in range(n)
    ]


def _parquet_bytes(cols: dict) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table(cols), buf)
    return buf.getvalue()


def _trace_run(name: str) -> list[str]:
    return run_argv("workload.arrival.kind=trace", f"workload.arrival.path={name}", "workload.lengths=null")


#: A "billion laughs" in ~340 bytes: nine levels of nine aliases, 9**9 strings once expanded.
LOL = (
    '[&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"], '
    + ", ".join(f"&{c} [{','.join(['*' + p] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi"))
    + "]"
)


def _cache_dir() -> Path:
    d = Path(tempfile.gettempdir()) / "kvsim-hostile-cache"
    d.mkdir(exist_ok=True)
    os.chmod(d, 0o755)
    return d


def _bomb_path(rows: int, ext: str = "parquet") -> Path:
    return _cache_dir() / f"bomb-{rows}.{ext}"


def parquet_bomb(rows: int = 150_000_000) -> Path:
    """A Parquet trace of ``rows`` identical rows: a couple of MB on disk, gigabytes once read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = _bomb_path(rows)
    if not path.exists():
        chunk = 5_000_000
        tmp = path.with_suffix(".tmp")
        one = pa.table(
            {
                "arrival_s": pa.array([0.0] * chunk),
                "prompt_tokens": pa.array([100] * chunk),
                "output_tokens": pa.array([10] * chunk),
            }
        )
        with pq.ParquetWriter(tmp, one.schema, compression="zstd") as w:
            for i in range(0, rows, chunk):
                w.write_table(one.slice(0, min(chunk, rows - i)))
        os.replace(tmp, path)
    os.chmod(path, 0o644)
    return path


def gzip_bomb(rows: int = 50_000_000) -> Path:
    path = _bomb_path(rows, "csv.gz")
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        block = b"0,100,10\n" * 1_000_000
        with gzip.open(tmp, "wb", compresslevel=9) as f:
            f.write(b"arrival_s,prompt_tokens,output_tokens\n")
            for _ in range(rows // 1_000_000):
                f.write(block)
        os.replace(tmp, path)
    os.chmod(path, 0o644)
    return path


# --- the corpus -----------------------------------------------------------------------------

#: Scalar numeric scenario keys with the overrides that make each one matter.
FLOAT_KEYS: dict[str, list[str]] = {
    "model.params": [],
    "gpu.gpu_memory_utilization": [],
    "workload.duration_s": [],
    "workload.arrival.rate": [],
    "workload.arrival.cv": ["workload.arrival.kind=gamma"],
    "workload.arrival.time_scale": [
        "workload.arrival.kind=trace",
        "workload.arrival.path=traces/AzureLLMInferenceTrace_conv.csv",
        "workload.lengths=null",
    ],
    "workload.arrival.think_time_s": ["workload.arrival.kind=closed_loop", "workload.arrival.concurrency=4"],
    "workload.lengths.prompt_median": ["workload.lengths.kind=lognormal"],
    "workload.lengths.prompt_sigma": ["workload.lengths.kind=lognormal"],
    "workload.lengths.output_median": ["workload.lengths.kind=lognormal"],
    "workload.lengths.output_sigma": ["workload.lengths.kind=lognormal"],
    "workload.lengths.outlier_fraction": ["workload.lengths={kind: mixture, base: {kind: fixed}}"],
    "workload.lengths.outlier_multiplier": ["workload.lengths={kind: mixture, base: {kind: fixed}}"],
    "workload.prefix.fraction": [],
    "workload.priority.high_fraction": [],
    "allocator.compaction.below_utilization": ["allocator.kind=dynamic", "allocator.compaction.enabled=true"],
    "allocator.compaction.above_fragmentation": ["allocator.kind=dynamic", "allocator.compaction.enabled=true"],
    "allocator.compaction.background_slowdown": [
        "allocator.kind=dynamic",
        "allocator.compaction.enabled=true",
        "allocator.compaction.mode=background",
    ],
    "allocator.compaction.period_s": ["allocator.kind=dynamic", "allocator.compaction.enabled=true"],
    "allocator.static_fraction": ["allocator.kind=hybrid_tail"],
    "allocator.reserve_fraction": ["allocator.kind=hybrid_reserve"],
    "allocator.preempt_at_usage": ["allocator.kind=hybrid_reserve"],
    "allocator.admit_when_free_above": ["allocator.kind=hybrid_reserve"],
    "allocator.stale_after_s": ["allocator.kind=hybrid_reserve"],
    "cost_model.compute_efficiency": ["cost_model.profile=none"],
    "cost_model.memory_efficiency": ["cost_model.profile=none"],
    "cost_model.step_overhead_s": ["cost_model.profile=none"],
    "cost_model.per_seq_overhead_s": ["cost_model.profile=none"],
    "cost_model.paged_attention_overhead": ["cost_model.profile=none", "allocator.kind=static"],
    "timeseries.every_s": [],
}
INT_KEYS: dict[str, list[str]] = {
    "seed": [],
    "model.layers": [],
    "model.hidden": [],
    "model.heads": [],
    "model.kv_heads": [],
    "model.head_dim": [],
    "model.intermediate": [],
    "model.vocab": [],
    "model.sliding_window": [],
    "gpu.replicas": [],
    "gpu.activation_reserve_bytes": [],
    "workload.num_requests": [],
    "workload.max_model_len": [],
    "workload.arrival.concurrency": ["workload.arrival.kind=closed_loop"],
    "workload.lengths.prompt_tokens": ["workload.lengths.kind=fixed"],
    "workload.lengths.output_tokens": ["workload.lengths.kind=fixed"],
    "workload.lengths.prompt_max": ["workload.lengths.kind=uniform"],
    "workload.lengths.output_max": ["workload.lengths.kind=uniform"],
    "workload.prefix.prefix_tokens": ["workload.prefix.fraction=0.5"],
    "workload.prefix.groups": ["workload.prefix.fraction=0.5"],
    "scheduler.max_num_seqs": [],
    "scheduler.max_num_batched_tokens": [],
    "allocator.block_size": [],
    "allocator.reserve": ["allocator.kind=static"],
    "allocator.chunk_tokens": ["allocator.kind=dynamic"],
    "allocator.long_threshold": ["allocator.kind=hybrid_tail"],
    "allocator.preemption.swap_capacity_bytes": ["allocator.preemption.mode=swap"],
}
BOOL_KEYS: dict[str, list[str]] = {
    "scheduler.chunked_prefill": [],
    "allocator.compaction.enabled": ["allocator.kind=dynamic"],
    "allocator.prefix_caching.enabled": [],
}


def _class1() -> list[Case]:
    from sim.config import SCENARIO_DIR

    cases: list[Case] = []

    def nested(depth: int, path: str) -> dict:
        node: dict = {"kind": "empirical", "path": path}
        for _ in range(depth - 1):
            node = {"kind": "mixture", "base": node}
        return node

    canary = "arrival_s,prompt_tokens,output_tokens\n0,10,5\n"
    for depth in (1, 2, 3, 8, 15, 16, 17, 18, 24, 32, 48, 63, 64, 65, 100):
        # The canary's absolute path is known only in the case folder: the setup writes the upload.
        cases.append(
            Case(
                1,
                f"upload: lengths path at depth {depth}",
                files={"canary.csv": canary},
                uploads=[("scenario", "s.yaml", b"")],
                ci=depth in (1, 17, 64),
                setup=_upload_setup(
                    lambda w, d=depth: {"workload": {"num_requests": 10, "lengths": nested(d, str(w / "canary.csv"))}}
                ),
            )
        )
    for label, make in (
        ("arrival.path", lambda w: {"workload": {"arrival": {"kind": "trace", "path": str(w / "canary.csv")}}}),
        ("cost_model.profile", lambda w: {"cost_model": {"profile": str(w / "canary.csv")}}),
        (
            "stray path key",
            lambda w: {"workload": {"lengths": {"kind": "fixed", "x": {"path": str(w / "canary.csv")}}}},
        ),
        ("/etc/passwd at depth 17", lambda w: {"workload": {"lengths": nested(17, "/etc/passwd")}}),
        ("relative ../ path", lambda w: {"workload": {"lengths": nested(3, "../../../../etc/passwd")}}),
        ("base_dir key", lambda w: {"base_dir": "/etc", "workload": {"lengths": nested(1, "passwd")}}),
    ):
        cases.append(
            Case(
                1,
                f"upload: {label}",
                files={"canary.csv": canary},
                uploads=[("scenario", "s.yaml", b"")],
                setup=_upload_setup(make),
                expect="reject",
            )
        )

    def nothing_outside(work: Path, o: Outcome) -> str | None:
        stray = [p for p in work.parent.iterdir() if p.name not in ("work", "stdout", "stderr", "opened.log")]
        return f"wrote outside the case folder: {stray[0].name}" if stray else None

    for name in ("../../x", "../x", "/tmp/x", "a/../../x", ".hidden", "x/../../y"):
        cases.append(
            Case(
                1,
                f"run name {name!r}",
                argv=["run", "s.yaml", "-q"],
                files={"s.yaml": _yaml(_chat(name=name))},
                verify=nothing_outside,
                ci=name == "../../x",
            )
        )
        cases.append(
            Case(
                1,
                f"sweep name {name!r}",
                argv=["sweep", "sw.yaml", "-q", "-w", "1"],
                files={
                    "sw.yaml": _yaml(
                        {
                            "name": name,
                            "base": str(SCENARIO_DIR / "chat-api.yaml"),
                            "set": {"workload.num_requests": 10},
                            "seeds": 1,
                        }
                    )
                },
                verify=nothing_outside,
            )
        )

    def symlinked(fname: str):
        def setup(work: Path) -> None:
            (work / "target.txt").write_text("precious\n")
            os.chmod(work / "target.txt", 0o666)
            (work / "out").mkdir()
            os.chmod(work / "out", 0o777)
            os.symlink(work / "target.txt", work / "out" / fname)

        def verify(work: Path, o: Outcome) -> str | None:
            return None if (work / "target.txt").read_text() == "precious\n" else f"wrote through the {fname} symlink"

        return setup, verify

    for fname in ("summary.json", "requests.parquet", "timeseries.parquet", "scenario.yaml"):
        s, v = symlinked(fname)
        cases.append(Case(1, f"{fname} is a symlink", argv=run_argv(), setup=s, verify=v, ci=fname == "summary.json"))
    return cases


def _upload_setup(make: Callable[[Path], dict]):
    """A setup that writes the scenario upload (which names files in the case folder) at run time."""

    def setup(work: Path) -> None:
        (work / "upload.yaml").write_text(_yaml(make(work)))

    return setup


def _class2() -> list[Case]:
    from sim.config import SCENARIO_DIR

    cases: list[Case] = []
    # Bomb files are made (once, cached) by the setup of the cases that use them.
    big, small, gz = 150_000_000, 12_000_000, 50_000_000

    def trace_setup(rows: int, upload: bool = False):
        def setup(work: Path) -> None:
            src = parquet_bomb(rows)
            if upload:
                shutil.copy(src, work / "t.parquet")

        return setup

    cases.append(
        Case(
            2,
            "Parquet trace: 150M rows in a few MB (CLI)",
            argv=_trace_run(str(_bomb_path(big))),
            setup=trace_setup(big),
        )
    )
    cases.append(
        Case(
            2,
            "Parquet trace: 150M rows in a few MB (upload)",
            uploads=[("trace", "t.parquet", b"")],
            setup=trace_setup(big, upload=True),
        )
    )
    cases.append(
        Case(
            2,
            "Parquet trace: 12M rows (CLI)",
            argv=_trace_run(str(_bomb_path(small))),
            setup=trace_setup(small),
            ci=True,
        )
    )
    cases.append(
        Case(
            2,
            "Parquet trace: 12M rows (upload)",
            uploads=[("trace", "t.parquet", b"")],
            setup=trace_setup(small, upload=True),
            ci=True,
        )
    )
    cases.append(
        Case(
            2,
            "Parquet lengths: 150M rows (empirical)",
            setup=trace_setup(big),
            argv=run_argv("workload.lengths.kind=empirical", f"workload.lengths.path={_bomb_path(big)}"),
        )
    )
    cases.append(
        Case(
            2,
            "CSV.gz trace: 50M rows in 300 kB",
            argv=_trace_run(str(_bomb_path(gz, "csv.gz"))),
            setup=lambda w: gzip_bomb(gz),
        )
    )
    # YAML aliases ("billion laughs", ~340 bytes): wherever a value may end up in a message.
    for where, text in (
        ("unknown key", f"lol: {LOL}\n"),
        ("description", f"description: {LOL}\n"),
        ("workload.num_requests", f"workload: {{num_requests: {LOL}}}\n"),
        ("allocator.reserve", f"allocator: {{kind: static, reserve: {LOL}}}\n"),
        ("model.name", f"model: {{name: {LOL}}}\n"),
    ):
        cases.append(
            Case(
                2,
                f"billion laughs in a scenario ({where})",
                argv=["run", "s.yaml", "-q", "--out", "out"],
                files={"s.yaml": text},
                expect="reject",
                ci=where in ("unknown key", "description"),
            )
        )
        cases.append(
            Case(
                2,
                f"billion laughs uploaded ({where})",
                uploads=[("scenario", "s.yaml", text.encode())],
                expect="reject",
            )
        )
    sweep_base = f"base: {SCENARIO_DIR / 'chat-api.yaml'}\n"
    for where, tail in (
        ("grid axis", f"grid: {{workload.arrival.rate: {LOL}}}\n"),
        ("set value", f"set: {{description: {LOL}}}\n"),
        ("zip axis", f"zip: {{workload.arrival.rate: {LOL}, seed: [1, 2]}}\n"),
    ):
        cases.append(
            Case(
                2,
                f"billion laughs in a sweep ({where})",
                argv=["sweep", "sw.yaml", "-q", "-w", "1"],
                files={"sw.yaml": sweep_base + tail},
                expect="reject",
                ci=where == "grid axis",
            )
        )
    cases.append(Case(2, "billion laughs in --set", expect="reject", argv=run_argv(f"description={LOL}")))
    # Deep nesting.
    for depth in (100, 1000, 20000):
        flow = "[" * depth + "]" * depth
        mapping = "{a: " * depth + "1" + "}" * depth
        cases.append(
            Case(
                2,
                f"YAML nested {depth} deep (scenario, list)",
                argv=["run", "s.yaml", "-q", "--out", "out"],
                files={"s.yaml": "description: " + flow + "\n"},
                expect="reject",
                ci=depth == 20000,
            )
        )
        cases.append(
            Case(
                2,
                f"YAML nested {depth} deep (scenario, mapping)",
                argv=["run", "s.yaml", "-q", "--out", "out"],
                files={"s.yaml": "x: " + mapping + "\n"},
                expect="reject",
            )
        )
        cases.append(
            Case(
                2,
                f"YAML nested {depth} deep (sweep)",
                argv=["sweep", "sw.yaml", "-q", "-w", "1"],
                files={"sw.yaml": f"base: chat-api\nset: {{description: {flow}}}\n"},
                expect="reject",
            )
        )
        cases.append(
            Case(
                2,
                f"YAML nested {depth} deep (upload)",
                uploads=[("scenario", "s.yaml", f"description: {flow}\n".encode())],
                expect="reject",
            )
        )
        cases.append(
            Case(2, f"YAML nested {depth} deep (--set)", argv=run_argv(f"description={flow}"), expect="reject")
        )
    for depth in (1000, 100_000):
        deep = "[" * depth + "]" * depth
        cases.append(
            Case(
                2,
                f"JSON profile nested {depth} deep",
                argv=run_argv("cost_model.profile=p.json"),
                files={"p.json": deep},
                expect="reject",
                ci=depth == 100_000,
            )
        )
        cases.append(
            Case(
                2,
                f"JSON profile nested {depth} deep (upload)",
                uploads=[("profile", "p.json", deep.encode())],
                expect="reject",
            )
        )
        cases.append(
            Case(
                2,
                f"JSONL trace line nested {depth} deep",
                argv=_trace_run("t.jsonl"),
                files={"t.jsonl": _mooncake(_mc_rows(5)) + deep + "\n"},
                expect="reject",
                ci=depth == 100_000,
            )
        )
        cases.append(
            Case(
                2,
                f"JSONL trace line nested {depth} deep (upload)",
                uploads=[("trace", "t.jsonl", (_mooncake(_mc_rows(5)) + deep + "\n").encode())],
                expect="reject",
            )
        )
        cases.append(
            Case(
                2,
                f"JSON profile show nested {depth} deep",
                argv=["profile", "show", "p.json"],
                files={"p.json": deep},
                expect="reject",
            )
        )
    return cases


def _class3() -> list[Case]:
    from sim.config import SCENARIO_DIR

    chat = str(SCENARIO_DIR / "chat-api.yaml")
    trace = "traces/AzureLLMInferenceTrace_conv.csv"
    cases = [
        Case(
            3,
            "compaction.period_s 1e-9",
            ci=True,
            argv=run_argv(
                "allocator.kind=dynamic",
                "allocator.compaction.enabled=true",
                "allocator.compaction.period_s=1.0e-9",
                "workload.arrival.rate=40",
                "workload.num_requests=400",
            ),
        ),
        Case(
            3,
            "arrival.time_scale .inf on a trace",
            ci=True,
            argv=run_argv(
                "workload.arrival.kind=trace",
                f"workload.arrival.path={trace}",
                "workload.lengths=null",
                "workload.arrival.time_scale=.inf",
            ),
        ),
        Case(
            3,
            "arrival.time_scale 1e300 on a trace",
            argv=run_argv(
                "workload.arrival.kind=trace",
                f"workload.arrival.path={trace}",
                "workload.lengths=null",
                "workload.arrival.time_scale=1.0e+300",
            ),
        ),
        Case(
            3,
            "prefix.prefix_tokens 1e8",
            ci=True,
            argv=run_argv("workload.prefix.fraction=1", "workload.prefix.prefix_tokens=100000000"),
        ),
        Case(
            3,
            "prefix.prefix_tokens 1e8, max_model_len 2e8",
            argv=run_argv(
                "workload.prefix.fraction=1",
                "workload.prefix.prefix_tokens=100000000",
                "workload.max_model_len=200000000",
            ),
        ),
        Case(3, "prefix.groups 1e9", argv=run_argv("workload.prefix.fraction=1", "workload.prefix.groups=1000000000")),
        Case(3, "num_requests 1e10", argv=run_argv("workload.num_requests=10000000000"), ci=True),
        Case(
            3,
            "num_requests 1e9 with duration_s 1e308",
            ci=True,
            argv=run_argv("workload.num_requests=1000000000", "workload.duration_s=1.0e+308"),
        ),
        Case(3, "duration_s 1e308 alone", argv=run_argv("workload.num_requests=null", "workload.duration_s=1.0e+308")),
        Case(
            3,
            "rate 1e9 for a day",
            argv=run_argv("workload.num_requests=null", "workload.duration_s=86400", "workload.arrival.rate=1.0e+9"),
        ),
        Case(
            3,
            "closed loop: concurrency 1e9",
            argv=run_argv("workload.arrival.kind=closed_loop", "workload.arrival.concurrency=1000000000"),
        ),
        Case(
            3,
            "closed loop: duration 1e308, no count",
            argv=run_argv(
                "workload.arrival.kind=closed_loop",
                "workload.arrival.concurrency=4",
                "workload.num_requests=null",
                "workload.duration_s=1.0e+308",
            ),
        ),
        Case(3, "max_num_seqs 1e9", argv=run_argv("scheduler.max_num_seqs=1000000000")),
        Case(3, "max_num_batched_tokens 1e15", argv=run_argv("scheduler.max_num_batched_tokens=1000000000000000")),
        Case(
            3,
            "max_model_len 2**62 and fixed 2**61 tokens",
            argv=run_argv(
                "workload.max_model_len=4611686018427387904",
                "workload.lengths.kind=fixed",
                "workload.lengths.prompt_tokens=2305843009213693952",
            ),
        ),
        Case(
            3,
            "output_tokens 1e9, max_model_len 2e9",
            argv=run_argv(
                "workload.max_model_len=2000000000",
                "workload.lengths.kind=fixed",
                "workload.lengths.output_tokens=1000000000",
                "workload.num_requests=2",
            ),
        ),
        Case(
            3,
            "lognormal sigma 50",
            argv=run_argv("workload.lengths.kind=lognormal", "workload.lengths.prompt_sigma=50"),
        ),
        Case(
            3,
            "mixture multiplier 1e300",
            argv=run_argv("workload.lengths={kind: mixture, base: {kind: fixed}, outlier_multiplier: 1.0e+300}"),
        ),
        Case(3, "timeseries.every_s 1e-300", argv=run_argv("timeseries.every_s=1.0e-300")),
        Case(3, "replicas 4096 x 1e9 requests", argv=run_argv("gpu.replicas=4096", "workload.num_requests=1000000000")),
        Case(
            3,
            "chunk_tokens 1 with max_model_len 1e8",
            argv=run_argv(
                "allocator.kind=dynamic",
                "allocator.growth=chunk",
                "allocator.chunk_tokens=1",
                "workload.max_model_len=100000000",
            ),
        ),
        Case(
            3,
            "stale_after_s 1e-300",
            argv=run_argv("allocator.kind=hybrid_reserve", "allocator.stale_after_s=1.0e-300"),
        ),
        Case(
            3,
            "swap capacity 2**62",
            argv=run_argv(
                "allocator.preemption.mode=swap", "allocator.preemption.swap_capacity_bytes=4611686018427387904"
            ),
        ),
        Case(
            3,
            "block_size 1 with max_model_len 1e8",
            argv=run_argv("allocator.block_size=1", "workload.max_model_len=100000000"),
        ),
        Case(3, "activation_reserve 2**62", argv=run_argv("gpu.activation_reserve_bytes=4611686018427387904")),
    ]
    for label, body in (
        ("seeds 1e9", "seeds: 1000000000\n"),
        ("seeds 1e6", "seeds: 1000000\n"),
        (
            "grid 100^4",
            "grid:\n"
            + "".join(
                f"  {k}: [{', '.join(str(v) for v in range(1, 101))}]\n"
                for k in ("workload.arrival.rate", "scheduler.max_num_seqs", "allocator.block_size", "seed")
            ),
        ),
        (
            "grid 10^4 x seeds 100",
            "seeds: 100\ngrid:\n"
            + "".join(
                f"  {k}: [{', '.join(str(v) for v in range(1, 11))}]\n"
                for k in ("workload.arrival.rate", "scheduler.max_num_seqs", "allocator.block_size", "gpu.replicas")
            ),
        ),
        (
            "zip of 1e6 values",
            "zip:\n  workload.arrival.rate: [" + ", ".join(str(1 + i / 1e6) for i in range(200_000)) + "]\n",
        ),
    ):
        cases.append(
            Case(
                3,
                f"sweep {label}",
                argv=["sweep", "sw.yaml", "-q", "-w", "1"],
                files={"sw.yaml": f"base: {chat}\nset: {{workload.num_requests: 10}}\n" + body},
                ci=label in ("seeds 1e9", "grid 100^4"),
            )
        )
    # The explorer: the same values uploaded must be refused (or run within the page's budget).
    for label, doc in (
        ("num_requests 1e7", _chat(**{"workload.num_requests": 10_000_000})),
        (
            "num_requests 1e9, duration 1e308",
            _chat(**{"workload.num_requests": 1_000_000_000, "workload.duration_s": 1e308}),
        ),
        (
            "compaction.period_s 1e-9",
            _chat(
                **{
                    "allocator.kind": "dynamic",
                    "allocator.compaction.enabled": True,
                    "allocator.compaction.period_s": 1e-9,
                    "workload.num_requests": 400,
                    "workload.arrival.rate": 40,
                }
            ),
        ),
        ("prefix_tokens 1e8", _chat(**{"workload.prefix.fraction": 1, "workload.prefix.prefix_tokens": 100_000_000})),
        (
            "rate 1e9 for a day",
            _chat(**{"workload.num_requests": None, "workload.duration_s": 86400, "workload.arrival.rate": 1e9}),
        ),
        ("200k requests", _chat(**{"workload.num_requests": 200_000, "workload.arrival.rate": 200})),
        (
            "step mode, 50k long requests",
            _chat(
                **{
                    "workload.num_requests": 50_000,
                    "engine.mode": "step",
                    "workload.lengths": {"kind": "fixed", "prompt_tokens": 4000, "output_tokens": 4000},
                }
            ),
        ),
    ):
        doc["workload"]["lengths"] = doc["workload"].get("lengths") or {"kind": "fixed"}
        if doc["workload"]["lengths"].get("path"):
            doc["workload"]["lengths"]["path"] = "traces/AzureLLMInferenceTrace_conv.csv"
        cases.append(
            Case(
                3,
                f"upload: {label}",
                uploads=[("scenario", "s.yaml", _yaml(doc).encode())],
                ci=label in ("num_requests 1e7", "compaction.period_s 1e-9"),
            )
        )
    return cases


def _class4() -> list[Case]:
    cases: list[Case] = []
    for key, ctx in FLOAT_KEYS.items():
        for v, expect in ((".inf", "reject"), (".nan", "reject"), ("1.0e+308", "any"), ("1.0e-308", "any")):
            cases.append(
                Case(
                    4,
                    f"{key}={v}",
                    argv=run_argv(*ctx, f"{key}={v}"),
                    expect=expect,
                    ci=(key, v)
                    in {
                        ("workload.arrival.rate", "1.0e-308"),
                        ("cost_model.step_overhead_s", ".inf"),
                        ("workload.arrival.think_time_s", ".inf"),
                        ("cost_model.paged_attention_overhead", "1.0e+308"),
                        ("workload.arrival.cv", "1.0e-308"),
                        ("workload.arrival.cv", ".inf"),
                        ("workload.lengths.prompt_sigma", ".nan"),
                    },
                )
            )
    for key, ctx in INT_KEYS.items():
        for v, expect in (("9223372036854775808", "reject"), ("1.0e+30", "reject"), ("-1", "any")):
            cases.append(
                Case(
                    4,
                    f"{key}={v}",
                    argv=run_argv(*ctx, f"{key}={v}"),
                    expect=expect,
                    ci=(key, v)
                    in {
                        ("seed", "-1"),
                        ("workload.lengths.prompt_tokens", "1.0e+30"),
                        ("workload.num_requests", "9223372036854775808"),
                    },
                )
            )
    cases.append(
        Case(
            4,
            "lognormal sigma 50 (scenario file)",
            argv=["run", "s.yaml", "-q", "--out", "out"],
            files={"s.yaml": _yaml(_chat(**{"workload.lengths": {"kind": "lognormal", "prompt_sigma": 50}}))},
            ci=True,
        )
    )
    cases.append(
        Case(
            4, "gamma cv 1e-300", argv=run_argv("workload.arrival.kind=gamma", "workload.arrival.cv=1.0e-300"), ci=True
        )
    )
    # Traces: token counts and times, in each format.
    bad_tokens = [
        ("1e30", 1e30),
        ("inf", math.inf),
        ("nan", math.nan),
        ("2**63", 2**63),
        ("-1", -1),
        ("0.5", 0.5),
        ("0", 0),
    ]
    for label, v in bad_tokens:
        rows = _good_rows()
        rows[7] = (rows[7][0], v if not isinstance(v, float) or math.isfinite(v) else v, rows[7][2])
        text = _trace_csv([(a, (repr(p) if isinstance(p, float) else p), o) for a, p, o in rows])
        cases.append(
            Case(
                4,
                f"CSV trace prompt_tokens {label}",
                argv=_trace_run("t.csv"),
                files={"t.csv": text},
                expect="reject",
                ci=label in ("1e30", "inf", "2**63"),
            )
        )
        mc = _mc_rows()
        mc[7]["input_length"] = v
        cases.append(
            Case(
                4,
                f"JSONL trace input_length {label}",
                argv=_trace_run("t.jsonl"),
                files={"t.jsonl": _mooncake([json.dumps(r) for r in mc])},
                expect="reject",
            )
        )
        if isinstance(v, float) or abs(v) < 2**63:
            import numpy as np

            p = np.array([r[1] for r in _good_rows()], dtype=float)
            p[7] = v
            cols = {
                "arrival_s": [r[0] for r in _good_rows()],
                "prompt_tokens": p.tolist(),
                "output_tokens": [r[2] for r in _good_rows()],
            }
            cases.append(
                Case(
                    4,
                    f"Parquet trace prompt_tokens {label}",
                    argv=_trace_run("t.parquet"),
                    files={"t.parquet": _parquet_bytes(cols)},
                    expect="reject",
                )
            )
        cases.append(
            Case(
                4,
                f"lengths file output_tokens {label}",
                argv=run_argv("workload.lengths.kind=empirical", "workload.lengths.path=t.csv"),
                files={
                    "t.csv": _trace_csv(
                        [
                            (a, p, (repr(v) if i == 7 and isinstance(v, float) else (v if i == 7 else o)))
                            for i, (a, p, o) in enumerate(_good_rows())
                        ]
                    )
                },
                expect="reject",
            )
        )
    for label, v, expect in (
        ("inf", "inf", "reject"),
        ("nan", "nan", "reject"),
        ("-1", "-1", "reject"),
        ("1e308", "1e308", "any"),
        ("1e18", "1e18", "any"),
    ):
        rows = [(a if i != 9 else v, p, o) for i, (a, p, o) in enumerate(_good_rows())]
        cases.append(
            Case(
                4,
                f"CSV trace arrival_s {label}",
                argv=_trace_run("t.csv"),
                files={"t.csv": _trace_csv(rows)},
                expect=expect,
            )
        )
        mc = _mc_rows()
        mc[9]["timestamp"] = float(v)
        cases.append(
            Case(
                4,
                f"JSONL trace timestamp {label}",
                argv=_trace_run("t.jsonl"),
                files={"t.jsonl": _mooncake([json.dumps(r) for r in mc])},
                expect=expect,
            )
        )
    # Uploads of the same traces.
    rows = _good_rows()
    rows[3] = (rows[3][0], "1e30", rows[3][2])
    cases.append(
        Case(
            4,
            "uploaded CSV trace prompt_tokens 1e30",
            uploads=[("trace", "t.csv", _trace_csv(rows).encode())],
            expect="reject",
        )
    )
    mc = _mc_rows()
    mc[3]["output_length"] = 2**63
    cases.append(
        Case(
            4,
            "uploaded JSONL output_length 2**63",
            uploads=[("trace", "t.jsonl", _mooncake([json.dumps(r) for r in mc]).encode())],
            expect="reject",
        )
    )
    return cases


def _profile_doc() -> dict:
    from sim.cost.profile import PROFILE_DIR

    return json.loads((PROFILE_DIR / "cpu-reference.json").read_text())


PROFILE_RUN = ["model.name=tiny-llama", "gpu.name=cpu", "cost_model.profile=p.json"]


def _class5() -> list[Case]:
    import copy

    cases: list[Case] = []
    base = _profile_doc()

    def case(label: str, doc_or_text, expect: str = "reject", ci: bool = False) -> None:
        text = doc_or_text if isinstance(doc_or_text, str) else json.dumps(doc_or_text, allow_nan=True)
        cases.append(Case(5, label, argv=run_argv(*PROFILE_RUN), files={"p.json": text}, expect=expect, ci=ci))

    def edit(path: list, value=None, delete: bool = False) -> dict:
        d = copy.deepcopy(base)
        node = d
        for k in path[:-1]:
            node = node[k]
        if delete:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return d

    case("the built-in profile as a file", base, expect="any")
    for key in (
        "format",
        "version",
        "name",
        "device",
        "memory",
        "elementwise",
        "layout",
        "cpu_overhead",
        "gemm",
        "context_attention",
        "generation_attention",
        "dtypes",
        "models",
        "provenance",
        "fit_quality",
        "allreduce",
    ):
        # provenance, fit_quality and models are documentation; allreduce is needed only at TP > 1.
        case(
            f"missing {key}",
            edit([key], delete=True),
            expect="any" if key in ("provenance", "fit_quality", "allreduce", "models") else "reject",
            ci=key == "memory",
        )
    g, ca, ga = "gemm", "context_attention", "generation_attention"
    gk = next(iter(base[g]))
    ck = next(iter(base[ca]))
    nested = [
        ["cpu_overhead", "by_tp"],
        ["cpu_overhead", "by_tp", "1", "intercept_s"],
        ["cpu_overhead", "by_tp", "1", "per_seq_s"],
        ["cpu_overhead", "by_tp", "1", "batch_range"],
        ["memory", "latency_s"],
        ["memory", "bandwidth_bytes_per_s"],
        ["memory", "host_latency_s"],
        ["memory", "host_bandwidth_bytes_per_s"],
        ["memory", "alloc_event_s"],
        ["elementwise", "kernels_per_layer"],
        ["elementwise", "latency_s"],
        ["elementwise", "bandwidth_bytes_per_s"],
        ["layout", "paged_overhead"],
        [g, gk, "x"],
        [g, gk, "t_s"],
        [ca, ck, "batch"],
        [ca, ck, "t_s"],
        [ga, ck, "length"],
        ["dtypes", "weight"],
        ["dtypes", "kv"],
    ]
    for path in nested:
        case(
            f"missing {'.'.join(path)}",
            edit(path, delete=True),
            ci=path in (["cpu_overhead", "by_tp"], ["memory", "latency_s"], ["elementwise", "kernels_per_layer"]),
        )
    scalars = [
        ["memory", "latency_s"],
        ["memory", "bandwidth_bytes_per_s"],
        ["memory", "host_bandwidth_bytes_per_s"],
        ["memory", "alloc_event_s"],
        ["elementwise", "latency_s"],
        ["elementwise", "bandwidth_bytes_per_s"],
        ["elementwise", "kernels_per_layer"],
        ["cpu_overhead", "by_tp", "1", "intercept_s"],
        ["cpu_overhead", "by_tp", "1", "per_seq_s"],
        ["layout", "paged_overhead"],
    ]
    for path in scalars:
        for label, v in (
            ("a string", "fast"),
            ("0", 0),
            ("-1", -1),
            ("NaN", math.nan),
            ("null", None),
            ("Infinity", math.inf),
        ):
            # Zero is a legal latency, overhead or kernel count; not a bandwidth.
            expect = (
                "any"
                if label == "0"
                and path[-1]
                in ("alloc_event_s", "intercept_s", "per_seq_s", "paged_overhead", "latency_s", "kernels_per_layer")
                else "reject"
            )
            case(
                f"{'.'.join(path)} = {label}",
                edit(path, v),
                expect=expect,
                ci=(path[-1], label) in {("latency_s", "-1"), ("bandwidth_bytes_per_s", "0"), ("intercept_s", "NaN")},
            )
    curves = [[g, gk, "t_s"], [g, gk, "x"], [ca, ck, "t_s"], [ga, ck, "t_s"], [ga, ck, "length"], [ca, ck, "batch"]]
    for path in curves:
        arr = copy.deepcopy(base)
        node = arr
        for k in path:
            node = node[k]
        for label, mut in (
            ("NaN", lambda a: _set_first(a, math.nan)),
            ("null", lambda a: _set_first(a, None)),
            ("Infinity", lambda a: _set_first(a, math.inf)),
            ("a string", lambda a: _set_first(a, "x")),
            ("0", lambda a: _set_first(a, 0)),
            ("-1", lambda a: _set_first(a, -1)),
            ("not increasing", lambda a: a.reverse() if not isinstance(a[0], list) else a[0].reverse()),
            ("one point", lambda a: a.__setitem__(slice(1, None), [])),
        ):
            d = copy.deepcopy(base)
            n = d
            for k in path[:-1]:
                n = n[k]
            mut(n[path[-1]])
            # Measured times may dip (kernel selection changes with size): only the axes must increase.
            case(
                f"{'.'.join(path)} {label}",
                d,
                expect="any" if (path[-1], label) == ("t_s", "not increasing") else "reject",
                ci=(path[-1], label) in {("t_s", "NaN"), ("x", "not increasing")},
            )
    case("a JSON list", [base], ci=True)
    case("a JSON string", '"kvsim-profile"')
    case("empty file", "")
    case("truncated in half", json.dumps(base)[: len(json.dumps(base)) // 2], ci=True)
    cases.append(
        Case(5, "binary", argv=run_argv(*PROFILE_RUN), files={"p.json": bytes(range(256)) * 4}, expect="reject")
    )
    cases.append(
        Case(
            5,
            "UTF-16 profile",
            argv=run_argv(*PROFILE_RUN),
            files={"p.json": json.dumps(base).encode("utf-16")},
            expect="reject",
        )
    )
    case("version 2", edit(["version"], 2))
    case("format other", edit(["format"], "other"))
    case("models a list", edit(["models"], []), expect="any")
    case("cpu_overhead.by_tp empty", edit(["cpu_overhead", "by_tp"], {}))
    case(
        "cpu_overhead.by_tp key not a number",
        edit(["cpu_overhead", "by_tp"], {"x": base["cpu_overhead"]["by_tp"]["1"]}),
    )
    case("cpu_overhead.batch_range reversed", edit(["cpu_overhead", "by_tp", "1", "batch_range"], [64, 1]))
    for label, d in (
        ("profile show: missing memory", edit(["memory"], delete=True)),
        ("profile show: NaN curve", edit([g, gk, "t_s"], [math.nan] * len(base[g][gk]["t_s"]))),
        ("profile show: a JSON list", [base]),
    ):
        cases.append(
            Case(5, label, argv=["profile", "show", "p.json"], files={"p.json": json.dumps(d)}, expect="reject")
        )
    for label, d in (
        ("upload: missing cpu_overhead.by_tp", edit(["cpu_overhead", "by_tp"], delete=True)),
        ("upload: NaN latency", edit(["memory", "latency_s"], math.nan)),
        ("upload: negative bandwidth", edit(["memory", "bandwidth_bytes_per_s"], -1)),
        ("upload: a JSON list", [base]),
    ):
        cases.append(Case(5, label, uploads=[("profile", "p.json", json.dumps(d).encode())], expect="reject"))
    # An uploaded profile with NaN used in a run: the upload must be refused before a run.
    up = edit([g, gk, "t_s"], [math.nan] + base[g][gk]["t_s"][1:])
    doc = {
        "model": {"name": "tiny-llama"},
        "gpu": {"name": "cpu"},
        "cost_model": {"profile": "p"},
        "workload": {"num_requests": 40, "lengths": {"kind": "fixed", "prompt_tokens": 100, "output_tokens": 20}},
    }
    cases.append(
        Case(
            5,
            "upload: NaN curve, then run",
            expect="reject",
            uploads=[("profile", "p.json", json.dumps(up).encode()), ("scenario", "s.yaml", _yaml(doc).encode())],
        )
    )
    return cases


def _set_first(a: list, v) -> None:
    if isinstance(a[0], list):
        a[0][0] = v
    else:
        a[0] = v


def _class6() -> list[Case]:
    from sim.config import SCENARIO_DIR

    cases: list[Case] = []
    chat = str(SCENARIO_DIR / "chat-api.yaml")

    def ro_dir(work: Path) -> None:
        (work / "ro").mkdir()
        os.chmod(work / "ro", 0o555)

    def a_file(work: Path) -> None:
        (work / "f").write_text("x")

    outs = [
        ("a file", "f", a_file),
        ("under a file", "f/x", a_file),
        ("/proc/x", "/proc/x", None),
        ("/dev/null", "/dev/null", None),
        ("a read-only directory", "ro", ro_dir),
        ("under a read-only directory", "ro/x", ro_dir),
        ("a 300-character name", "x" * 300, None),
        ("''", "", None),
        ("/", "/", None),
    ]
    for label, path, setup in outs:
        unpriv = setup is ro_dir or path == "/"
        cases.append(
            Case(
                6,
                f"run --out {label}",
                argv=["run", "chat-api", "-q", "--out", path, *SMALL],
                setup=setup,
                expect="reject",
                ci=label in ("a file", "/proc/x", "''"),
                unprivileged=unpriv,
            )
        )
        cases.append(
            Case(
                6,
                f"sweep --out {label}",
                argv=["sweep", "sw.yaml", "-q", "-w", "1", "--out", path],
                files={"sw.yaml": f"base: {chat}\nset: {{workload.num_requests: 10}}\nseeds: 1\n"},
                setup=setup,
                expect="reject",
                unprivileged=unpriv,
            )
        )
        cases.append(
            Case(
                6,
                f"plan --out {label}",
                argv=[
                    "plan",
                    "chat-api",
                    "--slo",
                    "ttft_p90_s=0.5",
                    "-q",
                    "-w",
                    "1",
                    "--allocators",
                    "paged",
                    "--set",
                    "workload.num_requests=20",
                    "--out",
                    path,
                ],
                setup=setup,
                expect="reject",
                unprivileged=unpriv,
            )
        )
        cases.append(
            Case(
                6,
                f"report --out {label}",
                argv=["report", "r", "--out", path],
                setup=_with_run(setup),
                expect="reject",
                unprivileged=unpriv,
            )
        )

    def unreadable(name: str, text: str):
        def setup(work: Path) -> None:
            (work / name).write_text(text)
            os.chmod(work / name, 0o000)

        return setup

    cases += [
        Case(
            6,
            "unreadable scenario",
            argv=["run", "s.yaml", "-q", "--out", "out"],
            setup=unreadable("s.yaml", "name: x\n"),
            expect="reject",
            ci=True,
            unprivileged=True,
            verify=_mentions("Permission denied", "not readable"),
        ),
        Case(
            6,
            "unreadable CSV trace",
            argv=_trace_run("t.csv"),
            setup=unreadable("t.csv", _trace_csv(_good_rows())),
            expect="reject",
            ci=True,
            unprivileged=True,
            verify=_mentions("Permission denied", "not readable"),
        ),
        Case(
            6,
            "unreadable JSONL trace",
            argv=_trace_run("t.jsonl"),
            setup=unreadable("t.jsonl", _mooncake(_mc_rows())),
            expect="reject",
            unprivileged=True,
            verify=_mentions("Permission denied", "not readable"),
        ),
        Case(
            6,
            "unreadable lengths file",
            argv=run_argv("workload.lengths.path=t.csv"),
            setup=unreadable("t.csv", _trace_csv(_good_rows())),
            expect="reject",
            unprivileged=True,
            verify=_mentions("Permission denied", "not readable"),
        ),
        Case(
            6,
            "unreadable sweep file",
            argv=["sweep", "sw.yaml", "-q"],
            setup=unreadable("sw.yaml", "base: chat-api\n"),
            expect="reject",
            unprivileged=True,
            verify=_mentions("Permission denied", "not readable"),
        ),
        Case(
            6,
            "unreadable profile",
            argv=run_argv(*PROFILE_RUN),
            setup=unreadable("p.json", "{}"),
            expect="reject",
            unprivileged=True,
            verify=_mentions("Permission denied", "not readable"),
        ),
        Case(
            6,
            "unreadable run folder (report)",
            argv=["report", "r"],
            setup=_with_run(None, chmod=0o000),
            expect="reject",
            unprivileged=True,
            verify=_mentions("Permission denied", "not readable"),
        ),
    ]
    binary = bytes(range(256)) * 8
    for label, data in (("binary", binary), ("UTF-16", None), ("Latin-1", None)):

        def enc(text: str, label=label, data=data) -> bytes:
            if data is not None:
                return data
            return text.encode("utf-16") if label == "UTF-16" else (text + "# caf\xe9\n").encode("latin-1")

        cases += [
            Case(
                6,
                f"{label} scenario",
                argv=["run", "s.yaml", "-q", "--out", "out"],
                files={"s.yaml": enc(_yaml(_chat()))},
                expect="reject",
                ci=label != "Latin-1",
            ),
            Case(
                6,
                f"{label} CSV trace",
                argv=_trace_run("t.csv"),
                files={"t.csv": enc(_trace_csv(_good_rows()))},
                expect="reject",
                ci=label == "UTF-16",
            ),
            Case(
                6,
                f"{label} JSONL trace",
                argv=_trace_run("t.jsonl"),
                files={"t.jsonl": enc(_mooncake(_mc_rows()))},
                expect="reject",
                ci=label == "binary",
            ),
            Case(
                6,
                f"{label} sweep file",
                argv=["sweep", "sw.yaml", "-q"],
                files={"sw.yaml": enc(f"base: {chat}\nseeds: 1\n")},
                expect="reject",
            ),
            Case(
                6,
                f"{label} profile",
                argv=run_argv(*PROFILE_RUN),
                files={"p.json": enc(json.dumps(_profile_doc()))},
                expect="reject",
            ),
            Case(
                6,
                f"{label} uploaded trace",
                uploads=[("trace", "t.csv", enc(_trace_csv(_good_rows())))],
                expect="reject",
            ),
            Case(6, f"{label} uploaded scenario", uploads=[("scenario", "s.yaml", enc("name: x\n"))], expect="reject"),
        ]
    for label, text in (
        ("a YAML list", "- a\n- b\n"),
        ("a YAML scalar", "42\n"),
        ("a YAML string", "hello\n"),
        ("YAML null", "null\n"),
        ("YAML false", "false\n"),
        ("empty", ""),
    ):
        cases.append(
            Case(
                6,
                f"{label} with --set",
                argv=run_argv("workload.arrival.rate=3", scenario="s.yaml"),
                files={"s.yaml": text},
                expect="reject",
                ci=label in ("a YAML list", "a YAML scalar"),
            )
        )
        cases.append(
            Case(
                6, f"{label} as a sweep file", argv=["sweep", "sw.yaml", "-q"], files={"sw.yaml": text}, expect="reject"
            )
        )
    for label, line in (
        ("a number", "5"),
        ("a list", "[1, 2]"),
        ("a string", '"x"'),
        ("null", "null"),
        ("broken JSON", '{"timestamp": 1,'),
        ("an object without lengths", '{"timestamp": 5}'),
        ("lengths of mixed types", '{"timestamp": 1000, "input_length": "many", "output_length": 3}'),
    ):
        rows = [json.dumps(r) for r in _mc_rows(20)]
        rows[10] = line
        cases.append(
            Case(
                6,
                f"JSONL line 11 is {label}",
                argv=_trace_run("t.jsonl"),
                files={"t.jsonl": _mooncake(rows)},
                expect="reject",
                verify=_mentions("line 11")
                if label not in ("an object without lengths", "lengths of mixed types")
                else None,
                ci=label in ("a number", "broken JSON"),
            )
        )
    cases += [
        Case(
            6,
            "scenario is a directory",
            argv=["run", "d", "-q", "--out", "out"],
            setup=lambda w: (w / "d").mkdir(),
            expect="reject",
        ),
        Case(
            6,
            "trace is a FIFO",
            argv=_trace_run("fifo.csv"),
            setup=lambda w: os.mkfifo(w / "fifo.csv"),
            expect="reject",
        ),
        Case(6, "report of a missing folder", argv=["report", "nowhere"], expect="reject"),
        Case(6, "report of an empty folder", argv=["report", "d"], setup=lambda w: (w / "d").mkdir(), expect="reject"),
        Case(
            6,
            "report of a run with a corrupt summary",
            argv=["report", "r"],
            setup=_with_run(None, corrupt=True),
            expect="reject",
        ),
        Case(
            6,
            "validate-runs of a non-run",
            argv=["validate-runs", "a", "b"],
            setup=lambda w: ((w / "a").mkdir(), (w / "b").mkdir()),
            expect="reject",
        ),
        Case(
            6, "validate --scenario missing", argv=["validate", "--scenario", "nope.yaml", "--quick"], expect="reject"
        ),
        Case(
            6,
            "validate --scenario binary",
            argv=["validate", "--scenario", "v.yaml", "--quick"],
            files={"v.yaml": binary},
            expect="reject",
        ),
        Case(
            6,
            "calibrate --from-tables missing",
            argv=["calibrate", "--out", "p.json", "--model", "tiny-llama", "--from-tables", "nope"],
            expect="reject",
        ),
        Case(
            6,
            "calibrate unknown model",
            argv=["calibrate", "--out", "p.json", "--model", "nope", "--device", "cpu"],
            expect="reject",
        ),
        Case(6, "profile show missing", argv=["profile", "show", "nope.json"], expect="reject"),
        Case(6, "plan --slo garbage", argv=["plan", "chat-api", "--slo", "fast"], expect="reject"),
        Case(
            6,
            "sweep --workers 0",
            argv=["sweep", "sw.yaml", "-w", "0"],
            files={"sw.yaml": "base: chat-api\nseeds: 1\n"},
            expect="reject",
        ),
    ]
    return cases


def _mentions(*texts: str):
    """A check that the error line says one of ``texts`` (the case failed for the right reason)."""

    def verify(work: Path, o: Outcome) -> str | None:
        if any(t in o.stderr for t in texts):
            return None
        return f"error does not say {' or '.join(map(repr, texts))}: {o.stderr.strip()[:160]!r}"

    return verify


def _with_run(then: Callable[[Path], None] | None, chmod: int | None = None, corrupt: bool = False):
    """A setup that first writes a finished 20-request run into ``r`` (in this process)."""

    def setup(work: Path) -> None:
        from sim.config import load_scenario
        from sim.engine.cluster import simulate
        from sim.output.results import write_run

        sc = load_scenario("chat-api", {"workload.num_requests": 20})
        write_run(simulate(sc), work / "r")
        for p in [work / "r", *(work / "r").iterdir()]:
            os.chmod(p, 0o777 if p.is_dir() else 0o666)
        if corrupt:
            (work / "r" / "summary.json").write_text("{not json")
            (work / "r" / "requests.parquet").write_bytes(b"PAR1garbage")
        if chmod is not None:
            for p in (work / "r").iterdir():
                os.chmod(p, chmod)
        if then is not None:
            then(work)

    return setup


def _class7() -> list[Case]:
    cases: list[Case] = []
    for key, ctx in {**FLOAT_KEYS, **INT_KEYS}.items():
        cases.append(
            Case(
                7,
                f"{key}=true",
                argv=run_argv(*ctx, f"{key}=true"),
                expect="reject",
                ci=key in ("workload.arrival.rate", "allocator.reserve"),
            )
        )
    for key, ctx in BOOL_KEYS.items():
        for v in ("1", "0.0", "'yes'", "'false'"):
            cases.append(Case(7, f"{key}={v}", argv=run_argv(*ctx, f"{key}={v}"), expect="reject"))
    cases += [
        Case(7, "gpu.tensor_parallel=true", argv=run_argv("gpu.tensor_parallel=true"), expect="reject"),
        Case(7, "cost_model.profile=''", argv=run_argv("cost_model.profile=''"), expect="reject", ci=True),
        Case(
            7,
            "cost_model.profile: '' in a file",
            argv=["run", "s.yaml", "-q", "--out", "out"],
            files={"s.yaml": _yaml(_chat(**{"cost_model.profile": ""}))},
            expect="reject",
        ),
        Case(
            7,
            "workload.arrival.path=''",
            argv=run_argv("workload.arrival.kind=trace", "workload.arrival.path=''", "workload.lengths=null"),
            expect="reject",
        ),
        Case(7, "workload.lengths.path=''", argv=run_argv("workload.lengths.path=''"), expect="reject"),
        Case(
            7,
            "a YAML file holding false",
            argv=["run", "s.yaml", "-q", "--out", "out"],
            files={"s.yaml": "false\n"},
            expect="reject",
            ci=True,
        ),
        Case(
            7,
            "a YAML file holding 0",
            argv=["run", "s.yaml", "-q", "--out", "out"],
            files={"s.yaml": "0\n"},
            expect="reject",
        ),
        Case(
            7,
            "a YAML file holding []",
            argv=["run", "s.yaml", "-q", "--out", "out"],
            files={"s.yaml": "[]\n"},
            expect="reject",
        ),
        Case(
            7,
            "a YAML file holding ''",
            argv=["run", "s.yaml", "-q", "--out", "out"],
            files={"s.yaml": "''\n"},
            expect="reject",
        ),
        Case(7, "--set base_dir=/etc", argv=run_argv("base_dir=/etc"), expect="reject", ci=True),
        Case(
            7,
            "base_dir in a scenario file",
            argv=["run", "s.yaml", "-q", "--out", "out"],
            files={"s.yaml": _yaml({**_chat(), "base_dir": "/etc"})},
            expect="reject",
        ),
        Case(
            7,
            "sweep set base_dir",
            argv=["sweep", "sw.yaml", "-q"],
            files={"sw.yaml": "base: chat-api\nset: {base_dir: /etc}\nseeds: 1\n"},
            expect="reject",
        ),
        Case(7, "model.name=true", argv=run_argv("model.name=true"), expect="reject"),
        Case(7, "name=123", argv=run_argv("name=123"), expect="reject"),
        Case(7, "description=[1, 2]", argv=run_argv("description=[1, 2]"), expect="reject"),
        Case(7, "workload.arrival.rate='5'", argv=run_argv("workload.arrival.rate='5'"), expect="any"),
        Case(7, "workload.arrival.rate=[5]", argv=run_argv("workload.arrival.rate=[5]"), expect="reject"),
        Case(
            7,
            "allocator.reserve=false",
            argv=run_argv("allocator.kind=static", "allocator.reserve=false"),
            expect="reject",
        ),
        Case(
            7, "allocator.reserve=1.5", argv=run_argv("allocator.kind=static", "allocator.reserve=1.5"), expect="reject"
        ),
        Case(7, "allocator.reserve=p0", argv=run_argv("allocator.kind=static", "allocator.reserve=p0"), expect="any"),
        Case(
            7,
            "allocator.reserve=p101",
            argv=run_argv("allocator.kind=static", "allocator.reserve=p101"),
            expect="reject",
        ),
        Case(
            7,
            "allocator.reserve=pnan",
            argv=run_argv("allocator.kind=static", "allocator.reserve=pnan"),
            expect="reject",
        ),
        Case(
            7,
            "sweep seeds: true",
            argv=["sweep", "sw.yaml", "-q"],
            files={"sw.yaml": "base: chat-api\nseeds: true\n"},
            expect="reject",
        ),
        Case(
            7,
            "sweep seeds: 2.0",
            argv=["sweep", "sw.yaml", "-q"],
            files={"sw.yaml": "base: chat-api\nseeds: 2.5\n"},
            expect="reject",
        ),
        Case(
            7,
            "sweep grid axis of booleans for a number",
            argv=["sweep", "sw.yaml", "-q", "-w", "1"],
            files={
                "sw.yaml": "base: chat-api\nset: {workload.num_requests: 10}\ngrid: {workload.arrival.rate: [true, false]}\n"
            },
            expect="reject",
        ),
        Case(
            7,
            "upload: rate true",
            uploads=[("scenario", "s.yaml", b"workload: {arrival: {kind: poisson, rate: true}}\n")],
            expect="reject",
        ),
    ]
    return cases


def _class8() -> list[Case]:
    cases: list[Case] = []
    pressure = [
        "allocator.kind=static",
        "allocator.reserve=p50",
        "allocator.overflow=truncate",
        "workload.num_requests=1000",
        "workload.arrival.rate=100",
    ]
    cases.append(Case(8, "static p50 truncate under memory pressure", argv=run_argv(*pressure), ci=True))
    for reserve in ("p10", "p50", "p90", "1424"):
        for overflow in ("truncate", "reject"):
            for chunked in ("true", "false"):
                cases.append(
                    Case(
                        8,
                        f"static {reserve} {overflow} chunked_prefill={chunked}",
                        argv=run_argv(
                            "allocator.kind=static",
                            f"allocator.reserve={reserve}",
                            f"allocator.overflow={overflow}",
                            f"scheduler.chunked_prefill={chunked}",
                            "workload.num_requests=1000",
                            "workload.arrival.rate=100",
                        ),
                    )
                )
    for kind in ("hybrid_tail",):
        for overflow in ("truncate", "reject"):
            cases.append(
                Case(
                    8,
                    f"{kind} {overflow}",
                    argv=run_argv(
                        f"allocator.kind={kind}",
                        f"allocator.overflow={overflow}",
                        "workload.num_requests=1000",
                        "workload.arrival.rate=100",
                    ),
                )
            )
    cases.append(
        Case(8, "static p50 truncate, swap preemption", argv=run_argv(*pressure, "allocator.preemption.mode=swap"))
    )
    cases.append(Case(8, "static p50 truncate, step mode", argv=run_argv(*pressure, "engine.mode=step")))
    cases.append(
        Case(8, "static p50 truncate, 40% of memory", argv=run_argv(*pressure, "gpu.gpu_memory_utilization=0.4"))
    )
    cases.append(Case(8, "static p50 truncate at 300 req/s", argv=run_argv(*pressure, "workload.arrival.rate=300")))
    cases.append(
        Case(
            8,
            "static p50 truncate, uploaded",
            uploads=[
                (
                    "scenario",
                    "s.yaml",
                    _yaml(
                        _chat(
                            **{
                                "allocator.kind": "static",
                                "allocator.reserve": "p50",
                                "allocator.overflow": "truncate",
                                "workload.num_requests": 1000,
                                "workload.arrival.rate": 100,
                                "workload.lengths.path": "traces/AzureLLMInferenceTrace_conv.csv",
                            }
                        )
                    ).encode(),
                )
            ],
        )
    )
    return cases


# --- class 9: real processes, real signals -------------------------------------------------------


def _kvsim(work: Path, *args: str, **kw) -> subprocess.Popen:
    def pre() -> None:
        os.setpgid(0, 0)
        resource.setrlimit(resource.RLIMIT_AS, (MEM_BYTES, MEM_BYTES))  # a fresh interpreter: the whole limit

    env = dict(os.environ, HOME=str(work), TMPDIR=str(work), PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-m", "sim.cli", *args],
        cwd=work,
        env=env,
        preexec_fn=pre,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc)."""
    kids: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(p.name))
    out, todo = set(), [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            if k not in out:
                out.add(k)
                todo.append(k)
    return out


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _interrupt_run(sig: int, delay_s: float):
    def live(work: Path) -> str | None:
        first = _kvsim(work, "run", "chat-api", "-q", "--out", "out", *SMALL)
        first.communicate(timeout=120)
        if first.returncode != 0:
            return "harness: the earlier run failed"
        before = _snapshot(work / "out")
        p = _kvsim(
            work,
            "run",
            "chat-api",
            "-q",
            "--out",
            "out",
            "--set",
            "workload.num_requests=300000",
            "--set",
            "workload.arrival.rate=16",
        )
        time.sleep(delay_s)
        p.send_signal(sig)
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            _kill_group(p.pid)
            p.communicate()
            return f"still running 60 s after signal {sig}"
        if p.returncode == 0:
            return "harness: the run finished before the signal"
        after = _snapshot(work / "out")
        if after != before:
            changed = sorted(set(after) ^ set(before) | {k for k in after if k in before and after[k] != before[k]})
            return f"earlier run changed: {', '.join(changed)}"
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if "Traceback" in err or len(lines) != 1:
            return f"not one line on {signal.Signals(sig).name}: {err.strip()[-160:]!r}"
        leftovers = [q.name for q in (work / "out").iterdir() if q.name.startswith(".")]
        if leftovers:
            return f"temporary files left: {leftovers[0]}"
        return None

    return live


def _killed_sweep(sig: int, command: str = "sweep"):
    def live(work: Path) -> str | None:
        from sim.config import SCENARIO_DIR

        (work / "sw.yaml").write_text(
            f"base: {SCENARIO_DIR / 'chat-api.yaml'}\n"
            "set: {workload.num_requests: 40000, workload.arrival.rate: 16}\nseeds: 6\n"
        )
        if command == "sweep":
            p = _kvsim(work, "sweep", "sw.yaml", "-q", "-w", "2", "--out", "ds")
        else:
            p = _kvsim(
                work,
                "plan",
                "chat-api",
                "--slo",
                "ttft_p90_s=0.5",
                "-q",
                "-w",
                "2",
                "--out",
                "pl",
                "--set",
                "workload.num_requests=40000",
            )
        deadline = time.time() + 60
        kids: set[int] = set()
        while time.time() < deadline:
            kids = descendants(p.pid)
            if len(kids) >= 3:  # forkserver and two workers
                break
            time.sleep(0.2)
        time.sleep(1.0)
        kids = descendants(p.pid)
        if len(kids) < 2:
            _kill_group(p.pid)
            p.communicate()
            return f"harness: only {len(kids)} children started"
        p.send_signal(sig)
        try:
            p.wait(timeout=30)  # not communicate(): surviving children may hold its pipes open
        except subprocess.TimeoutExpired:
            _kill_group(p.pid)
            for k in kids:
                _kill_pid(k)
            p.communicate()
            return f"parent alive 30 s after signal {sig}"
        deadline = time.time() + 10
        while time.time() < deadline and any(alive(k) for k in kids):
            time.sleep(0.2)
        survivors = [k for k in kids if alive(k)]
        for k in survivors:  # started by this case
            _kill_pid(k)
        _, err = p.communicate(timeout=30)
        if survivors:
            return (
                f"{len(survivors)} of {len(kids)} children alive 10 s after the parent got {signal.Signals(sig).name}"
            )
        if sig != signal.SIGKILL:
            lines = [ln for ln in err.splitlines() if ln.strip()]
            if "Traceback" in err or len(lines) != 1:
                return f"not one line on {signal.Signals(sig).name}: {err.strip()[-160:]!r}"
        return None

    return live


def _class9() -> list[Case]:
    cases = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        for delay in (2.5, 5.0):
            cases.append(
                Case(
                    9,
                    f"{sig.name} to kvsim run after {delay} s, into an earlier run's folder",
                    live=_interrupt_run(sig, delay),
                )
            )
    for sig in (signal.SIGKILL, signal.SIGINT, signal.SIGTERM):
        cases.append(Case(9, f"{sig.name} to kvsim sweep (2 workers)", live=_killed_sweep(sig)))
    cases.append(Case(9, "SIGKILL to kvsim plan (2 workers)", live=_killed_sweep(signal.SIGKILL, "plan")))
    return cases


def corpus(quick: bool = False, classes: set[int] | None = None) -> list[Case]:
    """Every case, or (``quick``) the fixed CI corpus of concrete hostile cases."""
    out: list[Case] = []
    for n, make in (
        (1, _class1),
        (2, _class2),
        (3, _class3),
        (4, _class4),
        (5, _class5),
        (6, _class6),
        (7, _class7),
        (8, _class8),
        (9, _class9),
    ):
        if classes and n not in classes:
            continue
        out += [c for c in make() if c.ci or not quick]
    return out


# --- uploads whose bytes are made at setup time -------------------------------------------------


def _resolve_uploads(case: Case, work: Path) -> None:
    """Uploads given as empty bytes read their content from the case folder (written by setup)."""
    fixed = []
    for kind, name, data in case.uploads:
        if not data:
            src = work / ("upload.yaml" if kind == "scenario" else name)
            data = src.read_bytes()
        fixed.append((kind, name, data))
    case.uploads[:] = fixed


def prepared(case: Case) -> Case:
    """``case`` ready to run: a copy whose empty uploads are read from the case folder after setup."""
    if not case.uploads:
        return case
    run = Case(**{**case.__dict__, "uploads": list(case.uploads)})
    setup = case.setup

    def with_uploads(work: Path) -> None:
        if setup is not None:
            setup(work)
        _resolve_uploads(run, work)

    run.setup = with_uploads
    return run


def run_all(
    cases: list[Case], root: Path, timeout_s: float = TIMEOUT_S, log: Callable[[str], None] = print
) -> list[dict]:
    results = []
    for i, case in enumerate(cases):
        folder = root / f"case-{i:04d}"
        outcome, problem = run_case(prepared(case), folder, timeout_s)
        results.append(
            {
                "class": case.cls,
                "name": case.name,
                "expect": case.expect,
                "ci": case.ci,
                "handled": problem is None,
                "problem": problem,
                "exit": outcome.code,
                "wall_s": round(outcome.wall_s, 2),
                "maxrss_mb": round(outcome.maxrss_mb),
                "stderr": outcome.stderr.strip()[-300:],
            }
        )
        log(
            f"[{i + 1}/{len(cases)}] class {case.cls} {'ok  ' if problem is None else 'BAD '} {case.name}"
            + ("" if problem is None else f" — {problem}")
        )
        shutil.rmtree(folder, ignore_errors=True)
    return results


def table(results: list[dict]) -> list[dict]:
    rows = []
    for n, what in CLASSES.items():
        rs = [r for r in results if r["class"] == n]
        if rs:
            rows.append({"class": n, "what": what, "tried": len(rs), "mishandled": sum(not r["handled"] for r in rs)})
    return rows


def warm() -> None:
    """Import what cases use, before forking them (see below)."""
    # Cases run as nobody cannot import from a Python installed under /root: import ahead.
    import encodings.latin_1  # noqa: F401
    import encodings.utf_8_sig  # noqa: F401
    import encodings.utf_16  # noqa: F401
    import html  # noqa: F401

    import pyarrow.parquet  # noqa: F401

    import sim.analysis.planner  # noqa: F401
    import sim.analysis.report  # noqa: F401
    import sim.analysis.sweep  # noqa: F401
    import sim.cli.main  # noqa: F401
    import sim.engine.cluster  # noqa: F401
    import sim.explorer  # noqa: F401


def parse_classes(text: str) -> set[int] | None:
    """``--classes``: comma-separated class numbers (``None``: every class); an argparse type."""
    out = set()
    for part in text.split(","):
        if not part.strip():
            continue
        try:
            n = int(part)
        except ValueError:
            n = 0
        if n not in CLASSES:
            raise argparse.ArgumentTypeError(
                f"got {text!r}; comma-separated class numbers, {min(CLASSES)} to {max(CLASSES)} (e.g. 2,5)"
            )
        out.add(n)
    return out or None


def result_name(quick: bool, classes: set[int] | None) -> str:
    """The JSON file's name without ``.json``, the same from ``python -m bench hostile`` and
    ``python -m bench.hostile``: ``hostile`` only for the whole corpus."""
    name = "hostile-quick" if quick else "hostile"
    return name + (f"-classes-{'-'.join(map(str, sorted(classes)))}" if classes else "")


def run(quick: bool, out: Path, classes: set[int] | None = None, timeout_s: float = TIMEOUT_S) -> dict:
    warm()
    cases = corpus(quick, classes)
    root = Path(tempfile.mkdtemp(prefix="kvsim-hostile-"))
    os.chmod(root, 0o777)
    t0 = time.perf_counter()
    try:
        results = run_all(cases, root, timeout_s)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "quick": quick,
        "timeout_s": timeout_s,
        "memory_limit_bytes": MEM_BYTES,
        "wall_s": time.perf_counter() - t0,
        "table": table(results),
        "cases": results,
    }


CLASSES_HELP = "comma-separated class numbers, 1 to 9 (default: all)"
OUT_HELP = "folder for hostile.json (hostile-quick.json with --quick; -classes-2-5 added with --classes 2,5)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="only the fixed CI corpus")
    ap.add_argument("--classes", type=parse_classes, default=None, help=CLASSES_HELP)
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S, help="wall-clock limit per case (s)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench"), help=OUT_HELP)
    args = ap.parse_args(argv)
    data = run(args.quick, args.out, args.classes, args.timeout)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{result_name(args.quick, args.classes)}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"\n{'class':>5}  {'tried':>5}  {'mishandled':>10}  what")
    for r in data["table"]:
        print(f"{r['class']:>5}  {r['tried']:>5}  {r['mishandled']:>10}  {r['what']}")
    tot = sum(r["tried"] for r in data["table"]), sum(r["mishandled"] for r in data["table"])
    print(f"{'all':>5}  {tot[0]:>5}  {tot[1]:>10}  ({data['wall_s']:.0f} s); wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
