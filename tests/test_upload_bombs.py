"""Hostile uploads and input files that are small on disk and huge once read (security review).

* A dictionary-encoded string column stores its value once and an index per row: the Parquet
  metadata's sizes are the stored sizes, and a plain read writes the value into every row. A
  sweep upload is read with its strings as dictionaries and refused as soon as its decoded size
  passes the cap; a trace's columns must be numeric, decided from the schema before any data.
* A trace upload has its own row cap and its validation read stays out of the process-wide cache.
* An upload session's folder: a replaced upload is deleted, and its uploads have a byte quota.
* Deeply nested JSON in a terms file, a benchmark result and other JSON inputs: one line, exit 2.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sim.errors import ConfigError
from sim.explorer import uploads as U
from sim.workload import traces as T

ROOT = Path(__file__).resolve().parent.parent


def _dict_column(rows: int, value_bytes: int) -> pa.DictionaryArray:
    """One ``value_bytes`` string stored once, referenced by every one of ``rows`` rows."""
    return pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["9" * value_bytes]))


def _parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, store_schema=False, compression="zstd", dictionary_pagesize_limit=2**30)
    return buf.getvalue()


def sweep_bomb(rows: int, value_bytes: int = 100_000) -> bytes:
    return _parquet(pa.table({"x": pa.array(range(rows), pa.int64()), "label": _dict_column(rows, value_bytes)}))


def trace_bomb(rows: int, value_bytes: int = 100_000) -> bytes:
    return _parquet(
        pa.table(
            {
                "arrival_s": pa.array([0.0] * rows),
                "prompt_tokens": _dict_column(rows, value_bytes),
                "output_tokens": pa.array([1] * rows),
            }
        )
    )


def _in_fresh_process(code: str) -> dict:
    """Run ``code`` in a new interpreter (Arrow's peak allocation is per process) and return the
    JSON object it prints last."""
    env = {**os.environ, "KVSIM_NATIVE": "0", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# --- 1. Parquet dictionary bombs -------------------------------------------------------------------


def test_sweep_bomb_metadata_is_small_but_decoded_is_over_the_cap():
    """The premise: the metadata check alone passes this file (what the old reader relied on)."""
    data = sweep_bomb(3000)
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    stored = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    assert len(data) < 20_000 and stored < U.MAX_DATASET_BYTES // 100
    assert 3000 * 100_000 > U.MAX_DATASET_BYTES


def test_sweep_bomb_is_refused_while_reading(monkeypatch):
    monkeypatch.setattr(U, "MAX_DATASET_BYTES", 1 << 20)
    batches = []
    real = pq.ParquetFile.iter_batches

    def counting(self, *a, **k):
        for b in real(self, *a, **k):
            batches.append(b.num_rows)
            yield b

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counting)
    with pytest.raises(ConfigError) as e:
        U.read_sweep_upload("bomb.parquet", sweep_bomb(3000))
    msg = str(e.value)
    assert "\n" not in msg and "bomb.parquet" in msg and "once decoded" in msg and "1 MiB" in msg
    assert len(batches) == 1  # stopped at the first batch past the cap: the other rows were never read


def test_sweep_bomb_is_refused_without_materialising_it():
    """At the real cap, in a fresh process: Arrow's peak allocation stays far below the 300 MB the
    file decodes to (the old reader allocated all of it and accepted the file)."""
    out = _in_fresh_process(
        """
        import json, pyarrow as pa
        from tests.test_upload_bombs import sweep_bomb
        from sim.explorer.uploads import read_sweep_upload
        try:
            read_sweep_upload("bomb.parquet", sweep_bomb(3000))
            res = "accepted"
        except Exception as exc:
            res = str(exc)
        print(json.dumps({"res": res, "peak": pa.default_memory_pool().max_memory()}))
        """
    )
    assert "once decoded" in out["res"], out
    assert out["peak"] < 32 * 2**20, out


def test_sweep_strings_still_read_as_strings():
    """Strings read as dictionaries (to measure them) are decoded again once the table fits."""
    t = pa.table({"x": [1, 2, 3], "allocator.kind": ["paged", "static", "paged"], "flag": [True, False, True]})
    got = U.read_sweep_upload("s.parquet", _parquet(t))
    assert got.schema == t.schema and got.equals(t)
    as_dict = pa.table({"x": [1, 2], "k": pa.array(["a", "b"]).dictionary_encode()})
    buf = io.BytesIO()
    pq.write_table(as_dict, buf)  # the stored Arrow schema keeps the dictionary type: kept as it was
    assert U.read_sweep_upload("d.parquet", buf.getvalue()).column("k").to_pylist() == ["a", "b"]


def test_sweep_nested_column_is_refused():
    t = pa.table({"x": [1, 2], "l": pa.array([["a"] * 3, ["a"]])})
    with pytest.raises(ConfigError, match=r"column 'l' of type list<.*a flat table"):
        U.read_sweep_upload("n.parquet", _parquet(t))


def test_trace_bomb_is_refused_from_the_schema(tmp_path):
    """An upload and a trace read by kvsim run alike: one line naming file, column, type and
    what is allowed (the old reader decoded the strings and failed on 'row 0 is inf')."""
    data = trace_bomb(300)
    store = U.UploadStore()
    try:
        with pytest.raises(ConfigError) as e:
            store.add_trace("bomb.parquet", data)
        msg = str(e.value)
        assert msg.startswith("trace bomb.parquet: got 'bomb.parquet';"), msg
        assert "column 'prompt_tokens' is string (Parquet BYTE_ARRAY)" in msg
        assert "an integer or floating-point column" in msg and "\n" not in msg
        assert not list(store.dir.rglob("*.parquet"))  # the refused file is not kept
    finally:
        store.close()
    p = tmp_path / "bomb.parquet"
    p.write_bytes(data)
    with pytest.raises(ConfigError, match=r"column 'prompt_tokens' is string") as e:
        T.read_trace(p)
    assert e.value.value == str(p)


def test_trace_bomb_is_refused_without_reading_data():
    out = _in_fresh_process(
        """
        import json, pyarrow as pa
        from tests.test_upload_bombs import trace_bomb
        from sim.explorer.uploads import UploadStore
        s = UploadStore()
        try:
            s.add_trace("bomb.parquet", trace_bomb(3000))
            res = "accepted"
        except Exception as exc:
            res = str(exc)
        s.close()
        print(json.dumps({"res": res, "peak": pa.default_memory_pool().max_memory()}))
        """
    )
    assert "column 'prompt_tokens' is string" in out["res"], out
    assert out["peak"] < 8 * 2**20, out


@pytest.mark.parametrize(
    "column,arrow_type",
    [("output_tokens", pa.binary()), ("output_tokens", pa.list_(pa.int64())), ("arrival_s", pa.string())],
)
def test_trace_columns_must_be_numeric(tmp_path, column, arrow_type):
    cols = {"arrival_s": pa.array([0.0, 1.0]), "prompt_tokens": pa.array([5, 6]), "output_tokens": pa.array([1, 2])}
    values = {pa.binary(): [b"1", b"2"], pa.string(): ["0", "1"], pa.list_(pa.int64()): [[1], [2]]}[arrow_type]
    cols[column] = pa.array(values, arrow_type)
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table(cols), p)
    with pytest.raises(ConfigError, match=rf"column '{column}' is {str(arrow_type).split('<')[0]}"):
        T.read_trace(p)


def test_numeric_and_timestamp_traces_still_read(tmp_path):
    p = tmp_path / "t.parquet"
    t = pa.table(
        {
            "arrival_s": pa.array([0, 2_000_000_000], pa.timestamp("ns")),
            "prompt_tokens": pa.array([5, 6], pa.int32()),
            "output_tokens": pa.array([1.0, 2.0]),
            "note": pa.array(["x" * 10, "y"]),  # a column kvsim does not read may be anything
        }
    )
    pq.write_table(t, p)
    tr = T.read_trace(p)
    assert tr.arrival_s.tolist() == [0.0, 2.0] and tr.prompt_tokens.tolist() == [5, 6]


# --- 2. trace uploads: row cap, not cached ------------------------------------------------------------


def _rows_parquet(rows: int) -> bytes:
    buf = io.BytesIO()
    t = pa.table(
        {"arrival_s": pa.array([0.0] * rows), "prompt_tokens": pa.array([1] * rows), "output_tokens": [1] * rows}
    )
    pq.write_table(t, buf)
    return buf.getvalue()


def test_trace_upload_row_cap(tmp_path):
    data = _rows_parquet(U.MAX_UPLOAD_TRACE_ROWS + 1)
    assert len(data) < U.MAX_UPLOAD_BYTES
    store = U.UploadStore()
    try:
        with pytest.raises(ConfigError) as e:
            store.add_trace("big.parquet", data)
        msg = str(e.value)
        assert "a trace upload of at most 1,000,000 rows" in msg and "1000001" in msg and "\n" not in msg
        assert "big.parquet" not in store.traces and not list(store.dir.rglob("*.parquet"))
        # CSV is refused while streaming (a length-only CSV fits 1M rows in an upload).
        csv = b"num_prefill_tokens,num_decode_tokens\n" + b"1,1\n" * (U.MAX_UPLOAD_TRACE_ROWS + 1)
        assert len(csv) < U.MAX_UPLOAD_BYTES
        with pytest.raises(ConfigError, match="a trace upload of at most 1,000,000 rows"):
            store.add_trace("big.csv", csv)
    finally:
        store.close()
    # kvsim run reads the same file: the upload cap is the page's, not the reader's.
    p = tmp_path / "big.parquet"
    p.write_bytes(data)
    assert len(T.read_trace(p, cache=False)) == U.MAX_UPLOAD_TRACE_ROWS + 1


def test_upload_validation_does_not_fill_the_trace_cache():
    T.read_trace_cached.cache_clear()  # other tests in this process may have filled it to its bound
    before = T.read_trace_cached.cache_info().currsize
    store = U.UploadStore()
    try:
        for i in range(3):
            store.add_trace(f"t{i}.parquet", _rows_parquet(1000 + i))
        assert T.read_trace_cached.cache_info().currsize == before
        # A run reads it through the cache as before.
        T.read_trace(store.traces["t0.parquet"].path)
        assert T.read_trace_cached.cache_info().currsize == before + 1
    finally:
        T.read_trace_cached.cache_clear()
        store.close()


# --- 3. the session's upload folder ---------------------------------------------------------------------


def _csv(n: int) -> bytes:
    return ("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{i},{10 + i},5\n" for i in range(n))).encode()


def _files(store: U.UploadStore) -> list[Path]:
    return sorted(p for p in store.dir.rglob("*") if p.is_file())


def test_replaced_upload_is_deleted():
    store = U.UploadStore()
    try:
        for n in range(1, 30):
            store.add_trace("t.csv", _csv(n))
        assert _files(store) == [store.traces["t.csv"].path]
        assert len(list((store.dir / "traces").iterdir())) == 1  # the old content-hash folders are gone
        # Same content under another name shares the folder; replacing one keeps the other.
        store.add_trace("u.csv", _csv(29))
        store.add_trace("t.csv", _csv(3))
        assert _files(store) == sorted([store.traces["t.csv"].path, store.traces["u.csv"].path])
        # A refused upload deletes only its own file, not a kept one beside it (same content).
        with pytest.raises(ConfigError):
            store.add_trace("v.csv", _csv(29), fmt="azure")
        with pytest.raises(ConfigError):
            store.add_trace("u.csv", _csv(29), fmt="azure")  # the very file kept under u.csv
        assert store.traces["u.csv"].path.is_file()
        assert _files(store) == sorted([store.traces["t.csv"].path, store.traces["u.csv"].path])
        # Profiles alike.
        from sim.cost.profile import PROFILE_DIR

        doc = sorted(PROFILE_DIR.glob("*.json"))[0].read_bytes()
        key = store.add_profile("mine.json", doc)
        first = store.profiles[key]
        store.add_profile("mine.json", doc.replace(b"{", b"{ ", 1))
        assert not first.exists() and store.profiles[key].is_file()
    finally:
        store.close()


def test_session_upload_quota(monkeypatch):
    monkeypatch.setattr(U, "MAX_SESSION_UPLOAD_BYTES", 4000)
    store = U.UploadStore()
    try:
        data = _csv(150)
        assert 1000 < len(data) < 2000
        store.add_trace("a.csv", data)
        store.add_trace("b.csv", _csv(151))
        with pytest.raises(ConfigError) as e:
            store.add_trace("c.csv", _csv(152))
        msg = str(e.value)
        assert "at most 3.91 KiB of uploaded files per session" in msg and "c.csv" in msg and "\n" not in msg
        assert "c.csv" not in store.traces
        assert not list((store.dir / "traces").glob("*/c.csv"))
        # Replacing a file frees its bytes: allowed at the cap.
        store.add_trace("a.csv", _csv(152))
        assert store.stored_bytes() <= 4000
    finally:
        store.close()


# --- 4. deeply nested JSON ----------------------------------------------------------------------------------


@pytest.fixture
def deep(tmp_path) -> Path:
    p = tmp_path / "deep.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    return p


def test_deep_terms_file_and_bench_result_are_one_line(deep):
    from sim.analysis.bench_results import read_bench_result
    from sim.engine_presets import read_terms_file

    with pytest.raises(ConfigError, match="nesting of at most 64 levels") as e:
        read_terms_file(deep)
    assert e.value.key == "engine.terms_file" and e.value.value == str(deep)
    with pytest.raises(ConfigError, match="nesting of at most 64 levels") as e:
        read_bench_result(deep)
    assert e.value.key == str(deep)


@pytest.mark.parametrize("args", [["run", "chat-api", "--set", "engine.terms_file={p}"], ["compare", "{p}"]])
def test_deep_json_cli_is_one_line_exit_2(deep, tmp_path, args):
    env = {**os.environ, "KVSIM_NATIVE": "0", "PYTHONPATH": str(ROOT)}  # this tree's sim, from any folder
    cmd = [sys.executable, "-m", "sim.cli", *(a.format(p=deep) for a in args)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2, r.stderr[-1000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(deep) in lines[0] and "nesting of at most 64 levels" in lines[0], r.stderr[-1000:]


def test_deep_json_in_other_input_files(deep, tmp_path):
    from calibration.serving_bench import read_vllm_result
    from calibration.validate.several_runs import load_run
    from sim.analysis.report import report_run

    with pytest.raises(ConfigError, match="nesting of at most 64 levels"):
        read_vllm_result(deep)
    run = tmp_path / "run"
    run.mkdir()
    (run / "validation.json").write_text(deep.read_text())
    with pytest.raises(ConfigError, match="nesting of at most 64 levels"):
        load_run(run)
    (run / "summary.json").write_text(deep.read_text())
    with pytest.raises(ConfigError, match="nesting of at most 64 levels"):
        report_run(run)


def test_json_depth_in_pieces_matches_one_pass(monkeypatch):
    import random

    from sim import inputs

    rng = random.Random(0)
    texts = ["".join(rng.choice('[]{}"\\ab') for _ in range(rng.randint(0, 60))) for _ in range(2000)]
    whole = [inputs.json_depth(t) for t in texts]
    for chunk in (1, 2, 3, 7):
        monkeypatch.setattr(inputs, "DEPTH_CHUNK_BYTES", chunk)
        assert [inputs.json_depth(t) for t in texts] == whole
