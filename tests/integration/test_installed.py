"""Installed, it works: ``pip install .`` (not editable) into a fresh environment, then step 3 from another folder.

The fresh environment gets no network: the package is built with
``--no-build-isolation``, and the dependencies come from this environment, named
in a ``.pth`` file of the fresh one (its own site-packages come first, so
``workshop_lib`` is the installed copy; a ``.pth`` line adds a folder without
running that folder's own ``.pth`` files, so this environment's editable install
stays out). Step 3 then runs under torchrun (``python -m torch.distributed.run``,
the module the ``torchrun`` command runs) on the shipped dataset, which is package
data, and writes its run under the folder it was started from.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import SHIPPED, SOLUTIONS, copy_package_source, cpu_env
from workshop_lib.launching.launch import torchrun_argv


def _site_packages(python: Path) -> Path:
    done = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, timeout=60, check=True)
    return Path(done.stdout.strip())


def _fresh_env(where: Path) -> Path:
    """A new virtual environment whose only packages are this one's dependencies (read in place, via a .pth)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=60)
    python = where / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    ours = dict.fromkeys(sysconfig.get_path(kind) for kind in ("purelib", "platlib"))  # torch lies in platlib
    (_site_packages(python) / "deps_of_the_test_env.pth").write_text("".join(f"{path}\n" for path in ours))
    return python


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pip_install_then_step3_from_another_folder_trains_on_the_shipped_dataset(tmp_path):
    source = copy_package_source(tmp_path / "source")  # a copy: the build writes build/ and *.egg-info there
    python = _fresh_env(tmp_path / "venv")
    env = cpu_env()
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                           "--no-build-isolation", "--no-index", "--quiet", str(source)],
                          capture_output=True, text=True, timeout=200, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]

    elsewhere = tmp_path / "elsewhere"  # neither the clone nor one of its folders
    elsewhere.mkdir()
    shutil.copy(SOLUTIONS / "step3_ddp.py", elsewhere / "step3_ddp.py")
    where = subprocess.run([str(python), "-c", "import workshop_lib.paths as p; print(p.__file__); "
                            "print(p.DEFAULT_DATA)"], capture_output=True, text=True, timeout=60,
                           env=env, cwd=elsewhere)
    assert where.returncode == 0, where.stderr[-2000:]
    installed, data = map(Path, where.stdout.splitlines())
    site_packages = _site_packages(python)
    assert installed.is_relative_to(site_packages), installed  # the installed copy, not the clone
    # The dataset is package data: dataset/ of the clone, installed as workshop_lib/dataset/ (pyproject.toml).
    assert data.resolve() == (site_packages / "workshop_lib" / "dataset" / SHIPPED.name).resolve(), data
    assert data.read_bytes() == SHIPPED.read_bytes()

    run = subprocess.run(torchrun_argv("step3_ddp.py", 2, args=["--limit", "300", "--epochs", "1", "--no-tensorboard"],
                                       python=python), capture_output=True, text=True, timeout=240, env=env, cwd=elsewhere)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "data: workshop_lib/dataset/b3db_classification.csv" in run.stdout  # the package's copy
    metrics = json.loads((elsewhere / "runs" / "latest" / "metrics.json").read_text())  # under the current folder
    assert metrics["world_size"] == 2 and metrics["epochs"] == 1, metrics
    assert 0.0 <= metrics["heldout_roc_auc"] <= 1.0
    assert metrics["config"]["data"].endswith("workshop_lib/dataset/b3db_classification.csv")
    assert "metrics: runs/latest/metrics.json" in run.stdout
