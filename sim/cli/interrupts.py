"""Every way a ``kvsim`` command ends on bad input or an interruption: one line on stderr, one code.

:func:`run_app` runs the typer app and turns what escapes a command into one ``error: ...`` line:

* :class:`~sim.errors.ConfigError` (bad input of any command) and click's usage errors (an
  unknown option, a missing value): exit status 2;
* an ``OSError`` naming a file (a disk that filled, a folder made read-only mid-run): exit 2;
* Ctrl-C (SIGINT) and SIGTERM: both raise :class:`Interrupted` in the main thread; the command
  unwinds (temporary files are removed, outputs staged for a commit are dropped, sweep workers
  are stopped) and the process exits with 128 + the signal number (130, 143).

Outputs are never half-written (:mod:`sim.output.staging`, the sweep's per-point files), so an
interrupted command leaves earlier results as they were.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

import click

from sim.errors import ConfigError


def _click_classes(name: str) -> tuple[type[BaseException], ...]:
    """A click exception class from click and from the copy typer vendors (``typer._click``)."""
    out: list[type[BaseException]] = [getattr(click.exceptions, name)]
    try:
        from typer._click import exceptions as vendored

        out.append(getattr(vendored, name))
    except (ImportError, AttributeError):
        pass
    return tuple(dict.fromkeys(out))


_NO_ARGS = _click_classes("NoArgsIsHelpError")
_CLICK = _click_classes("ClickException")
_ABORT = _click_classes("Abort")

#: Signals received (their numbers), in order.
RECEIVED: list[int] = []


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: a ``KeyboardInterrupt`` so that ``except Exception`` never swallows it."""


def _on_signal(signum: int, frame: Any) -> None:
    RECEIVED.append(signum)
    raise Interrupted(signal.Signals(signum).name)


def install() -> None:
    """SIGINT and SIGTERM raise :class:`Interrupted` (main thread only, as Python's handlers run)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)


def _line(text: str) -> None:
    sys.stderr.write(" ".join(f"error: {text}".split("\n")) + "\n")
    sys.stderr.flush()


def _interrupted(args: list[str] | None = None) -> int:
    """The one line of an interrupted command (``args``: its command line; only a sweep resumes)."""
    sig = RECEIVED[0] if RECEIVED else signal.SIGINT
    words = [a for a in (sys.argv[1:] if args is None else args) if not a.startswith("-")]
    resumes = " (a sweep resumes from its finished points)" if words[:1] == ["sweep"] else ""
    _line(f"interrupted by {signal.Signals(sig).name}; results already in place are unchanged{resumes}")
    return 128 + int(sig)


def run_app(app: Any, args: list[str] | None = None) -> int:
    """Run a typer ``app`` (non-standalone) and return the process exit status (module docstring)."""
    install()
    try:
        rv = app(args=args, standalone_mode=False)
    except ConfigError as exc:
        _line(str(exc))
        return 2
    except _NO_ARGS as exc:  # bare ``kvsim`` or ``kvsim list``: the help, as before
        ctx = getattr(exc, "ctx", None)
        text = ctx.get_help() if ctx is not None else getattr(exc, "format_message", lambda: "")()
        if text:
            click.echo(text)
        return 2
    except _CLICK as exc:
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "kvsim"
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        _line(f"{where}: {message} (see {where} --help)")
        return int(getattr(exc, "exit_code", 2))
    except _ABORT + (KeyboardInterrupt,):
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
