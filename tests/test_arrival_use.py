"""What each arrival kind reads (``ARRIVAL_KEYS`` next to the arrival config in sim/config.py)
against what changes its runs, and the sweep rule built on it (sim/workload/arrival_use.py): an axis
on a ``workload.arrival`` key that the arrival kind of no point reads is refused by ``kvsim sweep``
and by the explorer's sweeps, as an ``allocator.*`` axis the allocator ignores is."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import typing

import pytest

from helpers import SMALL_EXPLORER as SMALL, tiny_scenario
from sim.analysis.sweep import load_sweep, spec as sweep_spec
from sim.config import ARRIVAL_COMMON_KEYS, ARRIVAL_KEYS, ArrivalConfig, apply_overrides
from sim.engine.cluster import simulate
from sim.errors import ConfigError
from sim.workload import arrival_use as au

KINDS = typing.get_args(ArrivalConfig.model_fields["kind"].annotation)
FIELDS = [f for f in ArrivalConfig.model_fields if f != "kind"]


# --- the table against the runs ---------------------------------------------------------------


def test_the_table_names_every_kind_and_every_key_once():
    assert set(ARRIVAL_KEYS) == set(KINDS)
    listed = [k for keys in ARRIVAL_KEYS.values() for k in keys] + list(ARRIVAL_COMMON_KEYS)
    assert set(listed) <= set(FIELDS), f"not arrival keys: {sorted(set(listed) - set(FIELDS))}"
    assert set(listed) == set(FIELDS), f"read by no kind: {sorted(set(FIELDS) - set(listed))}"
    for kind, keys in ARRIVAL_KEYS.items():
        assert len(set(keys)) == len(keys) and not set(keys) & set(ARRIVAL_COMMON_KEYS), kind


def _traces(tmp_path):
    """Two small CSV traces with different arrival times."""
    paths = []
    for name, gap in (("a.csv", 0.02), ("b.csv", 0.07)):
        rows = "".join(f"{i * gap:.3f},{32 + 7 * (i % 5)},{8 + (i % 7)}\n" for i in range(30))
        p = tmp_path / name
        p.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
        paths.append(str(p))
    return paths


def _bases(tmp_path) -> dict[str, dict]:
    """Per kind, an arrival section under which every key the kind reads changes the run: each
    key set (not left to the engine's defaults), and the settings other keys depend on turned on
    (``think_time_cv`` is drawn only with ``think_time_s`` > 0)."""
    common = {"client_s": 0.002, "client_cv": 0.5}
    a, _ = _traces(tmp_path)
    return {
        "poisson": {"kind": "poisson", "rate": 20.0, "max_concurrency": 3, **common},
        "gamma": {"kind": "gamma", "rate": 20.0, "cv": 2.0, "max_concurrency": 3, **common},
        "trace": {"kind": "trace", "path": a, "format": "csv", "time_scale": 1.0, "max_concurrency": 3, **common},
        "closed_loop": {
            "kind": "closed_loop",
            "concurrency": 4,
            "think_time_s": 0.01,
            "think_time_cv": 0.5,
            "start_spread_s": 0.01,
            "start_spread_cycles": 0.5,
            "completion_per_token_s": 1e-4,
            **common,
        },
    }


def _other_values(tmp_path) -> dict[str, object]:
    """For each key, a value other than every base's (the trace's format ``azure`` fails to read the
    CSV trace: also a run that changes)."""
    _, b = _traces(tmp_path)
    return {
        "rate": 7.0,
        "cv": 3.0,
        "path": b,
        "format": "azure",
        "time_scale": 0.5,
        "concurrency": 2,
        "think_time_s": 0.05,
        "think_time_cv": 2.0,
        "start_spread_s": 0.2,
        "start_spread_cycles": 2.0,
        "completion_per_token_s": 5e-3,
        "max_concurrency": 1,
        "client_s": 0.01,
        "client_cv": 1.5,
    }


def _outcome(arrival: dict):
    """What a run of ``arrival`` gives: its summary and per-request rows, or its error."""
    try:
        res = simulate(tiny_scenario(**{"workload.arrival": arrival, "workload.num_requests": 30}))
    except ConfigError as exc:
        return ("error", str(exc))
    return (res.summary, res.requests.to_pydict())


def _refused(arrival: dict) -> bool:
    """Whether the arrival section itself is invalid (closed_loop refuses ``max_concurrency``): a
    key a kind refuses is not one it reads, and a sweep leaves such points out as invalid."""
    try:
        ArrivalConfig(**arrival)
    except ValueError:
        return True
    return False


def _keys_that_change_runs(kind: str, tmp_path) -> set[str]:
    base = _bases(tmp_path)[kind]
    ref = _outcome(base)
    assert ref[0] != "error", ref
    return {
        key
        for key, value in _other_values(tmp_path).items()
        if not _refused({**base, key: value}) and _outcome({**base, key: value}) != ref
    }


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_lists_exactly_the_keys_that_change_its_runs(kind, tmp_path):
    """The generator (sim/workload/generator.py) and the engine's clients read these keys: a key
    the table gives ``kind`` changes its run, and one it does not give leaves the run as it was."""
    assert set(_other_values(tmp_path)) == set(FIELDS)
    changed = _keys_that_change_runs(kind, tmp_path)
    said = {k for k in FIELDS if au.arrival_reads(kind, k)}
    assert said == changed, (
        f"{kind}: listed but not read {sorted(said - changed)}, read but not listed {sorted(changed - said)}"
    )


def test_the_check_can_fail(monkeypatch, tmp_path):
    """A kind that forgets a key it reads, or lists one it does not, is caught."""
    monkeypatch.setitem(ARRIVAL_KEYS, "gamma", ("rate", "time_scale", "max_concurrency"))
    changed = _keys_that_change_runs("gamma", tmp_path)
    said = {k for k in FIELDS if au.arrival_reads("gamma", k)}
    assert changed - said == {"cv"} and said - changed == {"time_scale"}


# --- the rule ------------------------------------------------------------------------------------


def test_reads_per_kind():
    assert au.arrival_reads("poisson", "rate") and not au.arrival_reads("poisson", "cv")
    assert not au.arrival_reads("closed_loop", "rate") and au.arrival_reads("closed_loop", "concurrency")
    assert not au.arrival_reads("trace", "concurrency") and au.arrival_reads("trace", "time_scale")
    assert all(au.arrival_reads(k, "client_s") and au.arrival_reads(k, "client_cv") for k in KINDS)
    assert au.arrival_reads("no_such_kind", "rate")  # not listed: reads everything


CLOSED = ArrivalConfig(kind="closed_loop", concurrency=4)
POISSON = ArrivalConfig(kind="poisson", rate=5.0)


def test_an_arrival_axis_no_point_reads_is_refused_naming_the_kinds_and_what_they_read():
    grid = {"workload.arrival.rate": [5, 10]}
    with pytest.raises(ConfigError) as e:
        au.check_arrival_axes_read(grid, au.grid_arrivals(CLOSED, grid))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("sweep axis workload.arrival.rate: got [5, 10]; a key the arrival kind reads"), msg
    assert "workload.arrival.kind closed_loop ignores it" in msg, msg
    assert (
        "closed_loop reads workload.arrival.{concurrency, think_time_s, think_time_cv, start_spread_s, "
        "start_spread_cycles, completion_per_token_s}; every kind reads workload.arrival.{client_s, client_cv}"
    ) in msg, msg

    # Swept kinds are judged point by point: refused only when no point's kind reads it.
    grid = {"workload.arrival.kind": ["poisson", "trace"], "workload.arrival.concurrency": [2, 8]}
    base = POISSON.model_copy(update={"path": "x.csv"})
    with pytest.raises(ConfigError, match="each of workload.arrival.kind poisson, trace ignores it; poisson reads "):
        au.check_arrival_axes_read(grid, au.grid_arrivals(base, grid))
    for arrival, grid in (
        (POISSON, {"workload.arrival.kind": ["poisson", "closed_loop"], "workload.arrival.concurrency": [2, 8]}),
        (POISSON, {"workload.arrival.kind": ["poisson", "gamma"], "workload.arrival.cv": [1, 2]}),
        (CLOSED, {"workload.arrival.concurrency": [2, 8], "workload.arrival.think_time_s": [0, 1]}),
        (POISSON, {"workload.arrival.client_cv": [0, 1]}),  # every kind's
        (CLOSED, {"workload.arrival.kind": ["closed_loop"], "allocator.block_size": [16, 32]}),  # not arrival keys
        (CLOSED, {"workload.arrival": [{"kind": "poisson", "rate": 1}]}),  # the whole section: not a key of it
    ):
        au.check_arrival_axes_read(grid, au.grid_arrivals(arrival, grid))
    # The closed_loop points of this grid are invalid (no concurrency): the poisson ones decide.
    grid = {"workload.arrival.kind": ["poisson", "closed_loop"], "workload.arrival.cv": [1, 2]}
    assert [a.kind for a in au.grid_arrivals(POISSON, grid)] == ["poisson", "poisson"]
    with pytest.raises(ConfigError, match="workload.arrival.kind poisson ignores it"):
        au.check_arrival_axes_read(grid, au.grid_arrivals(POISSON, grid))
    au.check_arrival_axes_read({"workload.arrival.rate": [1, 2]}, [])  # no valid point: nothing refused


def write(tmp_path, text, name="sweep.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_kvsim_sweep_refuses_an_arrival_axis_the_kind_ignores(tmp_path):
    f = write(
        tmp_path,
        """
        base: chat-api
        set: {workload.num_requests: 20, workload.arrival.kind: closed_loop, workload.arrival.concurrency: 4}
        grid:
          workload.arrival.rate: [5, 10]
          allocator.kind: [static, paged]
    """,
    )
    out = tmp_path / "ds"
    r = subprocess.run(
        [sys.executable, "-m", "sim.cli.sweep", str(f), "-w", "1", "--out", str(out), "-q"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    msg = lines[0]
    assert msg.startswith("error: sweep axis workload.arrival.rate: got [5, 10]; a key the arrival kind reads"), msg
    assert "workload.arrival.kind closed_loop ignores it; closed_loop reads workload.arrival.{concurrency" in msg
    assert "Traceback" not in r.stderr and not r.stdout.strip()
    assert not out.exists()  # refused before any point ran or was written

    # Read at some point: a swept kind that reads it.
    text = f.read_text().replace("workload.arrival.kind: closed_loop, ", "")
    g = write(tmp_path, text + "  workload.arrival.kind: [closed_loop, poisson]\n", name="ok.yaml")
    pts = load_sweep(g).points()
    assert len(pts) == 2 * 2 * 2


def test_cli_and_explorer_ask_one_function(monkeypatch, tmp_path):
    """``kvsim sweep`` (SweepSpec.points) and the explorer's early check both go through
    sim.analysis.sweep.spec.check_sweep_axes, with the points' allocator and arrival sections."""
    from sim import explorer as X

    calls = []

    def spy(axes, allocators, arrivals):
        calls.append((dict(axes), [a.kind for a in allocators], [a.kind for a in arrivals]))

    monkeypatch.setattr(sweep_spec, "check_sweep_axes", spy)
    f = write(
        tmp_path,
        """
        base: chat-api
        set: {workload.num_requests: 20}
        grid:
          workload.arrival.rate: [5, 10]
    """,
    )
    load_sweep(f).points()
    sc = tiny_scenario()
    X.check_axes_read(sc, {"workload.arrival.rate": [5, 10]})
    assert [c[0] for c in calls] == [{"workload.arrival.rate": (5, 10)}, {"workload.arrival.rate": [5, 10]}]
    assert calls[1][1:] == (["paged"], ["poisson", "poisson"])


# --- the explorer ------------------------------------------------------------------------------


def test_explorer_sweep_refuses_an_arrival_axis_the_kind_ignores(store):
    from sim import explorer as X
    from sim.config import scenario_from_dict

    closed = apply_overrides(SMALL, {"workload.arrival": {"kind": "closed_loop", "concurrency": 8}})
    with pytest.raises(ConfigError) as e:
        X.run_small_sweep(closed, {"workload.arrival.rate": [5, 10]}, 40, store)
    msg = str(e.value)
    assert msg.startswith("sweep axis workload.arrival.rate: got [5, 10]; a key the arrival kind reads"), msg
    assert "workload.arrival.kind closed_loop ignores it" in msg, msg
    with pytest.raises(
        ConfigError,
        match=r"workload.arrival.kind poisson ignores it; poisson reads workload.arrival.\{rate, max_concurrency\}",
    ):
        X.run_small_sweep(SMALL, {"workload.arrival.cv": [1, 2, 4]}, 40, store)
    assert not (store.dir / "sweeps").exists()  # refused before anything is written or run

    sc = scenario_from_dict(SMALL)
    X.check_axes_read(sc, {"workload.arrival.rate": [5, 10], "allocator.block_size": [16, 32]})
    X.check_axes_read(sc, {"workload.arrival.kind": ["poisson", "gamma"], "workload.arrival.cv": [1, 2]})
    # The allocator rule still holds, through the same function.
    with pytest.raises(ConfigError, match="allocator.kind paged ignores it"):
        X.check_axes_read(sc, {"allocator.reserve": ["max_model_len", "p95"]})


def test_the_sweeps_page_shows_the_message(monkeypatch):
    pytest.importorskip("streamlit")
    pytest.importorskip("plotly")
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("KVSIM_APP_PREWARM", "0")
    at = AppTest.from_file(str(Path(__file__).resolve().parent.parent / "app.py"), default_timeout=180)
    at.run()
    assert not at.exception, at.exception
    assert at.selectbox(key="knob.workload.arrival.kind").value == "poisson"
    at.radio(key="page").set_value("Sweeps & plan").run()
    at.radio(key="sw_src").set_value("Run a small sweep").run()
    at.selectbox(key="sw_a1").set_value("workload.arrival.cv").run()
    at.text_input(key="sw_v1_workload.arrival.cv").set_value("1, 2, 4")
    at.selectbox(key="sw_a2").set_value("(none)")
    at.number_input(key="sw_n").set_value(60)
    at.button(key="sweep_run").click().run()
    assert not at.exception, at.exception
    errors = " ".join(e.value for e in at.error).replace("\\", "")  # as shown: Markdown escapes removed
    assert "sweep axis workload.arrival.cv: got [1, 2, 4]; a key the arrival kind reads" in errors, errors
    assert "workload.arrival.kind poisson ignores it" in errors, errors
