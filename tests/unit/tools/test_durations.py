"""tools.durations: seconds per test file from a JUnit report; the suite hands out the longest files first (and
cleans up after itself)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.conftest import REPO, _longest_first
from tools import durations

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.unit.core.test_data" name="test_a" time="1.5"/>
<testcase classname="tests.unit.core.test_data" name="test_b" time="2.0"/>
<testcase classname="tests.unit.core.test_data.TestGroup" name="test_c" time="0.5"/>
<testcase classname="notebooks.03_ddp.ipynb" name="Cell 0" time="4.0"/>
<testcase classname="notebooks.03_ddp.ipynb" name="Cell 7" time="30.25"/>
</testsuite></testsuites>"""


def test_a_report_becomes_seconds_per_file_longest_first(tmp_path):
    report = tmp_path / "suite.xml"
    report.write_text(REPORT)
    assert list(durations.per_file(report).items()) == [("notebooks/03_ddp.ipynb", 34.2),
                                                        ("tests/unit/core/test_data.py", 4.0)]


def test_a_missing_report_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        durations.main([str(tmp_path / "none.xml")])
    assert err.value.code == 2 and "run pytest --junitxml=" in capsys.readouterr().err


def test_the_stored_durations_name_files_of_this_repository():
    stored = json.loads(durations.DURATIONS.read_text())
    assert stored and all((REPO / name).is_file() for name in stored), [n for n in stored if not (REPO / n).is_file()]


def test_files_go_out_longest_first_each_in_its_own_order():
    stored = json.loads(durations.DURATIONS.read_text())
    longest, shorter = sorted(stored, key=stored.get, reverse=True)[:2]
    items = [SimpleNamespace(path=REPO / name, n=n) for n, name in
             enumerate([shorter, "tests/unit/not_measured.py", longest, shorter, longest])]
    _longest_first(items)
    assert [(item.path.relative_to(REPO).as_posix(), item.n) for item in items] == [
        (longest, 2), (longest, 4), (shorter, 0), (shorter, 3), ("tests/unit/not_measured.py", 1)]


def test_the_end_of_a_run_removes_its_saved_reference_runs_and_no_other_runs(monkeypatch, tmp_path):
    """tests.reliability saves the shared reference run in the temp folder; conftest removes it at the run's end."""
    from tests import reliability

    monkeypatch.setattr(reliability, "_reference_folder", lambda: tmp_path)
    names = ["ddp-reference-abc-step4_snapshots.json", "ddp-reference-abc-step4_snapshots.json.lock",
             "ddp-reference-other-step4_snapshots.json", "unrelated.json"]
    for name in names:
        (tmp_path / name).write_text("{}")
    reliability.remove_reference_runs("abc")
    assert sorted(p.name for p in tmp_path.iterdir()) == names[2:]
