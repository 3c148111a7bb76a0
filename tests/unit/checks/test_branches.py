"""checks.branches: the rank test that holds a line, and a name set only under one, read from a learner's code."""

from __future__ import annotations

import pytest

from workshop_lib.checks.branches import none_on_rank, rank_condition

LOOP = '''\
def train(model, rank):
    for epoch in range(3):
        step(model)
        if rank == 0:
            evaluate(model)
            dist.barrier()
        else:
            wait()
    if dist.get_rank() == 0 and epoch:
        save(model)
    is_main = rank == 0
    if is_main:
        log()
    if model.training:
        dist.all_reduce(x)
'''


@pytest.mark.parametrize(("line", "expected"), [
    (6, (4, "rank == 0")),  # dist.barrier() in the rank-0 block
    (8, (4, "not (rank == 0)")),  # the else of the same test
    (10, (9, "dist.get_rank() == 0 and epoch")),
    (13, (12, "is_main")),  # a name that stands for a rank test
    (15, None),  # a test that does not read the rank
    (3, None),  # outside any test
])
def test_rank_condition_names_the_innermost_test_about_the_rank(line, expected):
    assert rank_condition(LOOP, line) == expected


def test_rank_condition_of_text_that_does_not_parse_is_none():
    assert rank_condition("def f(:\n", 1) is None


SNAPSHOT = '''\
def main(rank):
    report = Reporter() if rank == 0 else None
    best = Best()
    for epoch in range(2):
        snapshot = {"epoch": epoch}
        snapshot.update(run_record(best, report))
    writer = None
    if rank == 0:
        writer = Writer()
    writer.add(1)
    logger = None
    if rank == 0:
        logger = Logger()
    else:
        logger = Quiet()
    logger.log(1)
'''


@pytest.mark.parametrize(("line", "attribute", "expected"), [
    (6, "world_size", "report is None on rank 1: it is assigned only under `if rank == 0:` (line 2); create it on "
                      "every rank or use it under the same condition"),
    (10, "add", "writer is None on rank 1: it is assigned only under `if rank == 0:` (line 8; assigned at line 9); "
                "create it on every rank or use it under the same condition"),
    (16, "log", None),  # set on every rank: not the cause
])
def test_none_on_rank_names_the_name_set_only_under_a_rank_test(line, attribute, expected):
    message = f"'NoneType' object has no attribute '{attribute}'"
    assert none_on_rank(SNAPSHOT, line, message, rank=1) == expected


def test_none_on_rank_says_nothing_of_another_error():
    assert none_on_rank(SNAPSHOT, 10, "division by zero", rank=1) is None
