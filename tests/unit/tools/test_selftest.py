"""The set-up self-test names what is missing in one line: each check's failure, and the verdict the learner sends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    assert r.ok and r.text == "the lab's JupyterLab settings installed" and r.brief is None  # not in the ready line


@pytest.mark.slow  # starts two Python processes
@pytest.mark.timeout(60)
def test_a_rank_that_fails_is_named_with_its_error():
    r = selftest.check_all_reduce(timeout=20, rank_code="import sys\nif sys.argv[1] == '1': raise OSError('no route')\n"
                                                         "print(3.0)")
    assert not r.ok and r.text == "2 Gloo ranks did not all-reduce: rank 1 failed (OSError: no route)"


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_ranks_that_never_meet_are_stopped_at_the_timeout():
    r = selftest.check_all_reduce(timeout=1, rank_code="import time\ntime.sleep(60)")  # they never meet: 1 s is enough
    assert not r.ok and r.text.startswith("2 Gloo ranks did not all-reduce within 1 s") and "GLOO_SOCKET_IFNAME" in r.text


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


def test_the_verdict_is_one_line_naming_every_missing_thing(monkeypatch):
    monkeypatch.setattr(selftest.platform, "system", lambda: "Linux")
    results = [selftest.Result(True, "torch 2.13.0", "torch 2.13.0"), selftest.Result(True, "settings installed"),
               selftest.Result(False, "dataset/x.csv is missing: fix A"),
               selftest.Result(False, "JupyterLab does not start (boom): fix B")]
    code, line = selftest.verdict(results)
    assert code == 1 and "\n" not in line
    assert line == ("DDP-WORKSHOP NOT READY: dataset/x.csv is missing: fix A; and JupyterLab does not start (boom): "
                    "fix B [torch 2.13.0, linux]")
    assert selftest.verdict(results[:2]) == (0, "DDP-WORKSHOP READY: torch 2.13.0, linux")


def test_an_old_python_and_a_single_core_are_named():
    assert selftest.check_python((3, 11, 4)).brief == "python 3.11"
    old = selftest.check_python((3, 9, 18))
    assert not old.ok and old.text.startswith("python 3.9: the lab needs 3.10 or newer")
    one = selftest.check_cores(1)
    assert not one.ok and "the lab's runs start 2 ranks" in one.text
    assert selftest.check_cores(4).brief == "4 cores"


def _python_of_another_environment(tmp_path: Path) -> Path:
    """An executable that answers the self-test's question as a Python of another environment would."""
    fake = tmp_path / "elsewhere" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho /elsewhere\n")
    fake.chmod(0o755)
    return fake


@pytest.mark.skipif(os.name == "nt", reason="a shell script stands in for another environment's Python")
def test_torchrun_and_a_kernel_of_another_environment_are_named(tmp_path):
    other = _python_of_another_environment(tmp_path)
    torchrun = other.parent / "torchrun"
    torchrun.write_text(f"#!{other}\nimport torch.distributed.run\n")
    r = selftest.check_torchrun(str(torchrun))
    assert not r.ok and r.text.startswith(f"torchrun on PATH ({torchrun}) is another environment's") \
        and ". .venv/bin/activate" in r.text
    mine = selftest.check_torchrun()  # the one on this environment's PATH, written by pip for this Python
    assert mine.ok and mine.brief == "torchrun on PATH"
    k = selftest.check_kernel(str(other))
    assert not k.ok and k.text.startswith(f"the notebook's kernel runs {other}, not this environment's Python")
    assert selftest.check_kernel(sys.executable).brief == "kernel: this environment"


@pytest.mark.slow  # the real command, twice broken: two ranks, no JupyterLab
@pytest.mark.timeout(120)
@pytest.mark.skipif(os.name == "nt", reason="a shell script stands in for another environment's Python")
def test_the_line_names_each_thing_missing_a_broken_machine_lacks(tmp_path):
    """A terminal without the environment on PATH (no torchrun), and a notebook whose kernel is another Python."""
    other = _python_of_another_environment(tmp_path)
    bare = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not (Path(d) / "torchrun").exists())
    proc = subprocess.run([sys.executable, "-m", "tools.selftest", "--kernel", str(other)], capture_output=True,
                          text=True, timeout=100, cwd=ROOT, env={**os.environ, "PATH": bare})
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stdout + proc.stderr
    line = lines[0]
    assert line.startswith("DDP-WORKSHOP NOT READY: torchrun not on PATH (activate the environment"), line
    assert f"the notebook's kernel runs {other}, not this environment's Python" in line
    assert "gloo 2-rank join" in line and line.endswith("]")  # what works, in brackets after what is missing


@pytest.mark.slow  # the real command: two ranks and a JupyterLab server
@pytest.mark.timeout(120)
def test_the_command_says_ready_in_one_line_within_seconds():
    proc = subprocess.run([sys.executable, "-m", "tools.selftest"], capture_output=True, text=True,
                          timeout=100, cwd=ROOT)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and len(lines) == 1, proc.stdout + proc.stderr
    line = lines[0]
    assert line.startswith("DDP-WORKSHOP READY: torch "), line
    for part in ("python 3.", " cores, ", "torchrun on PATH", "gloo 2-rank join", "data 7,807 molecules", "JupyterLab",
                 "kernel: this environment"):
        assert part in line, f"the ready line lacks {part!r}: {line}"


@pytest.mark.timeout(60)
def test_run_from_a_notebooks_cell_it_finds_the_kernel(tmp_path):
    """A ``!`` line's process descends from the kernel (``python -m ipykernel_launcher ...``): the self-test reads
    the kernel's Python from there, as the kernel was launched."""
    kernel = tmp_path / "ipykernel_stand_in.py"  # a parent whose arguments name ipykernel, as a kernel's do
    kernel.write_text("import subprocess, sys\n"
                      "subprocess.run([sys.executable, '-c', 'from tools import selftest; "
                      "print(selftest.notebook_kernel())'], check=True)\n")
    out = subprocess.run([sys.executable, str(kernel)], capture_output=True, text=True, timeout=50, cwd=ROOT)
    assert out.stdout.strip() == sys.executable, out.stdout + out.stderr
    assert selftest.notebook_kernel() is None  # pytest's process: no kernel above it
