"""Each rank's end record: the learner's file and line of a raise, a kill's signal, read as fields, never as text."""

from __future__ import annotations

import inspect
import os
import signal

import pytest

from workshop_lib.launching import ends, forklaunch


def _layer_on_rank1(env):
    import torch

    if env.rank == 1:
        torch.nn.Linear(2, 2)(torch.zeros(3))  # torch raises, inside nn's frames: the record names this line
    return env.rank


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _failed(fn) -> tuple[dict, str]:
    """The one failed rank's end record of ``fn`` on 2 forked ranks, and the launch's message."""
    with pytest.raises(forklaunch.RanksFailed) as err:
        forklaunch.notebook_launch(fn, 2, timeout=60)
    end, = err.value.ends
    return end, str(err.value)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_forked_ranks_raise_is_recorded_with_the_learners_file_and_line():
    end, said = _failed(_layer_on_rank1)
    assert (end["rank"], end["how"], end["type"]) == (1, "raised", "RuntimeError"), end
    assert (end["file"], end["line"], end["function"]) == (__file__, _line_of(_layer_on_rank1, "Linear(2, 2)"),
                                                           "_layer_on_rank1"), end
    assert "torch/nn/" in end["frames"][-2][0] and end["message"] in end["detail"]  # torch's frames kept below it
    assert said.splitlines()[1] == ends.summary(end)  # the launch's line is the record's


def _killed_on_rank1(env):
    if env.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return env.rank


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_killed_rank_is_recorded_killed_with_its_signal():
    end, _ = _failed(_killed_on_rank1)
    assert (end["rank"], end["how"], end["signal"], end["code"]) == (1, "killed", "SIGKILL", -signal.SIGKILL), end
    assert ends.summary(end).startswith("rank 1 died of SIGKILL (exit code -9) without a Python error")


def _exit(code):
    raise SystemExit(code)


def test_a_scripts_exit_is_recorded_with_its_code_and_its_own_line_and_a_clean_exit_as_returned():
    with pytest.raises(SystemExit) as err:
        _exit(2)
    end = ends.record(0, err.value, within=__file__)
    assert (end["how"], end["code"], end["message"], end["line"]) == ("exit", 2, "2", _line_of(_exit, "raise")), end
    with pytest.raises(SystemExit) as err:
        _exit(0)
    assert ends.record(0, err.value)["how"] == ends.record(0, None)["how"] == "returned"


def test_one_summary_says_a_frame_by_its_file_or_by_its_line_alone_where_the_reader_has_the_file():
    with pytest.raises(KeyError) as err:
        {}["smiles"]
    end = ends.record(1, err.value, within=__file__)
    line = err.value.__traceback__.tb_lineno
    assert ends.summary(end) == f"rank 1 raised KeyError: 'smiles' (File \"{__file__}\", line {line}, in {end['function']})"
    assert ends.summary(end, by_line=True) == f"rank 1 raised KeyError (line {line}): 'smiles'"
    assert ends.summary({**end, "message": ""}, by_line=True) == f"rank 1 raised KeyError (line {line})"
    assert ends.summary(end, by_line=True, subject="make_loader") == f"make_loader raised KeyError (line {line}): 'smiles'"


def test_a_peers_echo_of_a_failure_comes_after_the_failure_even_when_it_was_recorded_first():
    """Gloo's "Connection closed by peer" on the rank left waiting, and a group timeout, are consequences: the rank
    that raised of its own is the one a verdict names, whichever record's clock came first."""
    echo = {"rank": 0, "how": "raised", "type": "RuntimeError", "time": 1.0,
            "message": "[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242"}
    timeout = {**echo, "rank": 2, "message": "Timed out waiting 6000ms for recv operation to complete"}
    culprit = {"rank": 1, "how": "raised", "type": "ValueError", "message": "bad shape", "time": 2.0}
    assert [ends.how(e) for e in (echo, timeout, culprit, None)] == ["lost", "group timeout", "raised", "stopped"]
    assert [e["rank"] for e in ends.culprits_first([echo, timeout, culprit])] == [1, 0, 2]
