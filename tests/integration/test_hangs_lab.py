"""The hang lab of notebook 05: each broken script ends in time, its diagnosis names the guilty rank and where each
rank was, and its fix runs."""

from __future__ import annotations

import re

import pytest

from workshop_lib.checks import hang_labs
from workshop_lib.checks.hang_labs import LABS
from workshop_lib.debug import hangreport
from workshop_lib.lab.build import EXERCISES, SOLUTIONS

HANGS = ["hang1_rank0_only", "hang2_uneven", "hang3_shapes", "hang4_batchnorm_eval"]


@pytest.mark.parametrize("name", list(LABS))
def test_the_broken_version_is_the_solution_with_one_line_changed(name):
    lab = LABS[name]
    solution = (SOLUTIONS / f"{name}.py").read_text().splitlines()
    broken = hang_labs.write_broken(name).read_text().splitlines()
    changed = [(a.strip(), b.strip()) for a, b in zip(solution[2:], broken[2:], strict=True) if a != b]
    assert changed == [(lab.fixed, lab.broken)]
    exercise = (EXERCISES / f"{name}.py").read_text()
    assert lab.fixed not in exercise and 'raise NotImplementedError("fill in the TODO above")' in exercise


def rank_line(said: list[str], rank: int) -> str:
    return next(line for line in said if line.strip().startswith(f"rank {rank}: "))


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_broken_lab_stops_and_its_watch_names_who_never_arrived_and_where_each_rank_is(monkeypatch, tmp_path):
    """One real broken run (lab 1). Notebook 05's replay runs every lab, broken and fixed, and asserts each one's clue."""
    record = tmp_path / "hang.json"
    monkeypatch.setenv(hangreport.RECORD_VARIABLE, str(record))  # the ranks' watch saves its block there too
    finished, output = hang_labs._launch(hang_labs.write_broken("hang1_rank0_only"), LABS["hang1_rank0_only"],
                                         hang_labs.JOB_TIMEOUT)
    assert not finished  # the group's 8 s timeout ended it, well before the job's own limit
    said = hang_labs.diagnosis(output)
    text = "\n".join(said)
    saved = hangreport.load(record)
    assert saved and saved[0]["block"] == said[:len(saved[0]["block"])], (saved, text)
    guilty = re.search(r"^never arrived: rank (\d)$", text, re.M)
    stuck = re.match(r"rank (\d) has waited \d+ s in ", said[0])
    assert guilty and stuck and stuck.group(1) != guilty.group(1), text  # the rank that waits names the other one
    assert saved[0]["waiting_for"] == [int(guilty.group(1))]
    for rank in (0, 1):  # each rank's stack, down to a file:line of the lab script
        assert re.search(r"hang1_rank0_only\.py:\d+ \w+\(\)", rank_line(said, rank)), text
    assert "the ranks' collectives first differ" in text, text
    assert not re.search(r"workshop_lib/(debug|lab|checks|scaling)/", text), text  # the tools' frames are not shown
