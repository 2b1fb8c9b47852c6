"""Run outputs: Arrow columns built from buffers equal pyarrow's own conversion, and a run
never imports pandas (pyarrow's conversions and ``to_numpy`` would, costing 0.2–0.4 s)."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest
from hypothesis import given, strategies as st

from sim.output.metrics import REQUEST_SCHEMA, TIMESERIES_SCHEMA, arrow_column

TYPES = sorted({f.type for f in (*REQUEST_SCHEMA, *TIMESERIES_SCHEMA)}, key=str)


def _values(typ):
    if typ == pa.string():
        return st.text(max_size=12)
    if typ == pa.bool_():
        return st.booleans()
    if typ == pa.float64():
        return st.floats(allow_nan=False)
    bits = 31 if typ == pa.int32() else 63
    return st.integers(-(2**bits), 2**bits - 1)


@pytest.mark.parametrize("typ", TYPES, ids=str)
def test_arrow_column_equals_pa_array(typ):
    @given(st.lists(_values(typ), max_size=40).map(tuple))
    def check(values):
        got = arrow_column(values, typ)
        assert got.type == typ and got.equals(pa.array(values, type=typ))

    check()


def test_arrow_column_falls_back_for_nulls():
    assert arrow_column((1, None, 3), pa.int64()).to_pylist() == [1, None, 3]
    assert arrow_column(("a", None), pa.string()).to_pylist() == ["a", None]


def test_a_run_does_not_import_pandas(tmp_path):
    code = (
        "import sys\n"
        "from sim.config import load_scenario\n"
        "from sim.engine.cluster import simulate\n"
        "sc = load_scenario('scenarios/bench-1m.yaml', {'workload.num_requests': 300})\n"
        f"simulate(sc, out_dir={str(tmp_path)!r})\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=__file__.rsplit("/tests/", 1)[0]
    )
    assert out.stdout.strip().splitlines()[-1] == "False"
