"""notebook_launch where fork is unavailable or unsafe: spawned ranks get the notebook's functions by value.

``WORKSHOP_START_METHOD=spawn`` forces, on Linux, the path that macOS and Windows
take. A "cell" here is code compiled into a namespace named ``__main__``, as a
Jupyter kernel's cells are: nothing a fresh Python could import.
"""

from __future__ import annotations

import linecache
import runpy
import sys
import threading
from pathlib import Path

import psutil  # noqa: F401 (imported before a test sets sys.platform: psutil picks its backend by it)
import pytest

from workshop_lib.checks import group
from workshop_lib.errors import WorkshopError
from workshop_lib.launching import forklaunch, launch, spawning

CELL = '''
import torch
import torch.distributed as dist

SCALE = 10  # a global of the notebook


class Seen:  # a class defined in the notebook, returned by the ranks
    def __init__(self, rank, total):
        self.rank, self.total = rank, total


def contribution(rank):
    return torch.tensor([float(rank + 1) * SCALE])


def summed(env):
    t = contribution(env.rank)
    dist.all_reduce(t)
    return Seen(env.rank, t.item())


def fails_on_rank1(env):
    if env.rank == 1:
        raise ValueError("rank 1 is unhappy")  # the line the rank's traceback shows
    return env.rank


def check_all_reduce(device):
    t = torch.tensor([dist.get_rank() + 1.0], device=device)
    dist.all_reduce(t)
    assert t.item() == dist.get_world_size() * (dist.get_world_size() + 1) / 2
'''


def cell(source: str = CELL, filename: str = "<cell-1>") -> dict:
    """Run ``source`` as a notebook cell: in a namespace named __main__, its lines in linecache as IPython keeps them."""
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


@pytest.fixture
def spawn(monkeypatch):
    monkeypatch.setenv(spawning.START_METHOD, "spawn")


@pytest.mark.parametrize(("platform", "forced", "method"), [
    ("linux", None, "fork"), ("darwin", None, "spawn"), ("win32", None, "spawn"),
    ("linux", "spawn", "spawn"), ("linux", " Fork ", "fork"), ("darwin", "fork", "fork")])
def test_start_method_is_fork_on_linux_spawn_elsewhere_and_the_variable_decides(monkeypatch, platform, forced,
                                                                               method):
    monkeypatch.setattr(sys, "platform", platform)
    if forced is None:
        monkeypatch.delenv(spawning.START_METHOD, raising=False)
    else:
        monkeypatch.setenv(spawning.START_METHOD, forced)
    assert spawning.start_method() == method


@pytest.mark.parametrize(("platform", "forced", "says"), [("linux", "forkserver", r"use fork \(Linux\) or spawn"),
                                                          ("win32", "fork", "Windows has no fork")])
def test_a_start_method_that_cannot_work_is_refused_in_one_line(monkeypatch, platform, forced, says):
    monkeypatch.setattr(sys, "platform", platform)
    monkeypatch.setenv(spawning.START_METHOD, forced)
    with pytest.raises(WorkshopError, match=says) as err:
        forklaunch.notebook_launch(lambda env: None, 2)
    assert "\n" not in str(err.value)


def test_what_spawn_cannot_send_is_refused_in_one_line_before_any_rank_starts(spawn):
    holds_a_lock = cell("def holds_a_lock(env, lock):\n    return env.rank\n", "<cell-lock>")["holds_a_lock"]
    with pytest.raises(WorkshopError, match=r"sends holds_a_lock and its arguments .* cannot be sent") as err:
        forklaunch.notebook_launch(holds_a_lock, 2, threading.Lock())
    assert "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_cells_function_a_lambda_and_a_runpy_modules_function_travel_by_value(spawn, tmp_path, capsys):
    """One launch: a function of a runpy module (as notebook 04a takes step 3's functions) with its globals, given a
    lambda and a cell's function with its globals, whose class comes back. (A cell's function as the launched
    function itself: the two tests below.)"""
    helpers = tmp_path / "helpers.py"
    helpers.write_text("import torch.distributed as dist\n\nOFFSET = 100\n\n\n"
                       "def rank_info(env, extra, cells):\n"
                       "    return env.rank + OFFSET + extra(env.rank), dist.get_world_size(), cells(env)\n")
    rank_info = runpy.run_path(str(helpers))["rank_info"]
    ns = cell()
    ranks = forklaunch.notebook_launch(rank_info, 2, lambda rank: 10 * rank, ns["summed"], timeout=100)
    assert [(info, world) for info, world, _ in ranks] == [(100, 2), (111, 2)]
    seen = [r for *_, r in ranks]
    assert [(r.rank, r.total) for r in seen] == [(0, 30.0), (1, 30.0)]  # (1 + 2) x SCALE on every rank
    assert all(type(r) is ns["Seen"] for r in seen)  # rebuilt as the notebook's own class, not a copy
    assert capsys.readouterr().out == ""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_spawned_ranks_failure_names_the_rank_and_shows_the_cells_line(spawn):
    with pytest.raises(launch.LaunchError) as err:
        forklaunch.notebook_launch(cell()["fails_on_rank1"], 2, timeout=100)
    lines = str(err.value).splitlines()
    assert lines[1].startswith("rank 1 raised ValueError: rank 1 is unhappy (File \"<cell-1>\"")
    logs = Path(lines[-1].split(": ", 1)[1]).read_text()
    assert 'raise ValueError("rank 1 is unhappy")  # the line the rank' in logs  # the cell's source, shipped


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_check_runs_the_learners_cell_function_on_spawned_ranks(spawn, capsys):
    group.all_reduce(cell()["check_all_reduce"], timeout=100)
    assert capsys.readouterr().out.startswith("\N{CHECK MARK} check_all_reduce: each of 2 ranks contributed")
