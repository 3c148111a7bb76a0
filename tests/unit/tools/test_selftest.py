"""The set-up self-test names what is missing in one line: each check's failure, and the verdict."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tools import ROOT, jupyter_settings, selftest


def test_a_missing_dataset_is_named_with_the_fix(tmp_path):
    r = selftest.check_dataset(tmp_path / "b3db_classification.csv")
    assert not r.ok and "b3db_classification.csv is missing" in r.text and "pip install" in r.text


def test_a_table_without_the_labs_columns_is_named(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("name,label\naspirin,1\n")
    r = selftest.check_dataset(path)
    assert not r.ok and "is not the lab's table" in r.text and "['name', 'label']" in r.text


def test_the_shipped_dataset_is_counted():
    r = selftest.check_dataset()
    assert r.ok and r.text.endswith("b3db_classification.csv: 7,807 molecules")  # the table the scripts read


def test_torch_that_does_not_import_is_named_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    r = selftest.check_torch()
    assert not r.ok and r.text.startswith("torch does not import (ModuleNotFoundError") and "pip install torch==" in r.text


def test_settings_not_installed_then_installed(tmp_path):
    r = selftest.check_settings(tmp_path)
    assert not r.ok and r.text.endswith("python -m tools.jupyter_settings")
    jupyter_settings.install(tmp_path)
    r = selftest.check_settings(tmp_path)
    assert r.ok and r.text == "the lab's JupyterLab settings installed"  # a status word, as every part of 'ready: ...'


@pytest.mark.slow  # starts two Python processes
@pytest.mark.timeout(60)
def test_a_rank_that_fails_is_named_with_its_error():
    r = selftest.check_all_reduce(timeout=20, rank_code="import sys\nif sys.argv[1] == '1': raise OSError('no route')\n"
                                                         "print(3.0)")
    assert not r.ok and r.text == "2 Gloo ranks did not all-reduce: rank 1 failed (OSError: no route)"


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_ranks_that_never_meet_are_stopped_at_the_timeout():
    r = selftest.check_all_reduce(timeout=2, rank_code="import time\ntime.sleep(60)")
    assert not r.ok and r.text.startswith("2 Gloo ranks did not all-reduce within 2 s") and "GLOO_SOCKET_IFNAME" in r.text


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_wrong_sum_is_named():
    r = selftest.check_all_reduce(timeout=20, rank_code="print(2.0)")
    assert not r.ok and r.text == "2 Gloo ranks all-reduced 1 + 2 to '2.0' on rank 0, not 3.0"


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_jupyterlab_that_exits_is_named_with_its_last_line():
    fake = [sys.executable, "-c", "import sys; print('ModuleNotFoundError: No module named jupyterlab'); sys.exit(1)"]
    r = selftest.check_jupyterlab(timeout=20, command=fake)
    assert not r.ok
    assert r.text.startswith("JupyterLab does not start (ModuleNotFoundError: No module named jupyterlab)")
    assert "pip install" in r.text


def test_jupyterlab_that_is_not_installed_is_named(tmp_path):
    r = selftest.check_jupyterlab(timeout=5, command=[str(tmp_path / "no-jupyter")])
    assert not r.ok and r.text.startswith("JupyterLab does not start (") and "pip install" in r.text


def test_the_verdict_is_one_line_naming_every_missing_thing():
    results = [selftest.Result(True, "torch 2.13.0"), selftest.Result(False, "dataset/x.csv is missing: fix A"),
               selftest.Result(False, "JupyterLab does not start (boom): fix B")]
    code, line = selftest.verdict(results)
    assert code == 1 and "\n" not in line
    assert line == "not ready: dataset/x.csv is missing: fix A; and JupyterLab does not start (boom): fix B"
    assert selftest.verdict(results[:1]) == (0, "ready: torch 2.13.0")


@pytest.mark.slow  # the real command: two ranks and a JupyterLab server
@pytest.mark.timeout(120)
def test_the_command_says_ready_in_one_line_within_seconds():
    proc = subprocess.run([sys.executable, "-m", "tools.selftest"], capture_output=True, text=True,
                          timeout=100, cwd=ROOT)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and len(lines) == 1 and lines[0].startswith("ready: torch "), proc.stdout + proc.stderr
    assert "2 Gloo ranks all-reduced" in lines[0] and "JupyterLab" in lines[0]
