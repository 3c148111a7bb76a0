"""The library's layers hold: the step scripts load none of the tools and patch nothing; a wheel has it all."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO, SOLUTIONS, cpu_env

TOOLS = ("workshop_lib.debug", "workshop_lib.lab", "workshop_lib.checks", "workshop_lib.scaling")

_LOADED = """
import importlib.util, json, sys
import torch.distributed as dist
before = {name: getattr(dist, name) for name in ("all_reduce", "init_process_group", "destroy_process_group")}
spec = importlib.util.spec_from_file_location("script", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps({"modules": sorted(m for m in sys.modules if m.startswith("workshop_lib")),
                  "patched": [n for n, f in before.items() if getattr(dist, n) is not f]}))
"""


def _loaded_by(script: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", _LOADED, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env=cpu_env())
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("script", ["step0_baseline", "step3_ddp", "step4_snapshots"])
def test_a_step_script_loads_no_module_of_the_tools_and_patches_nothing(script):
    """The instruments attach from outside (``-m workshop_lib.watch``); importing a step brings only the core."""
    loaded = _loaded_by(SOLUTIONS / f"{script}.py")
    assert loaded["patched"] == []
    assert {"workshop_lib.model", "workshop_lib.data", "workshop_lib.report"} <= set(loaded["modules"])
    assert [m for m in loaded["modules"] if m.startswith(TOOLS)] == []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_wheel_holds_every_module_of_the_source_tree(tmp_path):
    source = tmp_path / "source"  # a copy: the build leaves its build/ folder there, not in the repository
    shutil.copytree(REPO / "workshop_lib", source / "workshop_lib", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                           "-w", str(tmp_path), str(source)], capture_output=True, text=True, timeout=170,
                          env=cpu_env())
    assert done.returncode == 0, done.stderr[-2000:]
    wheel = next(tmp_path.glob("workshop_lib-*.whl"))
    in_wheel = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("workshop_lib/") and n.endswith(".py")}
    in_tree = {p.relative_to(REPO).as_posix() for p in (REPO / "workshop_lib").rglob("*.py")}
    assert in_wheel == in_tree
    assert {"workshop_lib/debug/hangwatch.py", "workshop_lib/checks/rules.py", "workshop_lib/lab/launch.py",
            "workshop_lib/scaling/cost.py"} <= in_wheel
