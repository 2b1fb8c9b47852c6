"""Progress of the serving-benchmark fits on a console (``kvsim calibrate --from-serving-bench``,
``kvsim validate --serving-bench``): rich bars on a terminal, plain lines in a log. The fits report
through :func:`calibration.serving_fit.reporting`; this module only shows what they report."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .serving_fit import reporting


def _duration(s: float) -> str:
    s = max(0, int(round(s)))
    h, m = divmod(s, 3600)
    m, sec = divmod(m, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"


class PlainReporter:
    """Progress as plain lines, for a log or CI (stderr not a terminal): one at each fold and phase,
    and one at most every ``every`` seconds while evaluations go on. The ETA of a fit is its
    evaluations left at the mean time of those done (an upper bound: a fit may converge before
    ``--max-evals``); of all the folds, the folds left at the mean time of those done."""

    def __init__(self, command: str, write: Callable[[str], None] | None = None, every: float = 10.0):
        self.command = command
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.every = every
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
        parts[-1] += f", {_duration(now - self.t0)} elapsed"
        if self.total and self.done:
            left = (now - self.phase_t0) / self.done * max(0, self.total - self.done)
            parts[-1] += f", this fit at most {_duration(left)} more"
        if self.fold_count and self.fold_no > 1:
            per = (self.fold_t0 - self.t0) / (self.fold_no - 1)
            left = per * (self.fold_count - self.fold_no + 1) - (now - self.fold_t0)
            parts[-1] += f", all folds about {_duration(max(left, 0.0))} more"
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
    terminal, else :class:`PlainReporter` lines; nothing with ``quiet``."""
    if quiet:
        with reporting(None):
            yield
        return
    if getattr(console, "is_terminal", False):
        with RichReporter(command, console) as rich_rep, reporting(rich_rep):
            yield
        return

    def write(line: str) -> None:
        # Straight to the file, not console.print: a log's line stays whole, not wrapped at 80 columns.
        console.file.write(line + "\n")
        console.file.flush()

    with reporting(PlainReporter(command, write=write)):
        yield
