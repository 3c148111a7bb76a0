"""environment.yml agrees with pyproject.toml, and every set-up command installs the torch they allow.

conda's environment holds the packages of the dependencies and of the lab extra, with the same constraints (one
torch constraint for both), then pip adds the package with the dev extra, as the README's one command does.
"""

from __future__ import annotations

import re
import sys

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from tests.conftest import REPO

CONDA_NAMES = {"pytorch": "torch"}  # conda-forge's name -> PyPI's


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")  # pytest brings tomli on 3.10
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def environment() -> dict:
    return yaml.safe_load((REPO / "environment.yml").read_text())


def _spec(requirement: str) -> tuple[str, str]:
    """'pytorch>=2.13,<2.14' -> ('torch', '<2.14,>=2.13'): PyPI's name and the constraint, in one order."""
    req = Requirement(requirement)
    return CONDA_NAMES.get(req.name, req.name).lower(), str(req.specifier)


def conda_packages() -> dict[str, str]:
    """environment.yml's conda packages (pip's list aside), by PyPI's name."""
    return dict(_spec(d) for d in environment()["dependencies"] if isinstance(d, str) and d != "pip")


def test_the_conda_environment_holds_the_dependencies_and_the_lab_extra_with_the_same_constraints():
    project = pyproject()
    wanted = dict(_spec(r) for r in [*project["dependencies"], *project["optional-dependencies"]["lab"]])
    conda = conda_packages()
    assert conda.pop("python") == project["requires-python"]
    assert conda == wanted  # torch among them: one constraint, in both files


def test_pip_adds_the_package_with_the_dev_extra_as_the_readme_does():
    pip = next(d["pip"] for d in environment()["dependencies"] if isinstance(d, dict))
    assert pip == ['-e ".[dev]"']


@pytest.mark.parametrize("where", ["README.md", ".ci/run", "docs/setup.md", "tools/selftest.py"])
def test_every_set_up_command_pins_a_torch_that_pyproject_allows(where):
    torch = Requirement(next(r for r in pyproject()["dependencies"] if r.startswith("torch")))
    pins = re.findall(r"pip install (?:--[\w-]+ )*torch==([\w.]+) -e \\?\"\.\[(\w+)\]\\?\"", (REPO / where).read_text())
    assert pins, f"{where} has no set-up command pip install torch==X -e \".[extra]\""
    extras = set(pyproject()["optional-dependencies"])
    for version, extra in pins:
        assert Version(version) in torch.specifier, f"{where} installs torch {version}; pyproject allows {torch}"
        assert extra in extras, f"{where} installs the extra {extra!r}; pyproject.toml has {sorted(extras)}"
