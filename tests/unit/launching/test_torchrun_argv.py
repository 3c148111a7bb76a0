"""launch.torchrun_argv: the project's one torchrun command line, and torchrun_command, the same line as typed."""

from __future__ import annotations

import sys

import pytest
from torch.distributed.run import get_args_parser

from workshop_lib.launching.launch import torchrun_argv, torchrun_command


@pytest.mark.parametrize(("options", "words"), [
    ({}, ["--standalone", "--nproc_per_node=2", "s.py"]),
    ({"watch": True, "args": ["--epochs", 2]}, ["--standalone", "--nproc_per_node=2", "-m", "workshop_lib.watch",
                                                "s.py", "--epochs", "2"]),
    ({"watch": ["--after", 1], "flags": ["--tee", "3"]},
     ["--standalone", "--nproc_per_node=2", "--tee", "3", "-m", "workshop_lib.watch", "--after", "1", "s.py"]),
    ({"watch": (), "module": True}, ["--standalone", "--nproc_per_node=2", "-m", "s.py"]),
    ({"standalone": False, "nnodes": 2, "rdzv": ("c10d", "node0:29500", "job1"), "flags": ["--max-restarts=1"]},
     ["--nnodes=2", "--nproc_per_node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=node0:29500", "--rdzv-id=job1",
      "--max-restarts=1", "s.py"]),
])
def test_the_line_puts_torchruns_flags_then_the_watch_then_the_script(options, words):
    argv = torchrun_argv("s.py", **options)
    assert argv == [sys.executable, "-m", "torch.distributed.run", *words]
    args = get_args_parser().parse_args(argv[3:])  # torchrun reads it as meant
    assert args.standalone == options.get("standalone", True) and args.nproc_per_node == "2"


def test_a_learners_own_flags_name_the_processes_and_the_python_is_the_callers():
    argv = torchrun_argv("m", None, standalone=False, flags=["--nproc_per_node", "1"], module=True, python="/v/python")
    assert argv == ["/v/python", "-m", "torch.distributed.run", "--nproc_per_node", "1", "-m", "m"]


def test_the_typed_form_is_quoted_for_a_shell():
    assert torchrun_command("runs/my run.py", 1, watch=True, args=["--out", "a;b"]) == (
        "torchrun --standalone --nproc_per_node=1 -m workshop_lib.watch 'runs/my run.py' --out 'a;b'")


def test_several_nodes_cannot_be_standalone():
    with pytest.raises(AssertionError, match="several nodes name theirs"):
        torchrun_argv("s.py", nnodes=2)
