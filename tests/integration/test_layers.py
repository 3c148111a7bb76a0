"""The library's layers hold: the step scripts load none of the tools and patch nothing; the package imports without
the lab extra; a wheel holds the core and the instruments, and none of the course's tooling (tools/, docs/_ext/)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO, SHIPPED, SOLUTIONS, copy_package_source, cpu_env

TOOLS = ("workshop_lib.debug", "workshop_lib.launching", "workshop_lib.figures", "workshop_lib.authoring",
         "workshop_lib.engine", "workshop_lib.checks", "workshop_lib.scaling")

# Each script in turn, in one process: what is loaded after it (its own and the scripts' before it), what it patched.
_LOADED = """
import importlib.util, json, sys
import torch.distributed as dist
for path in sys.argv[1:]:
    before = {name: getattr(dist, name) for name in ("all_reduce", "init_process_group", "destroy_process_group")}
    spec = importlib.util.spec_from_file_location("script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print(json.dumps({"modules": sorted(m for m in sys.modules if m.startswith("workshop_lib")),
                      "patched": [n for n, f in before.items() if getattr(dist, n) is not f]}))
"""
STEPS = ("step0_baseline", "step3_ddp", "step4_snapshots")  # step 0 first: the core modules are its own


@pytest.fixture(scope="module")
def loaded_by() -> dict[str, dict]:
    done = subprocess.run([sys.executable, "-c", _LOADED, *(str(SOLUTIONS / f"{s}.py") for s in STEPS)],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env=cpu_env())
    assert done.returncode == 0, done.stderr
    return dict(zip(STEPS, map(json.loads, done.stdout.splitlines()[-len(STEPS):]), strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("script", STEPS)
def test_a_step_script_loads_no_module_of_the_tools_and_patches_nothing(loaded_by, script):
    """The instruments attach from outside (``-m workshop_lib.watch``); importing a step brings only the core."""
    loaded = loaded_by[script]
    assert loaded["patched"] == []
    assert {"workshop_lib.model", "workshop_lib.data", "workshop_lib.report"} <= set(loaded["modules"])
    assert [m for m in loaded["modules"] if m.startswith(TOOLS)] == []


# What the lab extra brings (pyproject.toml): the package must import without it; only notebook code calls it.
LAB_ONLY = ("matplotlib", "tqdm", "ipywidgets", "IPython", "ipykernel", "nbformat", "jupyterlab", "sklearn")

_IMPORT_ALL = """
import importlib, pkgutil, sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # import name now raises ImportError
import workshop_lib
names = [m.name for m in pkgutil.walk_packages(workshop_lib.__path__, "workshop_lib.")]
for name in names:
    importlib.import_module(name)
print(len(names))
"""


@pytest.mark.slow
def test_every_module_imports_without_the_lab_extra_or_scikit_learn():
    """A terminal (torchrun, the watch, the checker) needs the dependencies only; figures and widgets import lazily."""
    done = subprocess.run([sys.executable, "-c", _IMPORT_ALL, ",".join(LAB_ONLY)], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=cpu_env())
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) > 40


def build_wheel(tmp_path: Path) -> Path:
    """``pip wheel`` of a copy of the package (no network, no build isolation: setuptools of this environment)."""
    source = copy_package_source(tmp_path / "source")  # a copy: the build leaves build/ there, not in the repository
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                           "-w", str(tmp_path), str(source)], capture_output=True, text=True, timeout=170,
                          env=cpu_env())
    assert done.returncode == 0, done.stderr[-2000:]
    return next(tmp_path.glob("workshop_lib-*.whl"))


# The course's tooling, by the module it was in the package (issue 26): none of it may come back into the wheel.
TOOLING = ("build", "site", "selftest", "budget", "episodes", "sitelinks", "execute", "jupyter_settings")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_wheel_holds_the_core_and_the_instruments_and_none_of_the_course_tooling(tmp_path):
    wheel = zipfile.ZipFile(build_wheel(tmp_path))
    names = wheel.namelist()
    in_wheel = {n for n in names if n.startswith("workshop_lib/") and n.endswith(".py")}
    in_tree = {p.relative_to(REPO).as_posix() for p in (REPO / "workshop_lib").rglob("*.py")}
    assert in_wheel == in_tree | {"workshop_lib/dataset/__init__.py"}  # dataset/ is workshop_lib.dataset (pyproject)
    # The data: the top-level dataset/ installs as workshop_lib/dataset/, the table alone (setup.py and the
    # package-data list keep its README and make_b3db.py out).
    data = sorted(n for n in names if n.startswith("workshop_lib/dataset/"))
    assert data == ["workshop_lib/dataset/__init__.py", f"workshop_lib/dataset/{SHIPPED.name}"], data
    assert wheel.read(f"workshop_lib/dataset/{SHIPPED.name}") == SHIPPED.read_bytes()
    core = {f"workshop_lib/{m}.py" for m in ("config", "data", "model", "metrics", "report", "checkpoint", "split")}
    instruments = {"workshop_lib/watch.py", "workshop_lib/check.py", "workshop_lib/debug/hangwatch.py",
                   "workshop_lib/engine/rules.py", "workshop_lib/launching/launch.py",
                   "workshop_lib/launching/forklaunch.py",
                   "workshop_lib/figures/plots.py", "workshop_lib/authoring/scripts.py", "workshop_lib/scaling/cost.py"}
    assert core <= in_wheel and instruments <= in_wheel
    tooling = sorted(n for n in names if n.endswith(".py") and Path(n).stem in TOOLING)
    assert tooling == [], f"the wheel holds the course's tooling: {tooling}"
    assert not [n for n in names if n.split("/")[0] in ("tools", "docs", "tests", "notebooks")], names
