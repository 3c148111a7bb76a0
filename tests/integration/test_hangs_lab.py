"""The hang lab of notebook 05: each broken script ends in time, its diagnosis names the guilty rank and where each
rank was, and its fix runs."""

from __future__ import annotations

import re
import threading
import time

import pytest

from workshop_lib.checks import hang_labs
from workshop_lib.checks.hang_labs import LABS
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


@pytest.fixture(scope="module")
def broken_runs():
    """Every broken lab, all launched at once (their waits overlap): {name: (finished, seconds, output)}."""
    runs = {}

    def run(name):
        start = time.monotonic()
        finished, output = hang_labs._launch(hang_labs.write_broken(name), LABS[name], hang_labs.JOB_TIMEOUT)
        runs[name] = (finished, time.monotonic() - start, output)

    threads = [threading.Thread(target=run, args=(name,)) for name in LABS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return runs


def rank_line(said: list[str], rank: int) -> str:
    return next(line for line in said if line.strip().startswith(f"rank {rank}: "))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", HANGS)
def test_a_broken_lab_ends_in_time_and_says_who_never_arrived_and_where_each_rank_is(broken_runs, name):
    finished, seconds, output = broken_runs[name]
    said = hang_labs.diagnosis(output)
    assert not finished and seconds < hang_labs.JOB_TIMEOUT, (seconds, output[-40:])
    text = "\n".join(said)
    guilty = re.search(r"^never arrived: rank (\d)$", text, re.M)
    assert guilty, text
    stuck = re.match(r"rank (\d) has waited \d+ s in ", said[0])
    assert stuck and stuck.group(1) != guilty.group(1), text  # the rank that waits names the other one
    for rank in (0, 1):  # each rank's stack, down to a file:line
        assert re.search(r"\.py:\d+ \w+\(\)", rank_line(said, rank)), text
    script_lines = {"hang1_rank0_only": "hang1_rank0_only.py:", "hang2_uneven": "train.py:",
                    "hang3_shapes": "hang3_shapes.py:", "hang4_batchnorm_eval": "predict()"}
    assert script_lines[name] in text, text


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_unused_parameter_lab_fails_on_both_ranks_with_the_line_of_the_forward(broken_runs):
    finished, seconds, output = broken_runs["hang5_unused"]
    assert not finished and seconds < hang_labs.JOB_TIMEOUT
    ended = hang_labs.errors(output)
    assert set(ended) == {0, 1} and all("finished reduction" in e for e in ended.values()), ended
    for rank in (0, 1):
        assert any(line.startswith(f"[rank {rank}]") and "train.py\", line" in line for line in output), output[-40:]


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("name", ["hang2_uneven"])
def test_the_fixed_lab_finishes(name, capsys):
    assert hang_labs.check_fix(name, script=SOLUTIONS / f"{name}.py")
    assert "✓ the job finished on both ranks: done:" in capsys.readouterr().out
