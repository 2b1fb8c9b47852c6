"""How every long ``kvsim`` command shows its progress on stderr: ``run`` (requests), ``sweep``
(points), ``plan`` (candidates), ``calibrate --device`` (kernel timings) and, through
``calibration/fit_progress.py``, the serving-benchmark fits.

* On a terminal (or in Jupyter): a rich bar with the count, the time elapsed and an ETA. The ETA
  is the units left at the mean time of those done, less the time since the last one finished
  (:func:`countdown_eta`), redrawn several times a second: it keeps counting down while a long
  unit runs instead of freezing until the unit ends.
* Anywhere else (stderr piped to a file, CI logs, ``nohup``, ``2> log``, a dumb terminal): plain
  lines, whole, with no terminal codes: one at the start, one when a unit finishes but at most
  every :func:`log_every` seconds (10 s; ``KVSIM_PROGRESS_EVERY_S`` sets another interval), and
  one at the end (``done``, or ``stopped`` when the command was interrupted or failed).

A line reads ``COMMAND: DONE/TOTAL UNIT[EXTRA] (NOTE), ELAPSED elapsed, about ETA more``, e.g.
``sweep alloc-vs-rate: 12/64 points, 1 failed, 2m10s elapsed, about 9m23s more``.

Which layer imports which: ``calibration`` imports this module (and the rest of ``sim``). The
simulator itself (everything in ``sim`` outside ``sim/cli`` and ``sim/explorer``) imports nothing
from ``calibration``, so using it as a library loads none of calibration. Two front-end
modules do import it: ``sim/cli/main.py`` mounts calibration's commands on ``kvsim``, and
``sim/explorer/calibration_view.py`` reads the measured kernel tables behind a profile's curves.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

#: Seconds between two plain progress lines at most (a line is also written at the start and end).
EVERY_S = 10.0
#: Environment variable that sets another interval (seconds, >= 0; 0 writes a line per unit).
EVERY_ENV = "KVSIM_PROGRESS_EVERY_S"

Clock = Callable[[], float]


def log_every(default: float = EVERY_S) -> float:
    """The interval between plain lines: ``KVSIM_PROGRESS_EVERY_S`` when it is a number >= 0, else ``default``."""
    raw = os.environ.get(EVERY_ENV, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if math.isfinite(value) and value >= 0 else default


def duration(s: float) -> str:
    """``7s``, ``3m05s``, ``1h02m00s``."""
    s = max(0, int(round(s)))
    h, m = divmod(s, 3600)
    m, sec = divmod(m, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"


def countdown_eta(done: int, total: int | None, started: float, last_done: float, now: float) -> float | None:
    """Seconds left: the ``total - done`` units left at the mean time of the ``done`` finished by
    ``last_done`` (since ``started``), less the time since ``last_done`` (never below 0). ``None``
    while nothing is done or the total is unknown. Between two finished units it counts down with
    the clock; at each it is re-estimated."""
    if total is None or done <= 0:
        return None
    if done >= total:
        return 0.0
    per = (last_done - started) / done
    return max(per * (total - done) - (now - last_done), 0.0)


class Throttle:
    """Says a line is due at most once every ``every`` seconds of ``clock`` (the first time: always)."""

    def __init__(self, every: float | None = None, clock: Clock = time.perf_counter):
        self.every = log_every() if every is None else every
        self.clock = clock
        self.last: float | None = None

    def due(self) -> bool:
        return self.last is None or self.clock() - self.last >= self.every

    def mark(self) -> None:
        self.last = self.clock()


def stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def live_bars(console: Any) -> bool:
    """Whether ``console`` shows a live rich bar: a terminal that is not dumb, or Jupyter. Elsewhere
    rich draws nothing until the bar stops, so the commands write plain lines instead."""
    if getattr(console, "is_jupyter", False):
        return True
    return bool(getattr(console, "is_terminal", False)) and not getattr(console, "is_dumb_terminal", False)


def line_writer(console: Any | None = None) -> Callable[[str], None]:
    """Writes one line, flushed, straight to ``console``'s file (stderr without one): not through
    ``console.print``, so that a log's line stays whole instead of wrapped at 80 columns."""

    def write(line: str) -> None:
        f = console.file if console is not None else sys.stderr
        f.write(line + "\n")
        f.flush()

    return write


class Progress:
    """The progress of one command's ``total`` units of work (``None``: not known yet, shown ``?``).

    ``show=False``: nothing is shown (a ``--quiet`` command). Else a bar when ``console`` (stderr by
    default) shows live bars (:func:`live_bars`), plain lines otherwise or when ``write`` is given.
    ``transient``: the bar is erased when it stops (else its last state stays on screen).
    ``lazy``: plain lines begin only once the command has run ``every`` seconds, and the last line
    only follows earlier ones (a short ``kvsim run`` writes none, and its error stays one line).
    :meth:`start` (or entering the ``with`` block) starts the display; :meth:`update` reports what
    is done; :meth:`stop` (or leaving the block) ends it with a last line. ``every`` and ``clock``:
    the interval between plain lines (default :func:`log_every`) and the time source (tests).
    """

    def __init__(
        self,
        command: str,
        unit: str,
        total: int | None = None,
        *,
        show: bool = True,
        console: Any | None = None,
        write: Callable[[str], None] | None = None,
        transient: bool = True,
        every: float | None = None,
        clock: Clock = time.perf_counter,
        note: str = "",
        extra: str = "",
        lazy: bool = False,
    ):
        self.command, self.unit, self.total = command, unit, total
        self.lazy = lazy
        self.wrote = False
        self.note, self.extra = note, extra
        self.done = 0
        self.clock = clock
        self.throttle = Throttle(every, clock)
        self.started: float | None = None
        self.last_done = 0.0
        self.stopped = False
        self.write: Callable[[str], None] | None = None
        self.bar: Any = None
        self.task: Any = None
        if not show:
            return
        if write is None:
            console = console if console is not None else stderr_console()
            if live_bars(console):
                self.bar = self._make_bar(console, transient)
                return
            write = line_writer(console)
        self.write = write

    # --- what is shown --------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """``bar``, ``lines`` or ``off``."""
        return "bar" if self.bar is not None else "lines" if self.write is not None else "off"

    def elapsed(self) -> float:
        return 0.0 if self.started is None else self.clock() - self.started

    def eta(self) -> float | None:
        """Seconds left (:func:`countdown_eta`), refreshed from the clock at each call."""
        if self.started is None:
            return None
        return countdown_eta(self.done, self.total, self.started, self.last_done, self.clock())

    def count_text(self) -> str:
        return f"{self.done}/{'?' if self.total is None else self.total} {self.unit}{self.extra}"

    def line(self, state: str = "") -> str:
        """The plain line now; ``state``: ``done`` or ``stopped`` for the last one."""
        head = f"{state}, " if state else ""
        text = f"{self.command}: {head}{self.count_text()}"
        if self.note and not state:
            text += f" ({self.note})"
        text += f", {duration(self.elapsed())} elapsed"
        left = self.eta()
        if not state and left is not None and self.done < (self.total or 0):
            text += f", about {duration(left)} more"
        return text

    def _make_bar(self, console: Any, transient: bool) -> Any:
        from rich.progress import BarColumn, Progress as RichProgress, ProgressColumn, TimeElapsedColumn
        from rich.text import Text

        me = self

        class _Label(ProgressColumn):
            def render(self, task: Any) -> Text:
                label = Text(me.command, style="bold")
                if me.note:
                    label.append(f" {me.note}")
                return label

        class _Count(ProgressColumn):
            def render(self, task: Any) -> Text:
                return Text(me.count_text())

        class _Eta(ProgressColumn):
            # Not rich's TimeRemainingColumn: that one moves only when a unit finishes.
            max_refresh = 0.5

            def render(self, task: Any) -> Text:
                left = me.eta()
                return Text("eta " + ("-:--:--" if left is None else _clock_text(left)), style="progress.remaining")

        return RichProgress(
            _Label(),
            BarColumn(),
            _Count(),
            TimeElapsedColumn(),
            _Eta(),
            console=console,
            transient=transient,
            refresh_per_second=4,
            get_time=self.clock,
        )

    # --- reporting --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the display (once): the bar, or the first line."""
        if self.started is not None:
            return
        self.started = self.last_done = self.clock()
        if self.bar is not None:
            self.task = self.bar.add_task("", total=self.total)
            self.bar.start()
        elif self.write is not None:
            self.throttle.mark()
            if not self.lazy:
                self._emit(self.line())

    def update(
        self,
        done: int | None = None,
        *,
        advance: int = 0,
        total: int | None = None,
        note: str | None = None,
        extra: str | None = None,
    ) -> None:
        """``done`` units of ``total`` finished (or ``advance`` more); ``note`` and ``extra``: the
        text after the count (``extra``, e.g. ``", 1 failed"``) and in parentheses (``note``)."""
        if self.started is None:
            self.start()
        if total is not None:
            self.total = total
        if note is not None:
            self.note = note
        if extra is not None:
            self.extra = extra
        new = (self.done if done is None else done) + advance
        finished_more = new > self.done
        if finished_more:
            self.last_done = self.clock()
        self.done = new
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, total=self.total)
        elif self.write is not None and finished_more and self.throttle.due():
            self.throttle.mark()
            self._emit(self.line())

    def stop(self, ok: bool = True) -> None:
        """End the display (once): the bar stops; the last line says ``done`` (``stopped`` unless ``ok``)."""
        if self.stopped or self.started is None:
            self.stopped = True
            return
        self.stopped = True
        if self.bar is not None:
            self.bar.stop()
        elif self.write is not None and (self.wrote or not self.lazy):
            self._emit(self.line("done" if ok else "stopped"))

    def _emit(self, line: str) -> None:
        assert self.write is not None
        self.wrote = True
        self.write(line)

    def __enter__(self) -> Progress:
        self.start()
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.stop(ok=exc_type is None)


def _clock_text(s: float) -> str:
    s = max(0, int(math.ceil(s)))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}"


__all__ = [
    "EVERY_ENV",
    "EVERY_S",
    "Progress",
    "Throttle",
    "countdown_eta",
    "duration",
    "line_writer",
    "live_bars",
    "log_every",
    "stderr_console",
]
