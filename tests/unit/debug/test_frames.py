"""Which frames are the learner's: the filter keyed on packages."""


from __future__ import annotations

import os
import traceback
from pathlib import Path

import pytest
import torch

from workshop_lib.debug import frames

LIB = Path(frames.__file__).resolve().parent.parent  # workshop_lib/


@pytest.mark.parametrize(("path", "core_is_library", "library"), [
    (str(LIB / "engine" / "recorder.py"), False, True),  # a tool
    (str(LIB / "launching" / "forklaunch.py"), False, True),
    (str(LIB / "figures" / "replicas.py"), False, True),
    (str(LIB / "cli.py"), False, True),  # the commands' wrapper
    (str(LIB / "check.py"), False, True),  # a command module
    (str(LIB / "watch.py"), False, True),  # the command that runs a script with the watch attached
    (str(LIB / "data.py"), False, False),  # the core is the learner's by default ...
    (str(LIB / "data.py"), True, True),  # ... and library when asked
    (torch.__file__, False, True),
    (os.__file__, False, True),  # the standard library
    ("<frozen runpy>", False, True),
    ("torch/nn/modules/module.py", False, True),  # as py-spy prints it
    ("/tmp/ipykernel_1/123.py", False, False),  # a notebook cell
    ("solutions/step3_ddp.py", False, False),
])
def test_is_library_is_keyed_on_packages(path, core_is_library, library):
    assert frames.is_library(path, core_is_library) is library


def test_a_renamed_tool_module_still_counts_as_a_tool(tmp_path):
    assert frames.is_tool(str(LIB / "checks" / "a_module_added_later.py"))
    assert all(frames.is_tool(str(p / "x.py")) for p in LIB.iterdir() if (p / "__init__.py").is_file())
    assert not frames.is_tool(str(LIB / "checkpoint.py"))


def test_since_fork_drops_the_kernel_frames_before_a_forked_rank_started():
    stack = traceback.StackSummary.from_list([
        ("/tmp/ipykernel_1/1.py", 3, "<module>", ""), (str(LIB / "launching" / "forklaunch.py"), 70, "_rank_main", ""),
        ("/tmp/ipykernel_1/2.py", 5, "check_all_reduce", "")])
    assert [f.name for f in frames.since_fork(stack)] == ["check_all_reduce"]
    assert [f.name for f in frames.users(stack)] == ["<module>", "check_all_reduce"]


def test_py_spys_short_names_of_the_tools_are_library_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # diagnose run outside the clone: a relative name must not resolve against it
    assert frames.is_library("workshop_lib/watch.py") and frames.is_library("workshop_lib/debug/hangwatch.py")
    assert not frames.is_library("workshop_lib/data.py")
    assert frames.is_library("workshop_lib/data.py", core_is_library=True)
