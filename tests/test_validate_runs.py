"""``kvsim validate-runs``: several validation runs read together (calibration/validate/several_runs.py)."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from calibration.validate.several_runs import JUDGED, combine, load_run, markdown
from sim.errors import ConfigError

CELLS = [(load, alloc) for alloc in ("paged", "static") for load in ("light", "medium", "saturating")]
METRICS = JUDGED + ("ttft_p99", "throughput", "peak_kv_blocks")  # the last three are not judged


def _write_run(path, errors, *, measured=1.0, config=None, engine=None, sensitivity=None):
    """A validation.json whose judged cell ``i`` has signed error ``errors[i]`` (the others 0.5) and,
    given ``sensitivity``, sensitivity ``sensitivity[i]``."""
    rows, i = [], 0
    for load, alloc in CELLS:
        for m in METRICS:
            e = errors[i] if m in JUDGED else 0.5
            row = {
                "load": load,
                "allocator": alloc,
                "metric": m,
                "measured": measured,
                "simulated": measured * (1 + e),
                "rel_error": abs(e),
            }
            if sensitivity is not None and m in JUDGED:
                row["sensitivity"] = float(sensitivity[i])
            i += m in JUDGED
            rows.append(row)
    cfg = {"kv": {"num_blocks": 256, "block_size": 16}, "loads": ["light", "medium", "saturating"], **(config or {})}
    if engine is not None:
        cfg["engine"] = engine
    path.mkdir(parents=True)
    (path / "validation.json").write_text(
        json.dumps(
            {
                "rows": rows,
                "config": cfg,
                "shape": {"model": "tiny-llama"},
                "clock": "cpu_norm",
                "device": {"kind": "cpu"},
                "elapsed_s": 600.0,
            }
        )
    )
    return path


def test_combine_separates_the_systematic_part_from_each_runs_level(tmp_path):
    n = len(CELLS) * len(JUDGED)
    rng = np.random.default_rng(0)
    bias = np.linspace(-0.06, 0.03, n)  # the same in every run
    levels = [-0.04, 0.0, 0.02, 0.05]
    errs = [bias + lv + rng.normal(0, 0.01, n) for lv in levels]
    errs[1][7] = 0.15  # one run's one cell beyond 10 %
    runs = [load_run(_write_run(tmp_path / f"r{i}", e, measured=0.1 * (i + 1))) for i, e in enumerate(errs)]
    doc = combine(runs)
    E = np.array(errs)
    assert [r["run"] for r in doc["runs"]] == ["r0", "r1", "r2", "r3"]
    for r, e in zip(doc["runs"], E):  # per run: its level is the mean signed error of its cells
        assert r["cells"] == n and r["mean_signed_error"] == pytest.approx(e.mean(), abs=1e-12)
        assert r["within_10pct"] == int((np.abs(e) <= 0.10).sum()) and r["max_abs_error"] == pytest.approx(
            np.abs(e).max()
        )
    # per cell: the mean over runs recovers the bias (the levels average to +0.75 %)
    cells = doc["cells"]
    assert len(cells) == n
    by_key = {(c["load"], c["allocator"], c["metric"]): c for c in cells}
    for j in range(n):
        load, alloc = CELLS[j // len(JUDGED)]
        c = by_key[(load, alloc, JUDGED[j % len(JUDGED)])]
        assert c["mean_signed_error"] == pytest.approx(E[:, j].mean(), abs=1e-12)
        assert c["sd"] == pytest.approx(E[:, j].std(ddof=1), abs=1e-12)
        assert c["runs_beyond_10pct"] == int((np.abs(E[:, j]) > 0.10).sum())
    p = doc["pooled"]
    assert p["runs"] == 4 and p["cell_results"] == 4 * n
    assert p["cells_beyond_10pct"] == int((np.abs(E) > 0.10).sum()) >= 1
    assert p["runs_all_within_10pct"] == int((np.abs(E) <= 0.10).all(axis=1).sum())
    assert p["mean_signed_error"] == pytest.approx(E.mean())
    # the runs' median: per cell the median of the runs' errors (each run's times in its own unit)
    med = doc["median_of_runs"]
    for k in med["cells_detail"]:
        j = CELLS.index((k["load"], k["allocator"])) * len(JUDGED) + JUDGED.index(k["metric"])
        assert k["signed_error"] == pytest.approx(np.median(E[:, j]), abs=1e-12)
    assert med["within_10pct"] == int((np.abs(np.median(E, axis=0)) <= 0.10).sum())
    text = markdown(doc)
    assert "| r1 |" in text and "4 runs: all 36 cells within 10 %" in text and "| light | paged |" in text


def test_combine_refuses_what_cannot_be_read_together(tmp_path):
    e = np.zeros(len(CELLS) * len(JUDGED))
    a = load_run(_write_run(tmp_path / "a", e))
    with pytest.raises(ConfigError, match="two or more"):
        combine([a])
    other = load_run(_write_run(tmp_path / "b", e, config={"kv": {"num_blocks": 128, "block_size": 16}}))
    with pytest.raises(ConfigError, match=r"same setup.*config"):
        combine([a, other])
    with pytest.raises(ConfigError, match="validation.json"):
        load_run(tmp_path / "missing")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "validation.json").write_text("{}")
    with pytest.raises(ConfigError, match="rows"):
        load_run(tmp_path / "bad")
    # engine options may differ (calibration choices): named, not refused
    b = load_run(_write_run(tmp_path / "c", e, engine={"replays": 5}))
    c = load_run(_write_run(tmp_path / "d", e, engine={"replays": 5, "overhead_mix": "both"}))
    assert combine([b, c])["engine_differs"] == ["d"]
    assert combine([a, b, c])["engine_differs"] == ["d"]  # a run that does not record them is not "different"
    assert "differ from the first run's in d" in markdown(combine([b, c]))


def test_validate_runs_command(tmp_path):
    from sim.cli.main import app

    e = np.full(len(CELLS) * len(JUDGED), -0.02)
    r1, r2 = _write_run(tmp_path / "r1", e), _write_run(tmp_path / "r2", e + 0.01)
    out = tmp_path / "sum" / "runs.json"
    res = CliRunner().invoke(app, ["validate-runs", str(r1), str(r2), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "2 runs: all 36 cells within 10 % in 2" in res.output
    doc = json.loads(out.read_text())
    assert doc["pooled"]["mean_signed_error"] == pytest.approx(-0.015)
    res = CliRunner().invoke(app, ["validate-runs", str(r1), str(tmp_path / "nope")])
    assert res.exit_code != 0
    # The same run twice would report its noise as agreement (a spread of 0 between the two).
    # (the command line's main turns the ConfigError into its one line and exit 2)
    res = CliRunner().invoke(app, ["validate-runs", str(r1), str(tmp_path / "r1" / ".." / "r1")])
    assert "distinct runs (the same folder as" in str(res.exception), res.output
    res = CliRunner().invoke(app, ["validate-runs", str(r1)])
    assert "two or more kvsim validate output folders" in str(res.exception), res.output


def test_combine_reads_each_cells_sensitivity(tmp_path):
    """The mean error ÷ the mean sensitivity: the uniform step-time error a cell's lean amounts to."""
    n = len(CELLS) * len(JUDGED)
    sens = np.linspace(1.0, 7.0, n)
    sens[3] = 0.2  # hardly moves with step time: no step equivalent
    errs = [np.full(n, -0.07), np.full(n, -0.05)]
    runs = [load_run(_write_run(tmp_path / f"r{i}", e, sensitivity=sens * (1 + 0.1 * i))) for i, e in enumerate(errs)]
    doc = combine(runs)
    by_key = {(c["load"], c["allocator"], c["metric"]): c for c in doc["cells"]}
    for j in range(n):
        load, alloc = CELLS[j // len(JUDGED)]
        c = by_key[(load, alloc, JUDGED[j % len(JUDGED)])]
        assert c["sensitivity"] == pytest.approx(sens[j] * 1.05)
        if j == 3:
            assert c["step_equivalent"] is None
        else:
            assert c["step_equivalent"] == pytest.approx(-0.06 / (sens[j] * 1.05))
    text = markdown(doc)
    assert "Sensitivity to step time per cell" in text and "| 7.4 (-0.8) |" in text  # 7 x 1.05 = 7.35; -6 % / 7.35
    assert "| 0.2 |" in text  # no step equivalent where the metric hardly moves with step time
    # runs without it and without their traces: no sensitivity, nothing refused
    bare = combine([load_run(_write_run(tmp_path / f"b{i}", e)) for i, e in enumerate(errs)])
    assert all(c["sensitivity"] is None and c["step_equivalent"] is None for c in bare["cells"])
    assert "Sensitivity to step time" not in markdown(bare)


def test_load_run_recomputes_sensitivity_from_the_runs_own_files(tmp_path):
    """A run written before rows carried it: recomputed from its traces and profiles."""
    from calibration.validate import load_spec, make_requests, write_trace

    e = np.zeros(len(CELLS) * len(JUDGED))
    path = _write_run(tmp_path / "old", e)
    spec = load_spec("scenarios/validate-cpu.yaml")
    doc = json.loads((path / "validation.json").read_text())
    doc["config"] = spec.model_dump(include={"kv", "scheduler", "static_reserve", "workload", "loads"})
    doc["name"], doc["rates"] = "old", {"medium/static": 3.0}
    (path / "validation.json").write_text(json.dumps(doc))
    spec.workload.num_requests = 20
    write_trace(make_requests(spec, 3.0), path / "trace-medium-static.csv")
    from sim.cost.profile import load_profile

    load_profile("cpu-reference").write(path / "profile-static.json")
    run = load_run(path)
    got = {k: v for k, v in run.sensitivity.items()}
    assert {k[:2] for k in got} == {("medium", "static")} and set(k[2] for k in got) <= set(JUDGED)
    assert got[("medium", "static", "tpot_p50")] > 0.5
    assert load_run(path, recompute_sensitivity=False).sensitivity == {}
