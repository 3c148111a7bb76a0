"""``python -m tools.site`` for a learner who installed only the lab extra: one line naming the docs extra."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

# As `python -m tools.site` runs, in a Python where sphinx cannot be imported (None in sys.modules makes
# `import sphinx` raise ModuleNotFoundError, as in a venv without the docs extra).
WITHOUT_SPHINX = """
import runpy, sys
sys.modules["sphinx"] = None
sys.argv = ["tools.site", "--out", sys.argv[1]]
runpy.run_module("tools.site", run_name="__main__", alter_sys=True)
"""


@pytest.mark.timeout(60)
def test_without_the_docs_extra_the_site_command_names_it_in_one_line_and_fails(tmp_path):
    proc = subprocess.run([sys.executable, "-c", WITHOUT_SPHINX, str(tmp_path / "html")], cwd=REPO,
                          capture_output=True, text=True, timeout=50)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == ('error: the site needs the docs extra (sphinx not installed): pip install -e ".[docs]", '
                           'then run this again\n'), proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "html").exists()


def test_with_the_docs_extra_nothing_is_missing():
    from tools import site

    assert site.missing_docs_extra() == []  # the dev install, which includes docs
