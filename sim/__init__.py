"""kvsim: a capacity simulator for LLM serving whose subject is the KV cache."""

import logging as _logging

from sim import native as _native

__version__ = "0.1.0"

# Library calls (tests, sweeps, the app) stay quiet; ``kvsim run`` attaches a stderr handler.
_logging.getLogger("kvsim").addHandler(_logging.NullHandler())

#: ``compiled`` when the hot path runs from an up-to-date mypyc build (``sim/native.py``).
NATIVE_STATE = _native.guard()
