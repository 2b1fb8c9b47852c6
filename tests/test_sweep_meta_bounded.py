"""read_dataset reads the sweep folder's metadata file (``_sweep.json``) through the bounded
readers (sim/inputs.py): a damaged or hostile file is one ConfigError line, not a traceback."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sim.analysis.sweep import META_FILE, read_dataset
from sim.errors import ConfigError


def _folder(tmp_path, meta: str):
    table = pa.table({"point_id": ["a", "b"], "status": ["ok", "ok"], "error": pa.array([None, None], pa.string())})
    pq.write_table(table.append_column("point", pa.array([0, 1])), tmp_path / "part-a.parquet")
    (tmp_path / META_FILE).write_text(meta)
    return tmp_path


def test_the_metadata_file_narrows_the_dataset(tmp_path):
    out = _folder(tmp_path, '{"point_ids": ["b"]}')
    assert read_dataset(out).column("point_id").to_pylist() == ["b"]
    assert read_dataset(out, all_points=True).num_rows == 2


def test_a_deeply_nested_metadata_file_is_one_line(tmp_path):
    out = _folder(tmp_path, "[" * 200_000)
    with pytest.raises(ConfigError) as exc:
        read_dataset(out)
    msg = str(exc.value)
    assert "\n" not in msg and META_FILE in msg and "nest" in msg


@pytest.mark.parametrize(
    ("meta", "said"),
    [
        ('{"point_ids": [', "valid JSON"),
        ("[1, 2]", "point_ids"),
        ('{"point_ids": {"a": 1}}', "point_ids"),
        ('{"point_ids": [["a"]]}', "point_ids"),
    ],
)
def test_a_damaged_metadata_file_is_one_line(tmp_path, meta, said):
    out = _folder(tmp_path, meta)
    with pytest.raises(ConfigError) as exc:
        read_dataset(out)
    assert "\n" not in str(exc.value) and said in str(exc.value)


def test_a_binary_metadata_file_is_one_line(tmp_path):
    out = _folder(tmp_path, "")
    (out / META_FILE).write_bytes(b'{"point_ids": ["\xff"]}')
    with pytest.raises(ConfigError, match="UTF-8"):
        read_dataset(out)
