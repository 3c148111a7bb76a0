"""The ranks' sequences of collectives, rebuilt from hand-made hang-watch records, and their figure."""

from __future__ import annotations

import matplotlib
import pytest

from workshop_lib.debug import collectives
from workshop_lib.figures import sequences


def call(op, n, seq=None, tensors="float32[1]", where="train-cell:12 in train()"):
    """An entry of a rank's record of calls (collectives.entry), as its answer holds it."""
    return {"kind": collectives.kind_of(op), "name": op, "n": n, "seq": seq, "tensors": tensors, "t": 0.0,
            "where": where}


FORWARD = call("DDP.forward", 1, 1, "broadcasts 3 buffers", "train-cell:5 in train()")
GATHER = call("all_gather", 1, 2, "2 tensors", "shared-cell:20 in replica_spread(), from train-cell:10 in train()")
BACKWARDS = [call("backward", n, None, "DDP's gradient buckets", "train-cell:19 in train()") for n in range(1, 7)]


def answer(history, current):
    return {"frames": [], "history": history, "current": current}


# Lab 2's record: rank 0 is in its 6th backward(), rank 1 has run out of batches and waits in all_gather #2.
UNEVEN = [{"rank": 1, "block": [], "answers": {"0": answer([FORWARD, *BACKWARDS], BACKWARDS[-1]),
                                               "1": answer([FORWARD, *BACKWARDS[:5], GATHER], GATHER)}}]


def test_a_sequence_is_the_ranks_calls_in_order_the_one_it_waits_in_marked():
    rank0, rank1 = (sequences.sequence(a) for a in sequences.answers(UNEVEN).values())
    assert [sequences.label(c) for c in rank0] == ["DDP.forward #1"] + [f"backward() #{n}" for n in range(1, 7)]
    assert [c["waiting"] for c in rank0] == [False] * 6 + [True]  # the 6th backward is where rank 0 waits
    assert [sequences.label(c) for c in rank1][-2:] == ["backward() #5", "all_gather #2"] and rank1[-1]["waiting"]


def test_the_first_difference_is_the_first_position_where_the_calls_differ():
    seqs = {r: sequences.sequence(a) for r, a in sequences.answers(UNEVEN).items()}
    assert sequences.first_difference(seqs) == 6
    assert sequences.describe(UNEVEN) == (
        "the ranks' calls first differ at call 7: rank 0 backward() #6 at train-cell:19 in train(), "
        "rank 1 all_gather #2 at shared-cell:20 in replica_spread(), from train-cell:10 in train()")
    same = {0: [call("all_reduce", 1, 1)], 1: [call("all_reduce", 1, 1)]}
    assert sequences.first_difference(same) is None
    shapes = {0: [call("all_reduce", 1, 1, "float32[2]")], 1: [call("all_reduce", 1, 1)]}
    assert sequences.first_difference(shapes) == 0  # the same op with other tensors differs too


def test_long_agreeing_beginnings_are_folded_into_one_row():
    # a forward's broadcast before each backward; rank 1's 8th numbered call is another one
    many = [c for n in range(1, 9) for c in (call("DDP.forward", n, n), call("backward", n))][:-1]
    gather = GATHER | {"seq": 8}
    record = {"answers": {"0": answer(many, many[-1]), "1": answer([*many[:-1], gather], gather)}}
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
