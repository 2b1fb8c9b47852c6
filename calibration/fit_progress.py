"""Progress of the serving-benchmark fits on a console (``kvsim calibrate --from-serving-bench``,
``kvsim validate --serving-bench``): rich bars on a terminal, plain lines in a log. The fits report
through :func:`calibration.serving_fit.reporting`; this module only shows what they report, in the
fits' own words (folds, phases, evaluations). When a bar or a line is shown, and how a line is
written, is :mod:`sim.output.progress`'s, as for every other command."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sim.output.progress import countdown_eta, duration, line_writer, live_bars, log_every

from .serving_fit import reporting


class PlainReporter:
    """Progress as plain lines, for a log or CI (stderr not a terminal): one at each fold and phase,
    and one at most every ``every`` seconds (:func:`sim.output.progress.log_every`: 10 s) while
    evaluations go on. The ETA of a fit is its evaluations left at the mean time of those done (an
    upper bound: a fit may converge before ``--max-evals``); of all the folds, the folds left at the
    mean time of those done, counting down within a fold (:func:`sim.output.progress.countdown_eta`)."""

    def __init__(self, command: str, write: Callable[[str], None] | None = None, every: float | None = None):
        self.command = command
        self.write = write or line_writer()
        self.every = log_every() if every is None else every
        self.t0 = time.perf_counter()
        self.fold_no = 0
        self.fold_count = 0
        self.fold_text = ""
        self.fold_t0 = self.t0
        self.label = ""
        self.total: int | None = None
        self.done = 0
        self.phase_t0 = self.t0
        self.last = 0.0

    def _line(self) -> str:
        now = time.perf_counter()
        parts = [f"{self.command}:"]
        if self.fold_text:
            parts.append(f"fold {self.fold_no}/{self.fold_count}: {self.fold_text}:")
        parts.append(self.label)
        if self.total:
            parts[-1] += f", {self.done}/{self.total} evaluations"
        parts[-1] += f", {duration(now - self.t0)} elapsed"
        if self.total and self.done:
            left = (now - self.phase_t0) / self.done * max(0, self.total - self.done)
            parts[-1] += f", this fit at most {duration(left)} more"
        if self.fold_count and self.fold_no > 1:
            folds_left = countdown_eta(self.fold_no - 1, self.fold_count, self.t0, self.fold_t0, now) or 0.0
            parts[-1] += f", all folds about {duration(folds_left)} more"
        return " ".join(parts)

    def _emit(self) -> None:
        self.last = time.perf_counter()
        self.write(self._line())

    def fold(self, index: int, count: int, label: str) -> None:
        self.fold_no, self.fold_count, self.fold_text = index, count, label
        self.fold_t0 = time.perf_counter()

    def phase(self, label: str, total: int | None) -> None:
        self.label, self.total, self.done = label, total, 0
        self.phase_t0 = time.perf_counter()
        self._emit()

    def evals(self, done: int) -> None:
        self.done = done
        if time.perf_counter() - self.last >= self.every:
            self._emit()


class RichReporter:
    """Progress as rich bars on a terminal: the folds (with their ETA) and the running phase's
    evaluations of ``--max-evals`` (with an ETA from them); gone when the work ends."""

    def __init__(self, command: str, console: Any):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.command = command
        self.bar = Progress(
            TextColumn(f"[bold]{command}[/] {{task.description}}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self.folds: Any = None
        self.task = self.bar.add_task("starting", total=None)

    def __enter__(self) -> RichReporter:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def fold(self, index: int, count: int, label: str) -> None:
        if self.folds is None:
            self.folds = self.bar.add_task("", total=count)
        self.bar.update(self.folds, completed=index - 1, description=f"fold {index}/{count}: {label}")

    def phase(self, label: str, total: int | None) -> None:
        self.bar.reset(self.task, total=total, completed=0, description=f"{label} (evaluations)" if total else label)

    def evals(self, done: int) -> None:
        self.bar.update(self.task, completed=done)


@contextmanager
def progress_display(command: str, console: Any, quiet: bool = False) -> Iterator[None]:
    """Fits run inside this block show their progress on ``console`` (stderr): rich bars on a
    terminal (:func:`sim.output.progress.live_bars`), else :class:`PlainReporter` lines; nothing
    with ``quiet``."""
    if quiet:
        with reporting(None):
            yield
        return
    if live_bars(console):
        with RichReporter(command, console) as rich_rep, reporting(rich_rep):
            yield
        return

    with reporting(PlainReporter(command, write=line_writer(console))):
        yield
