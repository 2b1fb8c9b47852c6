"""``python -m calibration.validate.refit`` on a folder that is not a validate run: one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from calibration.validate.refit import main


def test_missing_folder_is_one_line_naming_it(tmp_path, capsys):
    missing = tmp_path / "no-such-run"
    assert main([str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(missing) in err and "no such folder" in err
    assert "validation.json" in err and "overhead_rows.json" in err


@pytest.mark.parametrize("present", [(), ("validation.json",)])
def test_folder_without_the_run_files(tmp_path, capsys, present):
    for name in present:
        (tmp_path / name).write_text(json.dumps({}))
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    absent = "overhead_rows.json" if present else "validation.json"
    assert err.count("\n") == 1 and f"no {absent} there" in err and str(tmp_path) in err


def test_module_entry_point_exits_2_without_traceback(tmp_path):
    missing = tmp_path / "nope"
    p = subprocess.run(
        [sys.executable, "-m", "calibration.validate.refit", str(missing)], capture_output=True, text=True, check=False
    )
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and p.stderr.strip().splitlines() == [p.stderr.strip()]
    assert str(missing) in p.stderr
