"""Every stated time agrees with the count (tools/budget.py), the core path fits a 3-hour lab, the README agrees.

The count: markdown words/150 + code lines/15 + 8 min per exercise + reading + the cells' measured run time. A
stated time may be off by a third of the count (after rounding to whole minutes), no more; a section states
1 min at least.
"""

from __future__ import annotations

import re

import pytest

from tools import ROOT, budget, build
from tools.site import lab_site

CORE = ("00_", "01_", "02_", "03_")  # the 3-hour lab: about 2 hours of work, an hour for set-up, talk, a break


def counts() -> list[budget.Count]:
    return [budget.count(path) for path in build.source_notebooks()]


@pytest.mark.parametrize("path", build.source_notebooks(), ids=lambda p: p.name)
def test_each_notebook_and_section_states_the_time_it_counts(path):
    c = budget.count(path)
    wrong = [why for why in [c.off()] + [part.off() for part in c.parts] if why]
    assert not wrong, f"{path.name}: " + "; ".join(wrong) + " (python -m tools.build --times)"


def test_the_core_path_fits_the_lab():
    core = [c for c in counts() if c.title.startswith(CORE)]
    assert [c.title[:3] for c in core] == list(CORE)
    minutes = sum(c.minutes for c in core)
    distributed = sum(c.exercises for c in core if not c.title.startswith("00"))  # 00 is a tour of the baseline
    assert minutes <= 110, f"00 to 03 count {minutes:.0f} min, more than the 110 a 3-hour session leaves for the lab"
    assert distributed >= 9, f"01 to 03 hold {distributed} exercises that write distributed lines, fewer than 9"


def test_the_readme_schedule_states_what_the_notebooks_state():
    readme = (ROOT / "README.md").read_text()
    for c in counts():
        row = re.search(rf"^\| `{re.escape(c.title)}` \|.*\| ~(\d+) min \|", readme, re.M)
        assert row, f"README.md's schedule has no row for {c.title} ending in '| ~N min |'"
        assert int(row.group(1)) == c.stated, f"README.md says {c.title} takes ~{row.group(1)} min; it says {c.stated}"


def test_the_instructors_plan_keeps_ten_minutes_of_buffer():
    """3 hours: the welcome, the break, the wrap-up, a talk per notebook, the stated times, the projector's minutes."""
    rows = lab_site.plan()
    buffer = sum(int(m) for _, _, what in rows for m in re.findall(r"(\d+) min of buffer", what))
    assert buffer >= 10, f"the 3-hour plan keeps {buffer} min of buffer, fewer than 10: {rows}"
