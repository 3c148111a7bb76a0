"""notebook_launch off Linux: spawn for an importable function, a one-line refusal for one defined in a notebook."""

from __future__ import annotations

import sys

import psutil  # noqa: F401 (imported before a test sets sys.platform to "darwin": psutil picks its backend by it)
import pytest
import torch.distributed as dist

from workshop_lib.errors import WorkshopError
from workshop_lib.lab import forklaunch


def rank_and_world(env):
    """Importable (a module-level function of an importable module): spawn can run it."""
    return env.rank, dist.get_world_size()


@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_a_function_defined_in_a_notebook_is_refused_in_one_line(monkeypatch, platform):
    monkeypatch.setattr(sys, "platform", platform)

    def defined_in_a_cell(env):
        return env.rank

    with pytest.raises(WorkshopError, match=r"move .*defined_in_a_cell into a \.py file") as err:
        forklaunch.notebook_launch(defined_in_a_cell, 2)
    assert "\n" not in str(err.value)
    assert ("Windows has no fork" if platform == "win32" else "fork is unsafe on macOS") in str(err.value)


def test_start_method_is_fork_on_linux_and_spawn_for_importable_functions_elsewhere(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    assert forklaunch._start_method(lambda env: None) == "fork"
    monkeypatch.setattr(sys, "platform", "darwin")
    assert forklaunch._start_method(rank_and_world) == "spawn"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_spawn_path_runs_an_importable_function(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")  # spawn is available on Linux too: the macOS path, for real
    assert forklaunch.notebook_launch(rank_and_world, 2, timeout=150) == [(0, 2), (1, 2)]
