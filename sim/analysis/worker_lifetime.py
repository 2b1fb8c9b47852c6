"""Worker processes of sweeps and plans die with the process that started them.

A ``kill -9`` of ``kvsim sweep`` runs no cleanup, and a pool's workers (children of the
``forkserver`` process, not of the command) would run their points to the end and then linger.
:func:`init_worker`, the pool's initializer, ties each worker to the command's PID two ways:

* on Linux, ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (through ``ctypes``): the kernel kills the worker
  when its parent, the forkserver, exits, which it does as soon as the command is gone;
* a daemon thread waits on a ``pidfd`` of the command (Linux ≥ 5.3; elsewhere it polls the PID
  every half second) and ends the worker with ``os._exit`` the moment the command exits.

Workers also ignore SIGINT: Ctrl-C reaches the whole process group, and the command, not each
worker, decides what an interruption means (stop queued points, keep finished ones). A
:class:`WorkerPool` left by an exception (Ctrl-C, SIGTERM) kills its workers instead of waiting
for their points, which could take minutes, to finish.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is gone for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def _watch(pid: int) -> None:
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            os._exit(1)
        except OSError:
            pidfd = None
    if pidfd is not None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while not poller.poll(None):  # readable once the process has exited
            pass
        os._exit(1)
    while _alive(pid):
        time.sleep(0.5)
    os._exit(1)


def init_worker(parent_pid: int) -> None:
    """Pool initializer: ignore SIGINT and end this worker when ``parent_pid`` exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    if not _alive(parent_pid):
        os._exit(1)
    threading.Thread(target=_watch, args=(parent_pid,), name="kvsim-parent-watch", daemon=True).start()


class WorkerPool(ProcessPoolExecutor):
    """A process pool whose workers are killed, not awaited, when it is left by an exception."""

    def stop(self) -> None:
        """Cancel queued tasks and kill the workers now (finished results are already delivered)."""
        procs = list((getattr(self, "_processes", None) or {}).values())
        manager = getattr(self, "_executor_manager_thread", None)
        self.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            try:
                p.kill()
            except (OSError, ValueError, AttributeError):
                pass
        for p in procs:
            try:
                p.join(timeout=5)
            except (OSError, ValueError, AttributeError, AssertionError):
                pass
        # The pool's manager thread closes its wake-up pipe as it ends; the interpreter's exit hook
        # (concurrent.futures.process._python_exit) writes to that pipe without a lock, and if the
        # two meet it prints "Exception ignored in: <module 'threading'>" after the command's one
        # line. With the workers dead the thread ends at once: wait for it here.
        if manager is not None and manager is not threading.current_thread():
            manager.join(timeout=5)

    def __exit__(self, exc_type, exc_val, exc_tb):
        if exc_type is not None:
            self.stop()
            return False
        return super().__exit__(exc_type, exc_val, exc_tb)
