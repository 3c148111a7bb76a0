"""How pytest-xdist shares the suite between its two workers (``-n 2 --dist loadfile`` in pyproject.toml).

Each file runs on one worker, in order: a notebook's cells share its kernel.
Notebooks 00 to 03 run on one worker, one after the other, since 02 and 03
plot the runs that the notebooks before them made (a fresh clone has no other).
"""

from __future__ import annotations

import pytest

_IN_ORDER = ("notebooks/00_", "notebooks/01_", "notebooks/02_", "notebooks/03_")


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class NotebooksInOrder(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "notebooks 00-03" if nodeid.startswith(_IN_ORDER) else super()._split_scope(nodeid)

    return NotebooksInOrder(config, log)
