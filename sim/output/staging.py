"""Where outputs go: a checked output folder, and run outputs that appear all at once.

* :func:`out_dir` turns an ``--out`` argument into a folder that exists and can be written, or one
  :class:`~sim.errors.ConfigError` line saying why not (empty, a file, under a file, a device,
  read-only, a name longer than the file system allows, ``/proc``...). It runs before any
  simulation, so a bad path costs nothing.
* :func:`staged` gives a hidden staging folder inside the destination; every file of a run is
  written there, then moved into place with SIGINT/SIGTERM held back for those few renames (and
  for deleting what an earlier run left that this one does not replace). A run that fails or is
  interrupted before that leaves the destination as it was (an earlier run's files included) and
  removes the staging folder.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sim.errors import ConfigError

#: Longest file-name component most file systems allow (bytes).
NAME_MAX = 255


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def out_dir(path: str | Path, key: str = "--out") -> Path:
    """``path`` as an existing, writable folder (made with its parents when missing)."""
    raw = str(path)
    if not raw.strip():
        raise ConfigError(key, raw, "a folder path (empty given)")
    p = Path(raw)
    long = next((part for part in p.parts if len(part.encode("utf-8", "surrogateescape")) > NAME_MAX), None)
    if long is not None:
        raise ConfigError(key, raw, f"folder names of at most {NAME_MAX} bytes ({len(long)} given)")
    # The nearest existing ancestor says most: a file, a device, a read-only folder.
    probe = p
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    if os.path.lexists(probe) and not probe.is_dir():
        what = "a file" if probe.is_file() else "not a folder (a device, FIFO or broken link)"
        where = "is" if probe == p else f"is under {probe}, which is"
        raise ConfigError(key, raw, f"a folder; this path {where} {what}")
    try:
        p.mkdir(parents=True, exist_ok=True)
        test = p / f".kvsim-write-test-{os.getpid()}"
        test.write_bytes(b"")
        test.unlink()
    except OSError as exc:
        raise ConfigError(key, raw, f"a folder this user can write ({_why(exc)})") from None
    return p


def out_file(path: str | Path, key: str = "--out") -> Path:
    """``path`` as a file that can be written: not a folder, in a folder :func:`out_dir` accepts."""
    raw = str(path)
    p = Path(raw)
    if not raw.strip() or p.is_dir():
        raise ConfigError(key, raw, "a file path (this is a folder)" if raw.strip() else "a file path (empty given)")
    if len(p.name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        raise ConfigError(key, raw, f"a file name of at most {NAME_MAX} bytes")
    try:
        out_dir(p.parent, key)
    except ConfigError as exc:
        raise ConfigError(key, raw, exc.allowed) from None
    return p


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block ends (then arrive as usual)."""
    held = {signal.SIGINT, signal.SIGTERM}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, OSError, ValueError):  # no sigmask here: commit unprotected
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _move(src: Path, dst: Path) -> None:
    try:
        os.replace(src, dst)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)


@contextmanager
def staged(dest: Path, *, only: Iterable[str] | None = None, remove: list[Path] | None = None) -> Iterator[Path]:
    """A staging folder inside ``dest`` whose files replace ``dest``'s when the block succeeds.

    ``only``: the file names to move when staged, dot-named ones included (default: every staged file
    whose name does not start with a dot; a writer's hidden temporary files stay behind). ``remove``:
    files deleted in the same step, with signals held as for the moves (what an earlier run left that
    this one does not replace); the block may still add to the list, and a file already gone is skipped.
    """
    stage = Path(dest) / f".staging-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        yield stage
        names = sorted(f.name for f in stage.iterdir() if not f.name.startswith(".")) if only is None else only
        with _signals_held():
            for name in names:
                if (stage / name).exists():
                    _move(stage / name, Path(dest) / name)
            for gone in remove or ():
                Path(gone).unlink(missing_ok=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
