"""Background runs started before anyone presses Run (the page's "prewarm"), through one bounded
queue for the whole server.

Until a session first presses Run, the Explore page runs the scenario on screen in the background
so that its charts come back at once. Each rerun with a new knob value asks again; without a bound
a client could start a simulation (up to a minute of CPU) per keystroke. :class:`PrewarmQueue`
runs at most ``max_running`` of them at once for every session together; a session has at most
one waiting: its newer request replaces the older one that has not started (dropped, never run),
and the number of sessions waiting is bounded too (the oldest waiting request is dropped). A key
that ran, or is running, is not run again while it is remembered (the page's run cache holds the
result). Testable without Streamlit.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

#: Background runs at once, server-wide.
MAX_RUNNING = 1
#: Sessions with a request waiting, server-wide (the oldest waiting request is dropped past it).
MAX_WAITING = 16
#: Keys remembered as run (or running), so that they are not run twice.
MAX_REMEMBERED = 256
#: Name of the worker threads.
THREAD_NAME = "kvsim-prewarm"


def prewarm_enabled() -> bool:
    """``KVSIM_APP_PREWARM=0`` turns the page's background runs off."""
    return os.environ.get("KVSIM_APP_PREWARM", "1") != "0"


class PrewarmQueue:
    """Run ``fn()`` for the latest request of each session, at most ``max_running`` at once."""

    def __init__(self, max_running: int = MAX_RUNNING, max_waiting: int = MAX_WAITING):
        if max_running < 1 or max_waiting < 1:
            raise ValueError("max_running and max_waiting must be at least 1")
        self.max_running = max_running
        self.max_waiting = max_waiting
        self._lock = threading.Lock()
        #: session → (key, fn), oldest first: at most one waiting request per session.
        self._waiting: OrderedDict[Hashable, tuple[str, Callable[[], object]]] = OrderedDict()
        self._seen: OrderedDict[str, None] = OrderedDict()  # keys run or running
        self._running = 0
        #: Requests dropped without running (superseded, or past ``max_waiting``).
        self.dropped = 0

    def submit(self, session: Hashable, key: str, fn: Callable[[], object]) -> bool:
        """Queue ``fn`` (the run of ``key``) for ``session``, replacing its request that has not
        started. False when ``key`` already ran or is running (nothing queued)."""
        with self._lock:
            if key in self._seen:
                return False
            old = self._waiting.pop(session, None)
            if old is not None:
                self.dropped += 1
            while len(self._waiting) >= self.max_waiting:
                self._waiting.popitem(last=False)
                self.dropped += 1
            self._waiting[session] = (key, fn)
            start = self._running < self.max_running
            if start:
                self._running += 1
        if start:
            threading.Thread(target=self._work, name=THREAD_NAME, daemon=True).start()
        return True

    def cancel(self, session: Hashable) -> None:
        """Drop ``session``'s waiting request (it pressed Run: its own run comes first)."""
        with self._lock:
            if self._waiting.pop(session, None) is not None:
                self.dropped += 1

    def forget(self, key: str) -> None:
        """Let ``key`` be run again (its run failed, or its result left the cache)."""
        with self._lock:
            self._seen.pop(key, None)

    @property
    def running(self) -> int:
        with self._lock:
            return self._running

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def _next(self) -> tuple[str, Callable[[], object]] | None:
        with self._lock:
            while self._waiting:
                _, (key, fn) = self._waiting.popitem(last=False)
                if key in self._seen:
                    continue
                self._seen[key] = None
                while len(self._seen) > MAX_REMEMBERED:
                    self._seen.popitem(last=False)
                return key, fn
            self._running -= 1
            return None

    def _work(self) -> None:
        while (job := self._next()) is not None:
            key, fn = job
            try:
                fn()
            except Exception:  # noqa: BLE001 - the real run reports errors
                self.forget(key)
            except BaseException:
                with self._lock:  # this worker ends here: its slot is free again
                    self._running -= 1
                raise
