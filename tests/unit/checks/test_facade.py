"""workshop_lib.check: the notebooks' one name for the lab's checks, each found in the module of its idea."""

from __future__ import annotations

import importlib
import re

import nbformat
import pytest

from tests.conftest import REPO
from workshop_lib import check

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
CALL = re.compile(r"\bcheck\.(\w+)\(")
NAMED = re.compile(r"\bcheck\.([A-Za-z_]\w*)")  # any name a cell or the prose reads from the facade


@pytest.mark.parametrize("name", sorted(check.CHECKS))
def test_every_check_is_the_function_of_its_module(name):
    module, function = check.CHECKS[name]
    found = getattr(check, name)
    assert callable(found) and found is getattr(importlib.import_module(f"workshop_lib.{module}"), function)
    assert name in dir(check)


def test_every_check_a_notebook_calls_is_in_the_facade_and_comes_through_it():
    called = set()
    for path in NOTEBOOKS:
        code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        names = set(CALL.findall(code))
        assert not re.search(r"from workshop_lib\.checks import", code), f"{path.name} imports a check module itself"
        if names:
            assert "from workshop_lib import check" in code, path.name
        called |= names
    assert called - set(check.CHECKS) == set()
    assert set(check.CHECKS) - called == set(), "a check no notebook calls: delete it, or call it"


def test_an_unknown_check_is_one_line_naming_the_checks():
    with pytest.raises(AttributeError, match=r"workshop_lib.check has no check 'shard'; the checks are .*shards"):
        check.shard  # noqa: B018 (the attribute read is the test)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_name_a_notebook_reads_from_the_facade_is_there(path):
    """Not only the calls: a constant a check cell passes (03's run names) or the prose names (06's MLP) resolves."""
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells)
    for name in sorted(set(NAMED.findall(text)) - {"py"}):  # `workshop_lib/check.py`, a file the prose names
        assert getattr(check, name) is not None, name


@pytest.mark.parametrize("name", sorted(check.NAMES))
def test_every_name_is_read_by_a_notebook(name):
    text = "\n".join(c.source for p in NOTEBOOKS for c in nbformat.read(p, as_version=4).cells)
    assert f"check.{name}" in text, f"check.{name} is in the facade, and no notebook reads it"
