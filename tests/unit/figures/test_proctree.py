"""workshop_lib.figures.proctree: the workers' records read back, the facts printed and asserted, both trees drawn."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import matplotlib
import pytest

from workshop_lib.errors import WorkshopError
from workshop_lib.figures import proctree

matplotlib.use("Agg")


def record(rank: int, parent: int = 100, listens=(29500,), command="python -m torch.distributed.run") -> str:
    env = dict.fromkeys(proctree.SHOWN)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", GROUP_RANK="0",
               MASTER_ADDR="localhost", MASTER_PORT="29500", TORCHELASTIC_RESTART_COUNT="0")
    return f"[rank {rank}] rank {rank} of 2: " + proctree.MARK + json.dumps(
        {"pid": 200 + rank, "parent": parent, "parent_command": command, "parent_listens": list(listens), "env": env})


def test_one_node_prints_what_the_records_show_and_draws_it(capsys):
    fig = proctree.one_node(["$ torchrun ...", record(1), record(0)])  # in any order
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "torchrun is the agent: pid 100 started all 2 workers and hosts the store they joined at MASTER_PORT",
        "rank 0: RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0",
        "rank 1: RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0"]
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "torchrun = the agent" in texts and "TORCHELASTIC_RESTART_COUNT=0" in texts and "pid 201" in texts


@pytest.mark.parametrize(("records", "message"), [
    ([record(0, parent=100), record(1, parent=101)], "the workers have several parents"),
    ([record(0, listens=()), record(1, listens=())], "does not host MASTER_PORT"),
    ([record(0, command="python train.py"), record(1, command="python train.py")], "not torchrun"),
])
def test_one_node_refuses_a_tree_that_is_not_torchruns(records, message):
    with pytest.raises(AssertionError, match=message):
        proctree.one_node(records)


def test_no_record_in_the_output_is_one_line():
    with pytest.raises(WorkshopError, match=r"print proctree.worker_record\(\) in each worker"):
        proctree.read_records(["[rank 0] hello"])


@pytest.mark.parametrize("shell", ["/bin/sh", "/bin/bash"])  # `!` runs $SHELL -c: each words "not found" its own way
def test_a_torchrun_the_shell_cannot_find_is_named_with_its_fix(tmp_path, monkeypatch, shell):
    """A kernel whose environment is not on the shell's PATH (JupyterLab started as .venv/bin/jupyter lab): 01's
    `!torchrun ... | tee whoami.out` prints that torchrun was not found to the cell and leaves the file empty."""
    if not os.access(shell, os.X_OK):
        pytest.skip(f"no {shell} here")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the system's, without the environment's bin/
    ran = subprocess.run([shell, "-c", f"cd {tmp_path} && torchrun --standalone --nproc_per_node=2 whoami.py "
                          "| tee whoami.out"], capture_output=True, text=True, timeout=30)
    assert re.search(r"torchrun: (command )?not found", ran.stderr), ran.stderr  # what the cell shows
    with pytest.raises(WorkshopError) as err:
        proctree.read_records((tmp_path / "whoami.out").read_text().splitlines())
    said = str(err.value)
    assert len(said.splitlines()) == 1 and "finds no torchrun on its PATH" in said
    assert "torchrun was not found" in said and "torchrun: not found" not in said  # true whichever shell spoke
    assert f"{sys.executable} -m torch.distributed.run" in said and ". .venv/bin/activate && jupyter lab" in said
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + "/usr/bin:/bin")  # found: not the cause
    with pytest.raises(WorkshopError, match="run the torchrun cell above first"):
        proctree.read_records([])


def test_worker_record_describes_this_process_and_its_parent():
    line = proctree.worker_record()
    assert line.startswith(proctree.MARK)
    rec = json.loads(line[len(proctree.MARK):])
    assert rec["pid"] == os.getpid() and rec["parent"] == os.getppid()
    assert set(rec["env"]) == set(proctree.SHOWN)


def test_two_nodes_numbers_the_workers_node_after_node(capsys):
    fig = proctree.two_nodes(nnodes=2, nproc_per_node=2)
    assert capsys.readouterr().out == ("2 workers a node, so RANK = GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK: "
                                       "node 0 holds ranks 0, 1; "
                                       "node 1 holds ranks 2, 3\n")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "LOCAL_RANK=1\nRANK=1x2+1=3" in texts
    proctree.two_nodes(nnodes=3, nproc_per_node=4)
    assert "node 2 holds ranks 8, 9, 10, 11" in capsys.readouterr().out


def test_records_that_share_a_line_are_read_apart():
    """A plain shell's output of two ranks printing at once: one rank's record, then the other's, on one line."""
    shared = record(1) + record(0).split("] ", 1)[1]
    assert [r["env"]["RANK"] for r in proctree.read_records(["$ torchrun ...", shared])] == ["0", "1"]
