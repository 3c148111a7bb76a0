"""What runs on some ranks alone, read from a script's text: the rank conditions a learner writes, and the rest."""

from __future__ import annotations

import pytest

from workshop_lib.engine import branches, source

SCRIPT = """\
import os
import torch.distributed as dist

def main(cfg):
    rank = dist.get_rank()
    is_main = rank == 0
    resume_from = to_resume(cfg, rank)
    report = Reporter(cfg) if rank == 0 else None
    if resume_from is not None:
        load(resume_from)
    for epoch in range(cfg.epochs):
        train()
        if rank == 0:
            evaluate()
            if epoch > 2:
                dist.barrier()
        else:
            idle()
        if is_main:
            save()
        if dist.get_rank() == 1:
            one()
        if int(os.environ["RANK"]) > 0:
            others()
        if epoch > 0:
            report.epoch(epoch)
"""


def at(text: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.splitlines(), 1) if text in line)


@pytest.mark.parametrize(("line", "expected"), [
    ("evaluate()", (at("if rank == 0:"), "rank == 0")),
    ("dist.barrier()", (at("if rank == 0:"), "rank == 0")),  # the innermost if about the rank, not `epoch > 2`
    ("idle()", (at("if rank == 0:"), "not (rank == 0)")),  # the else branch: the other ranks alone
    ("save()", (at("if is_main:"), "is_main")),  # a name assigned from a test of the rank
    ("one()", (at("if dist.get_rank() == 1:"), "dist.get_rank() == 1")),
    ("others()", (at("if int(os.environ"), "int(os.environ['RANK']) > 0")),
    ("Reporter(cfg)", (at("Reporter(cfg)"), "rank == 0")),  # a conditional expression
    ("train()", None),
    ("load(resume_from)", None),  # a call given the rank is not the rank: resume_from is every rank's
    ("report.epoch(epoch)", None),  # `if epoch > 0:` is about the epoch
    ("if rank == 0:", None),  # the test itself runs on every rank
], ids=["if_rank", "innermost", "else", "is_main", "get_rank", "environ", "if_expression", "every_rank",
        "given_the_rank", "not_the_rank", "the_test"])
def test_rank_condition_is_the_innermost_if_about_the_rank(line, expected):
    assert branches.rank_condition(SCRIPT, at(line)) == expected


def test_a_name_set_only_under_a_rank_condition_is_found_from_the_line_that_reads_it():
    line = at("report.epoch(epoch)")
    assert branches.names_read(SCRIPT, line) == ["report", "epoch"]
    assert branches.set_under_rank(SCRIPT, line, "report") == (at("Reporter(cfg)"), "rank == 0")
    assert branches.set_under_rank(SCRIPT, line, "resume_from") is None
    assert branches.set_under_rank(SCRIPT, line, "epoch") is None  # the loop sets it on every rank


def test_a_loops_exit_under_a_rank_condition_is_found():
    early = SCRIPT.replace("            evaluate()\n", "            evaluate()\n            break\n")
    assert branches.rank_exit(SCRIPT) is None
    assert branches.rank_exit(early) == ("break", at("evaluate()") + 1, "rank == 0", at("if rank == 0:"))


def test_a_script_that_does_not_parse_has_no_conditions():
    assert branches.rank_condition("if rank == 0\n    x()\n", 2) is None
    assert branches.names_read("x(", 1) == []


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
def test_rank_condition_of_a_loop_names_the_innermost_test_about_the_rank(line, expected):
    assert branches.rank_condition(LOOP, line) == expected


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
    (6, "world_size", "report is None on rank 1, set only where `rank == 0` holds (line 2): run line 6 under the "
                      "same condition, or create report on every rank"),
    (10, "add", "writer is None on rank 1, set only where `rank == 0` holds (line 8): run line 10 under the same "
                "condition, or create writer on every rank"),
    (16, "log", None),  # set on every rank: not the cause
])
def test_unset_on_rank_names_the_name_set_only_under_a_rank_test(line, attribute, expected):
    message = f"'NoneType' object has no attribute '{attribute}'"
    assert branches.unset_on_rank(SNAPSHOT, line, "AttributeError", message, rank=1) == expected


def test_unset_on_rank_says_nothing_of_another_error():
    assert branches.unset_on_rank(SNAPSHOT, 10, "ZeroDivisionError", "division by zero", rank=1) is None


GATHERED = '''def stop_early(loss, rank, world_size):
    losses = [torch.zeros(1) for _ in range(world_size)] if rank == 0 else None
    dist.gather(loss, losses, dst=0)
    if rank == 0:
        print(losses)
    if losses and min(losses) < 0.1:
        return True
    return False
'''


def test_a_value_gathered_to_one_rank_and_tested_on_every_rank_is_found():
    assert branches.decided_by_received(GATHERED, 3, "gather") == ("losses", 6, "losses and min(losses) < 0.1")
    assert branches.decided_by_received(GATHERED.replace("    if losses and", "    if rank == 0 and losses and"), 3,
                                        "gather") is None  # the test reads the rank: rank 0 alone decides
    assert branches.decided_by_received(GATHERED, 3, "all_gather") is None  # every rank receives it


def test_one_rank_name_analysis_tells_the_global_rank_from_any_rank():
    """source's device_ids rule reads the same names as the rank conditions, narrowed to the global rank."""
    text = ("import os\nrank = dist.get_rank()\nlocal_rank = int(os.environ['LOCAL_RANK'])\nmain = rank == 0\n"
            "world_rank = int(os.environ['RANK'])\n")
    tree = branches.parse(text)
    assert branches.rank_names(tree) == {"rank", "local_rank", "main", "world_rank"}
    assert branches.rank_names(tree, only_global=True) == {"rank", "main", "world_rank"}
    assert source.global_rank_device_ids(text + "m = DDP(m, device_ids=[local_rank])\n") is None
    assert source.global_rank_device_ids(text + "m = DDP(m, device_ids=[world_rank])\n") == (6, "[world_rank]")
    assert source.global_rank_device_ids("m = DDP(m, device_ids=[dist.get_rank()])\n") == (1, "[dist.get_rank()]")


def test_under_rank_is_the_innermost_rank_condition_on_the_way_to_a_call():
    """The one evidence of a call on some ranks alone: the script checker's collectives and a cell's hang alike."""
    text = "def save():\n    dist.barrier()\n\nif rank == 0:\n    save()\n"
    assert branches.under_rank([(text, 2), (text, 5)]) == (5, 4, "rank == 0")  # the call's line, then its caller's
    assert branches.under_rank([(text, 2)]) is None
