"""Every stated time agrees with the count (lab/budget.py), the core path fits a 3-hour lab, the README agrees.

The count: markdown words/150 + code lines/15 + 4 min per exercise + the cells' measured run time. A
stated time may be off by a third of the count (after rounding to whole minutes), no more.
"""

from __future__ import annotations

import re

import pytest

from workshop_lib.lab import budget, build
from workshop_lib.paths import REPO_ROOT

CORE = ("00_", "01_", "02_", "03_")  # the 3-hour lab: about 2 hours of work, an hour for set-up, talk, a break


def counts() -> list[budget.Count]:
    return [budget.count(path) for path in build.source_notebooks()]


@pytest.mark.parametrize("path", build.source_notebooks(), ids=lambda p: p.name)
def test_each_notebook_and_section_states_the_time_it_counts(path):
    c = budget.count(path)
    wrong = [why for why in [c.off()] + [part.off() for part in c.parts] if why]
    assert not wrong, f"{path.name}: " + "; ".join(wrong) + " (python -m workshop_lib.build --times)"


def test_the_core_path_fits_the_lab():
    core = [c for c in counts() if c.title.startswith(CORE)]
    assert [c.title[:3] for c in core] == list(CORE)
    minutes = sum(c.minutes for c in core)
    exercises = sum(c.exercises for c in core)
    assert minutes <= 100, f"00 to 03 count {minutes:.0f} min, more than 100"
    assert exercises >= 10, f"00 to 03 hold {exercises} exercises, fewer than 10"


def test_the_readme_schedule_states_what_the_notebooks_state():
    readme = (REPO_ROOT / "README.md").read_text()
    for c in counts():
        row = re.search(rf"^\| `{re.escape(c.title)}` \|.*\| ~(\d+) min \|", readme, re.M)
        assert row, f"README.md's schedule has no row for {c.title} ending in '| ~N min |'"
        assert int(row.group(1)) == c.stated, f"README.md says {c.title} takes ~{row.group(1)} min; it says {c.stated}"
