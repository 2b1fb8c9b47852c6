"""Every way a ``kvsim`` command ends on bad input or an interruption: one line on stderr, one code.

:func:`run_app` runs the typer app and turns what escapes a command into one ``error: ...`` line:

* :class:`~sim.errors.ConfigError` (bad input of any command) and click's usage errors (an
  unknown option, a missing value): exit status 2;
* an ``OSError`` naming a file (a disk that filled, a folder made read-only mid-run): exit 2;
* Ctrl-C (SIGINT) and SIGTERM: both raise :class:`Interrupted` in the main thread; the command
  unwinds (temporary files are removed, outputs staged for a commit are dropped, sweep and plan
  workers are killed) and the process exits with 128 + the signal number (130, 143). A second
  signal while it unwinds raises nothing (an exception in the middle of the cleanup is what
  would leave workers running and the command waiting on them); a third ends the process at once.
* A signal while ``sim.cli.main`` is still importing (:func:`hold_early`), before any work has
  started, is the same one line and exit status, not a traceback out of the imports.

Outputs are never half-written (:mod:`sim.output.staging`, the sweep's per-point files), so an
interrupted command leaves earlier results as they were.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from sim.errors import ConfigError


def _click_classes(name: str) -> tuple[type[BaseException], ...]:
    """A click exception class from click and from the copy typer vendors (``typer._click``)."""
    import click

    out: list[type[BaseException]] = [getattr(click.exceptions, name)]
    try:
        from typer._click import exceptions as vendored

        out.append(getattr(vendored, name))
    except (ImportError, AttributeError):
        pass
    return tuple(dict.fromkeys(out))


#: Signals received (their numbers), in order.
RECEIVED: list[int] = []
#: Whether the line of an interrupted command has been written.
_ANNOUNCED = False


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: a ``KeyboardInterrupt`` so that ``except Exception`` never swallows it."""


def _on_signal(signum: int, frame: Any) -> None:
    RECEIVED.append(signum)
    if len(RECEIVED) == 1:
        raise Interrupted(signal.Signals(signum).name)
    if len(RECEIVED) >= 3:  # the unwinding is stuck: the user insists, nothing is left to save
        if not _ANNOUNCED:
            _interrupted()
        os._exit(128 + RECEIVED[0])


def install() -> None:
    """SIGINT and SIGTERM raise :class:`Interrupted` (main thread only, as Python's handlers run)."""
    global _ANNOUNCED
    RECEIVED.clear()
    _ANNOUNCED = False
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)


def _on_early_signal(signum: int, frame: Any) -> None:
    # Raised here, the exception would leave through the half-done imports as a traceback; no work
    # has started and nothing is written yet, so ending the process is all there is to do.
    RECEIVED[:] = [signum]
    _interrupted()
    os._exit(128 + signum)


def hold_early() -> Any:
    """Until the returned function is called, SIGINT/SIGTERM end the process with the one line.

    For the imports of ``sim.cli.main`` (typer, rich, every command's module), which take most of a
    second; the returned function puts back the handlers found, so that importing the module in
    another program leaves its handlers as they were.
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    before = {sig: signal.signal(sig, _on_early_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, handler in before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    return restore


def ignore_late() -> None:
    """After an interrupted command has unwound: ignore SIGINT/SIGTERM while the interpreter exits.

    Python puts back the default action of a signal whose handler it set (not of an ignored one)
    late in its exit, so a second Ctrl-C landing there would end the process by the signal, with
    no exit status of its own, after the line has said it stopped cleanly.
    """
    if RECEIVED:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)


def _line(text: str) -> None:
    sys.stderr.write(" ".join(f"error: {text}".split("\n")) + "\n")
    sys.stderr.flush()


def _interrupted(args: list[str] | None = None) -> int:
    """The one line of an interrupted command (``args``: its command line; only a sweep resumes)."""
    global _ANNOUNCED
    _ANNOUNCED = True
    sig = RECEIVED[0] if RECEIVED else signal.SIGINT
    words = [a for a in (sys.argv[1:] if args is None else args) if not a.startswith("-")]
    resumes = " (a sweep resumes from its finished points)" if words[:1] == ["sweep"] else ""
    _line(f"interrupted by {signal.Signals(sig).name}; results already in place are unchanged{resumes}")
    return 128 + int(sig)


def run_app(app: Any, args: list[str] | None = None) -> int:
    """Run a typer ``app`` (non-standalone) and return the process exit status (module docstring)."""
    no_args, click_error, abort = (_click_classes(n) for n in ("NoArgsIsHelpError", "ClickException", "Abort"))
    install()
    try:
        rv = app(args=args, standalone_mode=False)
    except ConfigError as exc:
        _line(str(exc))
        return 2
    except no_args as exc:  # bare ``kvsim`` or ``kvsim list``: the command's help, exit status 2
        ctx = getattr(exc, "ctx", None)
        text = ctx.get_help() if ctx is not None else getattr(exc, "format_message", lambda: "")()
        if text:
            import click

            click.echo(text)
        return 2
    except click_error as exc:
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "kvsim"
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        _line(f"{where}: {message} (see {where} --help)")
        return int(getattr(exc, "exit_code", 2))
    except abort + (KeyboardInterrupt,):
        return _interrupted(args)
    except OSError as exc:
        if exc.filename is None:
            raise
        _line(f"{exc.filename}: {exc.strerror or type(exc).__name__}")
        return 2
    if isinstance(rv, int) and not isinstance(rv, bool):
        if rv == 130 and RECEIVED:  # typer's answer to a KeyboardInterrupt inside a command
            return _interrupted(args)
        return rv
    return 0
