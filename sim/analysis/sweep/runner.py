"""Running a sweep into its folder: which points to run, reuse, relabel or drop (:func:`run_sweep`),
and the local process pool, rebuilt when a worker dies (:func:`run_points_locally`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from sim.analysis.sweep.dataset import (
    DROPPED_DIR,
    META_FILE,
    axis_types,
    part_files,
    part_path,
    read_dataset,
    relabelled_row,
    row_table,
    write_atomic,
)
from sim.analysis.sweep.point import default_workers, lost_result, point_task, process_pool, run_point
from sim.analysis.sweep.ray_cluster import RaySession, run_on_ray
from sim.analysis.sweep.spec import Point, SweepSpec, load_sweep
from sim.engine.budget import RunBudget
from sim.errors import ConfigError
from sim.limits import MAX_WORKERS
from sim.output.results import replace_file
from sim.output.staging import out_dir

if TYPE_CHECKING:
    from sim.analysis.worker_lifetime import WorkerPool


@dataclass
class SweepResult:
    out: Path
    name: str
    #: Distinct points in the sweep.
    total: int
    #: Points already ``ok`` in the dataset (or kept in ``_dropped/``), reused without running.
    skipped: int
    #: Points simulated by this call.
    ran: int
    #: Points whose scenario failed validation (recorded failed without running).
    invalid: int
    #: ``{"point_id", "params", "error"}`` of every point that failed in this call.
    failures: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    axes: list[str] = field(default_factory=list)
    #: Of the reused points, those whose row was rewritten for this sweep file (its index, seed or
    #: axis columns had changed with the file).
    relabelled: int = 0
    #: Points in the dataset before this call that the sweep file no longer has, removed from it.
    dropped: int = 0
    #: Of the dropped points, the finished ones, moved to ``out/_dropped/``.
    kept_apart: int = 0
    #: The SLO the points were judged against (:meth:`SLO.describe`), or ``None``.
    slo_text: str | None = None

    @property
    def ok(self) -> bool:
        return not self.failures

    def table(self) -> pa.Table:
        return read_dataset(self.out)


ProgressHook = Callable[[int, int, int], None]


def run_sweep(
    sweep_path: str | Path,
    workers: int | None = None,
    backend: str = "local",
    address: str | None = None,
    out: str | Path | None = None,
    progress: bool | ProgressHook = True,
    budget: RunBudget | None = None,
) -> SweepResult:
    """Run every point of a sweep file not already ``ok`` in the dataset at ``out``.

    ``workers``: parallel processes (default: the CPU cores available). ``backend``: ``local``
    (process pool) or ``ray`` (a local Ray of its own, or ``ray.init(address)`` for a cluster,
    whose nodes need kvsim installed and trace files at the same paths; Ray is connected to
    before anything in ``out`` changes, and an address where no Ray answers raises
    :class:`ConfigError` within about 20 s). ``out``: dataset directory (default
    ``sweeps/<sweep name>``). ``progress``: ``True`` shows it on stderr (a bar on a terminal, plain
    lines in a log: :mod:`sim.output.progress`), ``False`` nothing, a callable ``(done, total,
    failed)`` is called instead (once before any point runs, then as each finishes). ``budget``:
    limits of each point's run (:mod:`sim.engine.budget`; a point past it is recorded failed). Bad
    sweep files raise :class:`ConfigError` before any point runs.
    """
    t0 = time.perf_counter()
    if backend not in ("local", "ray"):
        raise ConfigError("--backend", backend, "local or ray")
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise ConfigError("--workers", workers, f"an integer in [1, {MAX_WORKERS}]")
    if address is not None and backend != "ray":
        raise ConfigError("--address", address, "only with --backend ray")
    if address is not None and not address.strip():
        raise ConfigError("--address", address, "a Ray cluster's address (host:port, or ray://host:port)")
    spec = load_sweep(sweep_path)
    points = spec.points()
    out_given = Path(out if out is not None else Path("sweeps") / spec.name)
    made = [d for d in (out_given, *out_given.parents) if not os.path.lexists(d)]  # what out_dir makes
    out = out_dir(out_given)
    ray_session = RaySession(address, workers or default_workers()) if backend == "ray" else None
    if ray_session is not None and _runs_any(out, points):
        # Before anything in the folder changes: a bad --address (or a Ray that cannot start)
        # fails here with one line and leaves the dataset as it was.
        try:
            ray_session.connect()
        except BaseException:
            for d in made:  # made just now by out_dir, and still empty
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise
    try:
        return _sweep_into(out, sweep_path, spec, points, t0, workers, ray_session, progress, budget)
    finally:
        if ray_session is not None:
            ray_session.close()


def _sweep_into(
    out: Path,
    sweep_path: str | Path,
    spec: SweepSpec,
    points: list[Point],
    t0: float,
    workers: int | None,
    ray_session: RaySession | None,
    progress: bool | ProgressHook,
    budget: RunBudget | None,
) -> SweepResult:
    """The body of :func:`run_sweep` once the folder and the backend are ready."""
    for stale in out.glob(".part-*.tmp"):  # left by a killed run; never a finished point
        stale.unlink(missing_ok=True)
    types = axis_types(spec.axes, points)
    meta = (
        json.dumps(
            {
                "name": spec.name,
                "sweep_file": str(Path(sweep_path).resolve()),
                "base": spec.base,
                "axes": [a.key for a in spec.axes],
                # Paired axes (each zip group of two or more): the report draws them as one axis.
                "zip": [[a.key for a in g] for g in spec.groups if len(g) > 1],
                "seeds": spec.seeds,
                "slo": spec.slo.as_dict() if spec.slo is not None else None,
                "step_breakdown": spec.step_breakdown,
                "points": len(points),
                "point_ids": [p.point_id for p in points],
            },
            indent=1,
        )
        + "\n"
    )
    # Written first: a run killed while it reconciles the folder below leaves a dataset that
    # read_dataset already narrows to this file's points; the rerun finishes the job.
    replace_file(out / META_FILE, lambda path: path.write_text(meta))
    reuse, relabelled, dropped, kept_apart = _reconcile(out, points, types)

    todo = [p for p in points if p.point_id not in reuse]
    skipped = len(points) - len(todo)
    invalid = [p for p in todo if p.scenario is None]
    runnable = [p for p in todo if p.scenario is not None]
    failures: list[dict] = []

    def record(point: Point, result: dict) -> None:
        write_atomic(row_table(point, result, types), part_path(out, point.point_id))
        if result["status"] != "ok":
            failures.append({"point_id": point.point_id, "params": point.params, "error": result["error"]})

    for p in invalid:
        record(p, {"status": "failed", "error": p.error, "metrics": {}, "wall_s": 0.0})

    n_workers = workers or default_workers()
    with _Progress(progress, spec.name, len(todo)) as bar:
        bar.update(len(invalid), len(failures))
        if runnable:

            def on_result(p: Point, r: dict) -> None:
                record(p, r)
                bar.update(1, len(failures))

            if ray_session is not None:
                run_on_ray(ray_session, runnable, on_result, budget)
            else:
                run_points_locally(runnable, n_workers, None, on_result, budget)
    return SweepResult(
        out,
        spec.name,
        len(points),
        skipped,
        len(runnable),
        len(invalid),
        failures,
        time.perf_counter() - t0,
        [a.key for a in spec.axes],
        relabelled,
        dropped,
        kept_apart,
        spec.slo.describe() if spec.slo is not None else None,
    )


def _reconcile(out: Path, points: list[Point], types: dict[str, pa.DataType]) -> tuple[set[str], int, int, int]:
    """Make the dataset at ``out`` hold only points of this expansion, before any point runs.

    A finished (``ok``) row whose point id is a point of the expansion (the same resolved
    scenario) is reused: rewritten with this expansion's index, seed and axis columns when they
    differ (another sweep file put it there), taken back from ``_dropped/`` if an earlier sweep
    file had dropped it. Rows of points the expansion does not have leave ``out``: finished ones
    move to ``_dropped/``, failed ones are deleted. Returns (reused point ids, rows rewritten,
    points dropped, points moved to ``_dropped/``)."""
    here = part_files(out)
    apart_dir = out / DROPPED_DIR
    apart = part_files(apart_dir)
    by_id = {p.point_id: p for p in points}
    reuse: set[str] = set()
    relabelled = 0
    for pid, point in by_id.items():
        if point.scenario is None:  # an invalid point is recorded again, never reused
            continue
        src = here.get(pid, ("", None))
        if src[0] != "ok":
            src = apart.get(pid, ("", None))
        status, f = src
        if status != "ok" or f is None:
            continue
        try:
            old = pq.read_table(f)
        except Exception:  # unreadable since it was listed: run the point again
            continue
        new = relabelled_row(old, point, types)
        if f.parent != out or not new.equals(old):
            write_atomic(new, part_path(out, pid))
            relabelled += 1
        if f.parent != out:
            f.unlink(missing_ok=True)
        reuse.add(pid)
    dropped = kept_apart = 0
    for pid, (status, f) in here.items():
        if pid in by_id:
            continue
        dropped += 1
        if status == "ok":
            if not kept_apart:
                out_dir(apart_dir)
            os.replace(f, part_path(apart_dir, pid))
            kept_apart += 1
        else:
            f.unlink(missing_ok=True)
    return reuse, relabelled, dropped, kept_apart


def run_points_locally(
    points: list[Point],
    workers: int,
    address,
    on_result,
    budget: RunBudget | None = None,
) -> None:
    """Run ``points`` in a process pool of ``workers``, calling ``on_result(point, result)`` as each
    finishes (once per point).

    A worker process that dies (the out-of-memory killer, ``kill -9``, a crash in native code) breaks
    a ``concurrent.futures`` pool: every point still running or queued in it fails with
    ``BrokenProcessPool``. Those points are not recorded; a fresh pool runs them. The point whose worker
    died is told by the workers' exit statuses and the marker each worker keeps of the point it runs
    (:func:`_run_marked`); where that cannot be told (the worker died of SIGTERM, which the pool's own
    clean-up sends the others too), every point then running is suspect. A suspect runs once more, alone
    (no other point running, a pool of its own), after the others: it is recorded failed, with how its
    worker ended, only when it breaks that pool too. Workers run :func:`run_point` (looked up when this
    is called)."""
    fn = run_point
    marks = Path(tempfile.mkdtemp(prefix="kvsim-sweep-"))
    pool: WorkerPool | None = None
    try:
        queue = list(points)
        suspects: list[Point] = []
        fruitless = 0  # pools in a row that broke before any point finished or a suspect was found
        while queue:
            pool = process_pool(min(workers, len(queue)))
            broke = _pool_round(pool, queue, fn, marks, budget, on_result)
            pool = None
            if broke is None:
                break
            unfinished, suspect_ids, how, delivered = broke
            suspects += [p for p in unfinished if p.point_id in suspect_ids]
            queue = [p for p in unfinished if p.point_id not in suspect_ids]
            fruitless = 0 if delivered or suspect_ids else fruitless + 1
            if fruitless >= _MAX_FRUITLESS_BREAKS:
                for p in queue:  # a pool that cannot run anything (workers dying at start)
                    on_result(
                        p, _died(f"{how}; the process pool broke {fruitless} times in a row before any point finished")
                    )
                queue = []
        for p in sorted(suspects, key=lambda p: p.index):
            pool = process_pool(1)
            broke = _pool_round(pool, [p], fn, marks, budget, on_result)
            pool = None
            if broke is not None:
                on_result(p, _died(f"{broke[2]} while running this point, in the pool and again when run alone"))
    except BaseException:
        # Ctrl-C or SIGTERM: kill the workers and drop queued points now; finished ones are on disk.
        if pool is not None:
            pool.stop()
        raise
    finally:
        shutil.rmtree(marks, ignore_errors=True)


#: Pools in a row that may break with no point finished and no point to blame before the points
#: left are recorded failed (workers that die however they start would otherwise loop for ever).
_MAX_FRUITLESS_BREAKS = 3


def _run_marked(fn: Callable[[dict], dict], task: dict, marks: str) -> dict:
    """In a pool worker: ``fn(task)``, with a file ``marks/<this process id>`` naming the task's point
    while it runs, so that the sweep knows which point a worker that died was running."""
    mark = os.path.join(marks, str(os.getpid()))
    with open(mark + ".tmp", "w") as f:
        f.write(task["point_id"])
    os.replace(mark + ".tmp", mark)
    try:
        return fn(task)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(mark)


def _pool_round(
    pool: WorkerPool,
    points: list[Point],
    fn: Callable[[dict], dict],
    marks: Path,
    budget: RunBudget | None,
    on_result,
) -> tuple[list[Point], set[str], str, int] | None:
    """Run ``points`` in ``pool`` (shut down after). ``None`` when every point delivered a result;
    when a worker died, (the points that did not, the ids of those to blame, how the worker ended,
    results delivered)."""
    futures: dict[Future, Point] = {}
    for p in points:
        try:
            futures[pool.submit(_run_marked, fn, point_task(p, budget), str(marks))] = p
        except BrokenProcessPool:  # a worker died while the points were being submitted
            break
    pending = set(futures)
    unfinished = points[len(futures) :]
    delivered = 0
    while pending:
        # Once a worker has died, every future not done fails at once: wait for them all.
        done, pending = wait(pending, return_when=ALL_COMPLETED if unfinished else FIRST_COMPLETED)
        for fut in sorted(done, key=lambda f: futures[f].index):
            try:
                result = fut.result()
            except BrokenProcessPool:  # a worker died: every future not done fails alike
                unfinished.append(futures[fut])
                continue
            except Exception as exc:  # the task could not be sent or its result not read back
                result = lost_result("worker failed", exc)
            delivered += 1
            on_result(futures[fut], result)
    if not unfinished:
        pool.shutdown(wait=True)
        return None
    procs = dict(getattr(pool, "_processes", None) or {})
    pool.shutdown(wait=True)  # the pool has ended its workers: their exit statuses are known
    exits = {pid: proc.exitcode for pid, proc in procs.items()}
    running: dict[int, str] = {}
    for mark in marks.iterdir():
        with contextlib.suppress(OSError, ValueError):
            if mark.suffix != ".tmp":
                running[int(mark.name)] = mark.read_text()
        mark.unlink(missing_ok=True)
    # The pool ends the workers it did not lose with SIGTERM: any other end is a death.
    dead = {pid: code for pid, code in exits.items() if code is not None and code != -signal.SIGTERM}
    if dead:
        blamed = {running[pid] for pid in dead if pid in running}
        how = _how_it_ended(next(iter(dead.values())))
    else:  # died of SIGTERM, or no status to read: each point then running is suspect
        blamed = set(running.values())
        how = _how_it_ended(-signal.SIGTERM if any(c == -signal.SIGTERM for c in exits.values()) else None)
    unfinished.sort(key=lambda p: p.index)
    return unfinished, blamed & {p.point_id for p in unfinished}, how, delivered


#: What a signal that ends a worker usually means.
_SIGNAL_CAUSES = {
    signal.SIGKILL: "out of memory, or kill -9",
    signal.SIGSEGV: "a segmentation fault",
    signal.SIGBUS: "a bus error",
    signal.SIGABRT: "aborted",
    signal.SIGFPE: "a floating-point exception",
    signal.SIGILL: "an illegal instruction",
    signal.SIGTERM: "terminated",
}


def _how_it_ended(exitcode: int | None) -> str:
    """How a worker process ended, from its exit code (``-N``: signal N), in words."""
    if exitcode is None:
        return "its process ended abruptly"
    if exitcode < 0:
        try:
            sig = signal.Signals(-exitcode)
        except ValueError:
            return f"its process was killed by signal {-exitcode}"
        cause = _SIGNAL_CAUSES.get(sig)
        return f"its process was killed by signal {-exitcode} ({sig.name}{': ' + cause if cause else ''})"
    return f"its process exited with status {exitcode}"


def _died(why: str) -> dict:
    """A point's result when the process running it died: failed, with no time measured."""
    return {"status": "failed", "error": f"worker died: {why}", "metrics": {}, "wall_s": None}


def _runs_any(out: Path, points: list[Point]) -> bool:
    """Whether a sweep into ``out`` has a point to simulate (read-only: the folder is not changed).

    A valid point runs unless it is ``ok`` in ``out`` or in ``out/_dropped/`` (:func:`_reconcile`
    reuses it); invalid points are recorded without running."""
    done = {pid for folder in (out, out / DROPPED_DIR) for pid, (st, _) in part_files(folder).items() if st == "ok"}
    return any(p.scenario is not None and p.point_id not in done for p in points)


#: Ray settings for connecting to ``--address``, unless set in the environment: one attempt
#: (Ray's default is 20, each up to ~40 s, so a wrong address hung for minutes) whose wait for
#: the GCS to answer is 10 s (Ray's default 30 s). Read when ``ray`` is imported (the GCS
#: timeout) and by ``ray.init`` (the attempts).
class _Progress:
    """The sweep's progress (:mod:`sim.output.progress`: a bar on a terminal, plain lines in a log),
    a user callback ``(done, total, failed)``, or nothing."""

    def __init__(self, progress: bool | ProgressHook, name: str, total: int):
        from sim.output.progress import Progress

        self.hook = progress if callable(progress) else None
        self.total = total
        self.done = 0
        # The last state of the bar stays on the terminal (not transient), as it always has.
        # Nothing to run (every point reused): no 0/0 line; the command says what it reused.
        self.shown = Progress(
            f"sweep {name}", "points", total, show=progress is True and total > 0, transient=False, extra=", 0 failed"
        )

    def __enter__(self):
        self.shown.start()
        return self

    def update(self, advance: int, failed: int) -> None:
        self.done += advance
        self.shown.update(self.done, extra=f", {failed} failed")
        if self.hook is not None:
            self.hook(self.done, self.total, failed)

    def __exit__(self, exc_type, *exc):
        self.shown.stop(ok=exc_type is None)
        return False


#: The metrics ``kvsim sweep`` prints per point: (column, header, format).
