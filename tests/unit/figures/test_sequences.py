"""The ranks' sequences of collectives, rebuilt from hand-made hang-watch records, and their figure."""

from __future__ import annotations

import matplotlib
import pytest

from workshop_lib.figures import sequences
from workshop_lib.figures.sequences import Step


def call(op, seq, backwards, tensors="float32[1]", where="train-cell:12 in train()"):
    return {"op": op, "seq": seq, "tensors": tensors, "since": 0.0, "where": where, "gpu": False,
            "backwards": backwards}


FORWARD = call("DDP.forward", 1, 0, "broadcasts 3 buffers", "train-cell:5 in train()")
GATHER = call("all_gather", 2, 5, "2 tensors", "shared-cell:20 in replica_spread(), from train-cell:10 in train()")
BACKWARD_6 = call("backward", 0, 6, "DDP's gradient buckets", "train-cell:19 in train()")


def answer(history, backwards, current):
    return {"frames": [], "history": history, "backwards": backwards, "current": current}


# Lab 2's record: rank 0 is in its 6th backward(), rank 1 has run out of batches and waits in all_gather #2.
UNEVEN = [{"rank": 1, "block": [], "answers": {"0": answer([FORWARD], 6, BACKWARD_6),
                                               "1": answer([FORWARD, GATHER], 5, GATHER)}}]


def test_a_sequence_puts_the_backward_calls_between_the_collectives():
    rank0, rank1 = (sequences.sequence(a) for a in sequences.answers(UNEVEN).values())
    assert [s.name() for s in rank0] == ["DDP.forward #1"] + [f"backward() #{n}" for n in range(1, 7)]
    assert [s.waiting for s in rank0] == [False] * 6 + [True]  # the 6th backward is where rank 0 waits
    assert rank0[-1].where == "train-cell:19 in train()"
    assert [s.name() for s in rank1][-2:] == ["backward() #5", "all_gather #2"] and rank1[-1].waiting


def test_backward_calls_before_the_first_collective_count_from_the_start():
    """A rank whose first numbered collective came after five backward() calls: they are all known."""
    late = GATHER | {"seq": 1}
    steps = sequences.sequence(answer([late], 5, late))
    assert [s.name() for s in steps] == [f"backward() #{n}" for n in range(1, 6)] + ["all_gather #1"]
    cut = sequences.sequence(answer([late | {"seq": 65}], 5, late))  # older calls forgotten: from the oldest kept
    assert [s.name() for s in cut] == ["all_gather #65"]


def test_the_first_difference_is_the_first_position_where_the_calls_differ():
    seqs = {r: sequences.sequence(a) for r, a in sequences.answers(UNEVEN).items()}
    assert sequences.first_difference(seqs) == 6
    assert sequences.describe(UNEVEN) == (
        "the ranks' calls first differ at call 7: rank 0 backward() #6 at train-cell:19 in train(), "
        "rank 1 all_gather #2 at shared-cell:20 in replica_spread(), from train-cell:10 in train()")
    same = {0: [Step("all_reduce", 1, "float32[1]", "a")], 1: [Step("all_reduce", 1, "float32[1]", "a")]}
    assert sequences.first_difference(same) is None
    shapes = {0: [Step("all_reduce", 1, "float32[2]", "a")], 1: [Step("all_reduce", 1, "float32[1]", "a")]}
    assert sequences.first_difference(shapes) == 0  # the same op with other tensors differs too


def test_long_agreeing_beginnings_are_folded_into_one_row():
    many = [call("DDP.forward", n, n - 1) for n in range(1, 9)]  # a forward's broadcast before each backward
    gather = GATHER | {"seq": 8, "backwards": 7}  # rank 1's 8th collective is another one
    record = {"answers": {"0": answer(many, 7, many[-1]), "1": answer([*many[:-1], gather], 7, gather)}}
    rows = sequences._rows({r: sequences.sequence(a) for r, a in sequences.answers(record).items()})
    kinds = [kind for kind, _ in rows]
    assert kinds[0] == "folded" and kinds.count("differ") == 1 and len(rows) <= sequences.FOLD + 1
    assert len(rows[0][1]) + sum(len(c) for k, c in rows[1:-1]) == 14  # every agreed call is in a row


def test_a_record_without_answers_is_refused():
    with pytest.raises(ValueError, match="no rank's answer"):
        sequences.answers([{"rank": 0, "block": ["..."]}])


def test_draw_shows_the_figure_and_prints_the_first_difference(capsys):
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    assert sequences.draw(UNEVEN) is None
    assert capsys.readouterr().out.strip() == sequences.describe(UNEVEN)
    texts = [t.get_text() for t in plt.gcf().axes[0].texts]
    assert "first difference" in texts and any(t.startswith("backward() ×5") for t in texts)
    plt.close("all")
