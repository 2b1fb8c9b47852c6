"""Sweeps rerun into the same folder after the sweep file changed, and what an axis's values may be:
the dataset holds exactly the current file's points (reused rows rewritten, others dropped), its
columns keep one type, an integer past int64 fails only its point, numbers YAML reads as text are
numbers, and a value given twice is refused."""

import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sim.analysis.sweep import DROPPED_DIR, load_sweep, read_dataset, run_sweep
from sim.errors import ConfigError

HEAD = "base: chat-api\nset: {workload.num_requests: 12}\n"


def write(tmp_path, body, name="sweep.yaml"):
    p = tmp_path / name
    p.write_text(HEAD + textwrap.dedent(body))
    return p


def sweep(f, out):
    return run_sweep(f, workers=1, out=out, progress=False)


def sweep_cli(f, out):
    return subprocess.run(
        [sys.executable, "-m", "sim.cli.sweep", str(f), "-w", "1", "--out", str(out), "-q"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def rows(out):
    """The dataset's rows without the wall-clock column (the one non-deterministic column)."""
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in read_dataset(out).to_pylist()]


def test_an_edited_sweep_file_rewrites_reused_rows_and_drops_the_others(tmp_path):
    out = tmp_path / "ds"
    first = write(tmp_path, "grid:\n  workload.arrival.rate: [4, 8]\n", "first.yaml")
    # chat-api runs 256 sequences: (4, 256) and (8, 256) are the first file's two points.
    second = write(
        tmp_path,
        "grid:\n  workload.arrival.rate: [2, 4, 8]\n  scheduler.max_num_seqs: [256, 16]\n",
        "second.yaml",
    )
    assert sweep(first, out).ran == 2

    res = sweep(second, out)
    # The same dataset a fresh sweep of the second file writes: every row has the new axis,
    # points are numbered 0..5 once, the reused rows' metrics are those a rerun gives.
    table = read_dataset(out)
    assert table.column("point").to_pylist() == list(range(6))
    assert None not in table.column("scheduler.max_num_seqs").to_pylist()
    assert sweep(second, tmp_path / "fresh").ran == 6
    assert rows(out) == rows(tmp_path / "fresh")
    assert read_dataset(out).schema == read_dataset(tmp_path / "fresh").schema
    assert (res.total, res.skipped, res.ran, res.relabelled, res.dropped) == (6, 2, 4, 2, 0)

    again = sweep(second, out)  # nothing changed: nothing rewritten
    assert (again.skipped, again.ran, again.relabelled, again.dropped) == (6, 0, 0, 0)

    # Back to the first file: its two points are kept (renumbered, without the second axis), the
    # other four leave the dataset and wait in _dropped/ ...
    back = sweep(first, out)
    assert "scheduler.max_num_seqs" not in read_dataset(out).column_names
    assert [(r["point"], r["workload.arrival.rate"]) for r in rows(out)] == [(0, 4.0), (1, 8.0)]
    assert (back.skipped, back.ran, back.dropped, back.kept_apart) == (2, 0, 4, 4)
    assert len(list(out.glob("part-*.parquet"))) == 2
    assert len(list((out / DROPPED_DIR).glob("part-*.parquet"))) == 4
    assert read_dataset(out, all_points=True).num_rows == 6
    # ... from where the second file takes them back without running anything.
    restored = sweep(second, out)
    assert (restored.skipped, restored.ran, restored.dropped) == (6, 0, 0)
    assert rows(out) == rows(tmp_path / "fresh")
    assert not list((out / DROPPED_DIR).glob("part-*.parquet"))


def test_relabelled_mapping_axis_and_the_counts_on_stderr(tmp_path):
    out = tmp_path / "ds"
    first = write(tmp_path, "grid:\n  workload.arrival.rate: {r4: 4, r8: 8}\n", "first.yaml")
    second = write(tmp_path, "grid:\n  workload.arrival.rate: {two: 2, four: 4, eight: 8}\n", "second.yaml")
    assert sweep(first, out).ok
    r = sweep_cli(second, out)
    assert r.returncode == 0, r.stderr
    got = [(row["point"], row["workload.arrival.rate"]) for row in rows(out)]
    assert got == [(0, "two"), (1, "four"), (2, "eight")]
    assert f"{out}: reused 2 finished point(s) of 3 (2 rewritten" in r.stderr, r.stderr
    assert "dropped 0 point(s)" in r.stderr, r.stderr

    third = write(tmp_path, "grid:\n  workload.arrival.rate: {four: 4}\n", "third.yaml")
    r = sweep_cli(third, out)
    assert r.returncode == 0, r.stderr
    assert "reused 1 finished point(s) of 1" in r.stderr, r.stderr
    assert (
        f"dropped 2 point(s) no longer in the sweep file or whose named files changed (2 finished, kept in {out / DROPPED_DIR}/)"
        in r.stderr
    )
    assert [row["workload.arrival.rate"] for row in rows(out)] == ["four"]


def test_an_axis_that_changes_type_leaves_a_readable_dataset(tmp_path):
    out = tmp_path / "ds"
    assert sweep(write(tmp_path, "grid:\n  workload.arrival.rate: [4, 8]\n", "a.yaml"), out).ok
    assert sweep(write(tmp_path, "grid:\n  workload.arrival.rate: {slow: 4, fast: 9}\n", "b.yaml"), out).ok
    table = read_dataset(out)
    assert table.schema.field("workload.arrival.rate").type == pa.string()
    assert table.column("workload.arrival.rate").to_pylist() == ["slow", "fast"]
    assert read_dataset(out, all_points=True).num_rows == 3  # with the dropped rate-8 point
    pytest.importorskip("plotly")
    from sim.analysis.report import report_sweep

    assert report_sweep(out).is_file()


def test_read_dataset_unifies_a_column_with_two_types(tmp_path):
    """A folder left half-rewritten (killed while reconciling, or written by an older kvsim): the
    axis column is a number in one file and a label in the other; the dataset stays readable."""
    base = {"point_id": ["a"], "status": ["ok"], "error": pa.array([None], pa.string())}
    pq.write_table(pa.table({**base, "point": [0], "x": pa.array([4], pa.int64())}), tmp_path / "part-a.parquet")
    base["point_id"] = ["b"]
    pq.write_table(pa.table({**base, "point": [1], "x": pa.array(["fast"])}), tmp_path / "part-b.parquet")
    table = read_dataset(tmp_path)
    assert table.schema.field("x").type == pa.string()
    assert table.column("x").to_pylist() == ["4", "fast"]


def test_an_integer_past_int64_fails_its_point_only(tmp_path):
    f = write(
        tmp_path,
        """
        zip:
          allocator.block_size: [16, 99999999999999999999, 16]
          seed: [0, 0, 99999999999999999999]
        """,
    )
    out = tmp_path / "ds"
    res = sweep(f, out)
    assert (res.total, res.ran, res.invalid, len(res.failures)) == (3, 1, 2, 2)
    got = {r["point"]: r for r in rows(out)}
    assert got[0]["status"] == "ok" and got[0]["allocator.block_size"] == 16 and got[0]["seed"] == 0
    assert got[1]["status"] == "failed" and got[1]["allocator.block_size"] is None
    assert got[1]["error"] == "ConfigError: allocator.block_size: got 99999999999999999999; an integer in [1, 4096]"
    assert got[2]["status"] == "failed" and got[2]["seed"] is None
    assert got[2]["error"] == "ConfigError: seed: got 99999999999999999999; an integer in [0, 9223372036854775807]"


def test_numbers_yaml_reads_as_text_are_numbers_in_the_dataset(tmp_path):
    # PyYAML reads 1.0e2 as the string '1.0e2'; the rate field makes it 100.0, and so the column.
    out = tmp_path / "ds"
    res = sweep(write(tmp_path, 'grid:\n  workload.arrival.rate: [2, "8", 1.0e2]\n'), out)
    assert res.ok and res.ran == 3
    table = read_dataset(out)
    assert table.schema.field("workload.arrival.rate").type == pa.float64()
    assert table.column("workload.arrival.rate").to_pylist() == [2.0, 8.0, 100.0]
    # An integer field gives an integer column whatever the spelling.
    pts = load_sweep(write(tmp_path, 'grid:\n  scheduler.max_num_seqs: [16, "32", 64.0]\n', "n.yaml")).points()
    assert [p.params["scheduler.max_num_seqs"] for p in pts] == [16, 32, 64]
    assert all(type(p.params["scheduler.max_num_seqs"]) is int for p in pts)


DUPLICATES = [
    (
        "grid:\n  workload.arrival.rate: [4, 4.0, 4]\n",
        "grid workload.arrival.rate: got [4, 4.0, 4]; distinct values; 4, 4.0, 4 are one value (list it once)",
    ),
    (
        "grid:\n  workload.arrival.rate: {a: 4, b: 4.0}\n",
        "grid workload.arrival.rate: got {'a': 4, 'b': 4.0}; distinct values; labels a and b both give 4.0",
    ),
    (
        "zip:\n  workload.arrival.rate: [4, 4, 4]\n  scheduler.max_num_seqs: [64, 128, 64]\n",
        "zip workload.arrival.rate, scheduler.max_num_seqs: got [[4, 64], [4, 128], [4, 64]]; distinct value "
        "tuples; tuples 1 and 3 are both (4, 64)",
    ),
    (
        'grid:\n  workload.arrival.rate: [8, "8"]\n',
        "sweep axis workload.arrival.rate: got [8, '8']; values that give distinct scenarios; 8 and '8' both "
        "run as 8.0",
    ),
    (
        'zip:\n  workload.arrival.rate: [4, 4]\n  scheduler.max_num_seqs: [16, "16"]\n',
        "sweep axis scheduler.max_num_seqs: got [16, '16']; values that give distinct scenarios; 16 and '16' "
        "both run as 16",
    ),
    (
        "grid:\n  gpu.name: [H100, h100_sxm]\n",
        "sweep axis gpu.name: got ['H100', 'h100_sxm']; values that give distinct scenarios; 'H100' and "
        "'h100_sxm' both run as 'H100-SXM-80GB'",
    ),
]


@pytest.mark.parametrize("body,message", DUPLICATES)
def test_a_value_given_twice_is_refused_before_any_point(tmp_path, body, message):
    out = tmp_path / "ds"
    with pytest.raises(ConfigError) as info:
        run_sweep(write(tmp_path, body), out=out, progress=False)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)
    assert not out.exists()


def test_zip_pairs_may_repeat_a_value_of_one_axis(tmp_path):
    f = write(tmp_path, "zip:\n  workload.arrival.rate: [4, 4]\n  scheduler.max_num_seqs: [64, 128]\n")
    assert len(load_sweep(f).points()) == 2


def test_a_point_whose_named_file_changed_runs_again_and_one_reading_shipped_files_keeps_its_id(tmp_path):
    from sim.analysis.sweep import point_id
    from sim.config import load_scenario

    # The trace is the user's: what it holds is part of the point, not only its path.
    (tmp_path / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,500,20\n1,500,20\n2,500,20\n")
    f = tmp_path / "sweep.yaml"
    f.write_text(
        "base: chat-api\n"
        f"set: {{workload.num_requests: 3, workload.arrival: {{kind: trace, path: {tmp_path / 'trace.csv'}}}}}\n"
        "grid:\n  scheduler.max_num_seqs: [8, 16]\n"
    )
    out = tmp_path / "ds"
    assert sweep(f, out).ran == 2
    assert sweep(f, out).ran == 0  # unchanged: reused
    before = rows(out)
    (tmp_path / "trace.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,500,20\n0,500,20\n0,500,20\n")
    res = sweep(f, out)
    assert res.ran == 2 and res.dropped == 2
    after = rows(out)
    assert [r["ttft_s.mean"] for r in after] != [r["ttft_s.mean"] for r in before]
    assert after == rows(out) and len(after) == 2
    # A scenario naming only shipped files hashes as it did: ids of older datasets stay valid.
    sc = load_scenario("chat-api")
    from sim.analysis.sweep import canonical_scenario, json_digest

    assert point_id(sc) == json_digest({"resolved": sc.model_dump(mode="json"), "set": canonical_scenario(sc)})


def test_the_command_prints_each_points_results_and_no_empty_progress(tmp_path):
    out = tmp_path / "ds"
    f = write(tmp_path, "grid:\n  workload.arrival.rate: {r4: 4, r8: 8}\n  allocator.kind: [static, paged]\n", "s.yaml")
    cmd = [sys.executable, "-m", "sim.cli.sweep", str(f), "-w", "1", "--out", str(out)]
    env = {**os.environ, "COLUMNS": "200"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("│ r")]
    assert len(lines) == 4
    for row, line in zip(rows(out), lines):
        cells = [c.strip() for c in line.strip("│").split("│")]
        assert cells[:2] == [row["workload.arrival.rate"], row["allocator.kind"]]
        assert cells[2] == f"{row['completed']} / {row['rejected']}"
        assert cells[3] == f"{row['ttft_s.p90']:.3g}" and cells[5] == f"{row['throughput_requests_per_s']:.3g}"
    # Everything reused: the counts on stderr, no "0/0 points" progress line.
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "reused 4 finished point(s) of 4" in r.stderr, r.stderr
    assert "0/0" not in r.stderr, r.stderr
