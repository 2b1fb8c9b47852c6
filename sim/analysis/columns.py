"""Arrow table columns as NumPy arrays, without pyarrow's pandas bridge.

``ChunkedArray.to_numpy()`` goes through pyarrow's pandas conversion, which imports pandas
(0.2 s of CPU here) the first time it runs, even for a plain float column. A plan reads a few
numeric columns of every run in every worker process, so it paid that import once per worker.
Numeric columns without nulls are views of their Arrow buffers; anything else (strings,
booleans, nulls) still goes through pyarrow.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_NUMERIC = {
    pa.float64(): np.float64,
    pa.float32(): np.float32,
    pa.int64(): np.int64,
    pa.int32(): np.int32,
    pa.int16(): np.int16,
    pa.int8(): np.int8,
    pa.uint64(): np.uint64,
    pa.uint32(): np.uint32,
    pa.uint16(): np.uint16,
    pa.uint8(): np.uint8,
}


def column(table: pa.Table, name: str) -> np.ndarray:
    """Column ``name`` of ``table`` as a read-only NumPy array (the values ``to_numpy()`` gives)."""
    col = table.column(name)
    dtype = _NUMERIC.get(col.type)
    if dtype is None or col.null_count:
        return col.to_numpy()
    size = np.dtype(dtype).itemsize
    parts = [
        np.frombuffer(c.buffers()[1], dtype=dtype, count=len(c), offset=c.offset * size) for c in col.chunks if len(c)
    ]
    if not parts:
        return np.empty(0, dtype=dtype)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
