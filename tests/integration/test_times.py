"""Every stated time agrees with the count (tools/budget.py); a room's pace is calibrated; the plans fit their sessions.

Two times per notebook and section. Alone: the count, markdown words/150 + code lines/15 + 8 min per exercise +
reading + figures + commands + the cells' measured run time, as the headings and first cells state it. In a room:
teaching and exercise minutes at ``budget.ROOM``'s pace, as the notebooks' metadata states them. A stated time may
be off by a third of its count (after rounding to whole minutes), no more; a section states 1 min at least (of
teaching, in a room).
"""

from __future__ import annotations

import re

import pytest

from tools import ROOT, budget, build
from tools.site import lab_site

CORE = ("00_", "01_", "02_", "03_")


def counts() -> list[budget.Count]:
    return [budget.count(path) for path in build.source_notebooks()]


def room() -> dict[str, tuple[int, int]]:
    """Each notebook's (teaching, exercises) minutes, as its metadata states them."""
    return budget.stated_rooms(counts())


@pytest.mark.parametrize("path", build.source_notebooks(), ids=lambda p: p.name)
def test_each_notebook_and_section_states_the_time_it_counts(path):
    c = budget.count(path)
    wrong = [why for why in [c.off()] + [part.off() for part in c.parts] if why]
    assert not wrong, f"{path.name}: " + "; ".join(wrong) + " (python -m tools.build --times)"


@pytest.mark.parametrize("path", build.source_notebooks(), ids=lambda p: p.name)
def test_each_notebook_and_section_states_a_rooms_teaching_and_exercise_minutes_as_counted(path):
    c = budget.count(path)
    wrong = c.room_off() + [why for part in c.parts for why in part.room_off()]
    assert not wrong, (f"{path.name}: " + "; ".join(wrong) + " (python -m tools.build --times; "
                       "--times --restate writes the counted minutes into the metadata)")


# 00 to 03 as rooms took them (issue 41: a room of 20 PyTorch users, at its slower quarter), counted at 7d280d4:
# (words, code lines, exercises, run s, figures, commands) of what the room works through, the same of the sections
# on the projector, the minutes at the board the metadata states, and the minutes the room took.
OBSERVED = {
    "00_baseline": ((313, 60, 0, 4.7, 0, 0), (0, 0, 0, 0.0, 0, 0), 3, (12, 15)),
    "01_process_group": ((575, 94, 4, 12.3, 2, 1), (58, 1, 0, 2.3, 0, 0), 8, (60, 70)),
    "02_distributed_sampler": ((390, 79, 3, 8.7, 1, 0), (0, 0, 0, 0.0, 0, 0), 4, (40, 45)),
    "03_ddp": ((539, 55, 2, 7.8, 0, 1), (226, 16, 0, 17.9, 2, 0), 8, (40, 45)),
}


def _counted(fields: tuple) -> budget.Count:
    words, code, exercises, run_s, figures, commands = fields
    return budget.Count("", words=words, code_lines=code, exercises=exercises, run_s=run_s, figures=figures,
                        commands=commands)


@pytest.mark.parametrize("name", OBSERVED)
def test_a_rooms_pace_gives_what_rooms_took(name):
    learners, shown, board, (low, high) = OBSERVED[name]
    teaching, exercises = budget.room_minutes(_counted(learners))
    teaching += budget.room_minutes(_counted(shown), budget.ROOM.projector)[0] + board
    assert low <= round(teaching + exercises) <= high, (
        f"{name}: budget.ROOM gives {teaching + exercises:.1f} min where rooms took {low}-{high}")


def test_the_pace_is_not_one_newcomers():
    """The count alone (one newcomer) falls short of what rooms took: the pace is not a factor of 1."""
    learners, _, _, (low, _) = OBSERVED["01_process_group"]
    assert _counted(learners).minutes < low - 10 and budget.ROOM.reading > 1


def test_the_core_path_keeps_its_exercises():
    core = [c for c in counts() if c.title.startswith(CORE)]
    assert [c.title[:3] for c in core] == list(CORE)
    distributed = sum(c.exercises for c in core if not c.title.startswith("00"))  # 00 is a tour of the baseline
    # 8 since issue 47: step 1's all-reduce check and its finally are given, with their reason (01's setup, the device
    # and the group, stays two exercises); 10 did not fit three hours with a break every hour and 20 min of buffer
    assert distributed >= 8, f"01 to 03 hold {distributed} exercises that write distributed lines, fewer than 8"


def test_the_plans_are_a_three_hour_session_and_a_full_day():
    three, day = budget.THREE_HOURS, budget.FULL_DAY
    assert (three.minutes, three.notebooks(), three.before) == (180, ["01_", "02_", "03_"], ("00_",))
    assert day.notebooks() == ["00_", "01_", "02_", "03_", "04a_", "05_"] and 7 * 60 <= day.minutes <= 9 * 60
    assert any("lunch" in b[1] for b in day.blocks if isinstance(b, tuple))


def test_the_pre_work_takes_ten_minutes_at_most():
    for prefix in budget.THREE_HOURS.before:
        c = next(c for c in counts() if c.title.startswith(prefix))
        assert round(c.minutes) <= 10 and c.stated <= 10, (
            f"{c.title}, the 3-hour session's pre-work, counts {c.minutes:.1f} min alone (states {c.stated}): at most 10")


@pytest.mark.parametrize("plan", budget.PLANS, ids=lambda p: p.name)
def test_each_plan_keeps_a_break_every_hour_and_twenty_minutes_of_buffer(plan):
    rows = budget.plan_rows(plan, room())
    assert sum(m for _, m, _ in rows) == plan.minutes and rows[0][0] == 0
    teaching, exercises, buffer = budget.plan_sums(plan, room())
    assert not budget.plan_faults(plan, room()), (
        f"the {plan.name} ({teaching} min teaching, {exercises} min exercises): " + "; ".join(budget.plan_faults(
            plan, room())) + " (python -m tools.build --times)")
    assert buffer >= budget.MIN_BUFFER and all(m <= budget.MAX_STRETCH for _, m in budget.stretches(plan, room()))
    shared = sum(int(m) for _, _, what in rows for m in re.findall(r"(\d+) min of buffer", what))
    assert shared == buffer


def test_the_three_hour_session_breaks_before_03():
    blocks = budget.THREE_HOURS.blocks
    assert budget.is_rest(blocks[blocks.index("03_") - 1]), "the 3-hour session has no break right before 03"


def test_the_strict_count_of_the_three_hour_sessions_notebooks_is_105_minutes_at_most():
    taught = [c for c in counts() if c.title.startswith(tuple(budget.THREE_HOURS.notebooks()))]
    assert budget.strict(taught) <= 105, (
        f"01-03's strict count (words/150 + code lines/15 + 8 min per exercise + 1 min per figure) is "
        f"{budget.strict(taught):.1f} min, over 105")


def test_a_plan_without_a_break_for_over_an_hour_or_with_little_buffer_is_faulted():
    long_haul = budget.Plan("long haul", 180, ((5, "welcome"), "01_", "02_", (10, "break"), "03_"))
    faults = budget.plan_faults(long_haul, room())
    assert any("without a break, more than 60" in f for f in faults), faults
    split = budget.Plan("split", 180, ((5, "welcome"), "01_", (10, "break"), "02_", (10, "break"), "03_"))
    assert not any("without a break" in f for f in budget.plan_faults(split, room()))
    tight = budget.Plan("tight", sum(sum(room()[n]) for n in room() if n.startswith(("01_", "02_"))) + 10 + 5,
                        ((5, "welcome"), "01_", (10, "break"), "02_"))
    assert budget.plan_sums(tight, room())[2] == 0
    assert any("fewer than 20" in f for f in budget.plan_faults(tight, room()))


def test_a_notebook_in_parts_is_the_whole_notebook_between_breaks():
    whole = budget.Plan("whole", 300, ("04a_",))
    parts = budget.Plan("parts", 310, ("04a_ §1-3", (10, "break"), "04a_ §4-"))
    assert budget.plan_sums(parts, room()) == budget.plan_sums(whole, room())
    rows = budget.plan_rows(parts, room())
    assert rows[0][2].startswith("04a_patterns §1-3:") and rows[2][2].startswith("04a_patterns from §4:")
    sections = dict(budget._sections("04a_patterns"))
    later = tuple(sum(sections[n][i] for n in sections if n is None or n >= 4) for i in (0, 1))
    assert re.search(rf": {later[0]} min teaching, {later[1]} min exercises", rows[2][2]), rows[2][2]
    assert [start for start, _ in budget.stretches(parts, room())] == [0, rows[2][0]]


def test_a_terminal_step_written_in_markdown_counts_as_a_command():
    """04a's restart demo and 05's third lab are typed in a terminal from the markdown: counted as cmd cells are."""
    by_title = {c.title: c for c in counts()}
    assert next(p for p in by_title["04a_patterns"].parts if p.title.startswith("4.")).commands >= 3
    assert next(p for p in by_title["05_when_it_hangs"].parts if p.title.startswith("4.")).commands >= 2


def test_a_plan_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="do not fit"):
        budget.plan_rows(budget.Plan("hour", 60, ("01_", "02_")), room())


def test_build_times_prints_each_notebooks_room_minutes_and_both_plans(capsys):
    build.main(["--times"])
    out = capsys.readouterr().out
    for c in counts():
        assert re.search(rf"^{re.escape(c.title)} +{c.stated_room[0]} +[\d.]+ +{c.stated_room[1]} +[\d.]+$", out,
                         re.M), f"--times prints no room row for {c.title}"
    for plan in budget.PLANS:
        teaching, exercises, buffer = budget.plan_sums(plan, room())
        assert (f"{plan.name} ({plan.minutes} min" in out and f"{teaching} min teaching + {exercises} min exercises"
                in out and f"{buffer} min of buffer" in out), f"--times does not print the {plan.name}'s sums"


def test_the_instructors_plans_are_the_budgets():
    for which in budget.PLANS:
        rows = lab_site.plan(which)
        assert [m for _, m, _ in rows] == [m for _, m, _ in budget.plan_rows(which, room())]


def test_the_readme_schedule_states_what_the_notebooks_state():
    readme = (ROOT / "README.md").read_text()
    for c in counts():
        row = re.search(rf"^\| `{re.escape(c.title)}` \|.*\| (\d+) min \| (\d+) min \| ~(\d+) min \|", readme, re.M)
        assert row, f"README.md's schedule has no row for {c.title} ending in '| T min | X min | ~N min |'"
        said = tuple(int(g) for g in row.groups())
        assert said == (*c.stated_room, c.stated), f"README.md says {c.title} takes {said}; it says " \
                                                   f"{(*c.stated_room, c.stated)} (teaching, exercises, alone)"


def test_the_readme_states_the_plans_sums():
    readme = " ".join((ROOT / "README.md").read_text().split())
    teaching, exercises, buffer = budget.plan_sums(budget.THREE_HOURS, room())
    assert (f"01 to 03: {teaching} min teaching, {exercises} min exercises, "
            f"{180 - teaching - exercises - buffer} min of welcome, two breaks and wrap-up, {buffer} min of buffer"
            in readme), "README.md's sentence on the three-hour session no longer states budget.plan_sums"
    assert f"({budget.plan_sums(budget.FULL_DAY, room())[2]} min of buffer)" in readme, \
        "README.md's sentence on the full day no longer states its buffer"


def test_a_plan_leaves_out_the_sections_it_cuts_and_says_so():
    whole = budget.Plan("whole", 180, ("01_", "03_"))
    cut = budget.Plan("cut", 180, ("01_", "03_"), cut=(("03_", "5."),))
    section = next(c for c in counts() if c.title.startswith("03_")).parts[4]
    assert section.title.startswith("5. On the projector")
    (t0, x0, b0), (t1, x1, b1) = budget.plan_sums(whole, room()), budget.plan_sums(cut, room())
    assert (t0 - t1, x0 - x1, b1 - b0) == (section.stated_room[0], section.stated_room[1], section.stated_room[0])
    assert "03_ddp (without §5):" in budget.plan_rows(cut, room())[1][2]
    with pytest.raises(ValueError, match=r"cuts section 9\. of 03_"):
        budget.plan_sums(budget.Plan("bad", 180, ("03_",), cut=(("03_", "9."),)), room())
