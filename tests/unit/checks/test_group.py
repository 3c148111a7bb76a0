"""checks.group.process_group: both ways of joining pass (the standard env:// line and store=), device_id= is checked."""

from __future__ import annotations

import re

import pytest

from tests.unit.checks.test_notebook_checks import _solution
from workshop_lib.checks import common, group

# The solution's join, and what a learner may write instead.
STORE_FORM = ("    dist.init_process_group(backend, store=store, rank=launch.rank, world_size=launch.world_size,\n"
              "                            timeout=timedelta(seconds=cfg.timeout))\n")
GPU_ONLY = 'device if device.type == "cuda" else None'


def _joining(line: str):
    """solutions/step1's main with its init_process_group call replaced by ``line``."""
    return _solution("step1_process_group", (STORE_FORM, f"    {line}\n")).main


def test_the_store_form_passes_without_notes(capsys):
    group.process_group(_solution("step1_process_group").main)
    out = capsys.readouterr().out
    assert "joined as rank 3 of 4 on the store; left the group even when the training raised" in out
    assert "note" not in out


def test_the_standard_line_passes_and_says_what_it_leaves_out(capsys):
    group.process_group(_joining("dist.init_process_group(backend)"))
    out = capsys.readouterr().out
    assert out.startswith("\N{CHECK MARK} main: NCCL on cuda:1 as local rank 1 of a GPU node, Gloo on a CPU; joined "
                          "as rank 3 of 4 through torchrun's variables (env://)")
    assert "plain `python` (no RANK to read) and torchrun's restarts (the dead round's keys) need the store= form" in out
    assert "without timeout=, a rank waits torch's default (30 min on Gloo) for a missing peer" in out


@pytest.mark.parametrize("line", [
    f"dist.init_process_group(backend, timeout=timedelta(seconds=cfg.timeout), device_id={GPU_ONLY})",
    'dist.init_process_group(backend, "env://", timeout=timedelta(seconds=cfg.timeout))',
    "dist.init_process_group(backend, rank=launch.rank, world_size=launch.world_size, "
    "timeout=timedelta(seconds=cfg.timeout))",
    "dist.init_process_group(backend, store=store, rank=launch.rank, world_size=launch.world_size, "
    f"timeout=timedelta(seconds=cfg.timeout), device_id={GPU_ONLY})",
    "dist.init_process_group(backend, timeout=timedelta(seconds=cfg.timeout), "
    'device_id=launch.local_rank if backend == "nccl" else None)',
], ids=["env_device_id", "env_explicit", "env_rank_given", "store_device_id", "device_id_int"])
def test_every_right_way_to_join_passes(line, capsys):
    group.process_group(_joining(line))
    assert "joined as rank 3 of 4" in capsys.readouterr().out


@pytest.mark.parametrize(("line", "message"), [
    ("dist.init_process_group(backend, rank=launch.local_rank)",
     "main joined with rank=1, its local rank: pass the global rank (launch.rank), or leave rank= out under torchrun"),
    ("dist.init_process_group(backend, world_size=launch.local_world_size)",
     "as rank 3 of 4 main joined with rank=3, world_size=2: pass the launch's rank and world size"),
    ("dist.init_process_group(backend, store=store, timeout=timedelta(seconds=cfg.timeout))",
     "init_process_group got store= but not both rank= and world_size=: with a store torch needs all three"),
    ("dist.init_process_group(backend, device_id=launch.rank if backend == 'nccl' else None)",
     "on a node with 2 GPUs, as local rank 1, main passed device_id=3: device_id is this process's own GPU, "
     "cuda:LOCAL_RANK"),
    ("dist.init_process_group(backend, device_id=device)",
     "on a machine without GPUs, as local rank 1, main passed device_id=device(type='cpu'): pass device_id= only "
     "with GPUs"),
    ('dist.init_process_group("gloo")', "on a node with 2 GPUs main joined with backend 'gloo': use 'nccl'"),
], ids=["local_rank", "local_world_size", "store_without_rank", "device_id_global_rank", "device_id_on_cpu",
        "gloo_on_gpus"])
def test_a_wrong_join_is_named(line, message):
    with pytest.raises(common.CheckFailed, match=re.escape(message)):
        group.process_group(_joining(line))
