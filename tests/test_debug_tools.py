"""The small mechanisms the tools share: frames, patching, collectives' observers, the hang record, first lines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from workshop_lib.debug import collectives, frames, hangreport
from workshop_lib.debug.patching import patched
from workshop_lib.errors import first_line, first_sentence

LIB = Path(frames.__file__).resolve().parent.parent  # workshop_lib/


# ------------------------------------------------------------------ frames


@pytest.mark.parametrize(("path", "core_is_library", "library"), [
    (str(LIB / "checks" / "record.py"), False, True),  # a tool
    (str(LIB / "lab" / "forklaunch.py"), False, True),
    (str(LIB / "check.py"), False, True),  # a command module
    (str(LIB / "train.py"), False, False),  # the core is the learner's by default ...
    (str(LIB / "train.py"), True, True),  # ... and library when asked
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
    assert not frames.is_tool(str(LIB / "checkpoint.py"))


def _here():
    return frames.caller()


def test_caller_is_the_innermost_frame_outside_the_library():
    found = _here()
    assert Path(found.filename).name == "test_debug_tools.py" and found.name == "_here"


def test_since_fork_drops_the_kernel_frames_before_a_forked_rank_started():
    stack = traceback.StackSummary.from_list([
        ("/tmp/ipykernel_1/1.py", 3, "<module>", ""), (str(LIB / "lab" / "forklaunch.py"), 70, "_rank_main", ""),
        ("/tmp/ipykernel_1/2.py", 5, "check_all_reduce", "")])
    assert [f.name for f in frames.since_fork(stack)] == ["check_all_reduce"]
    assert [f.name for f in frames.users(stack)] == ["<module>", "check_all_reduce"]


# ------------------------------------------------------------------ patching


class _Owner:
    value = "original"


def test_patched_restores_even_after_an_error():
    with pytest.raises(RuntimeError), patched(_Owner, "value", lambda old: f"{old}, patched"):
        assert _Owner.value == "original, patched"
        raise RuntimeError
    assert _Owner.value == "original"


def test_patched_leaves_a_later_replacement_in_place():
    with patched(_Owner, "value", lambda old: "mine"):
        _Owner.value = "theirs"
    assert _Owner.value == "theirs"
    _Owner.value = "original"


def test_patched_handles_mappings_and_missing_keys():
    names = {"kept": 1}
    with patched(names, "added", lambda old: ("was", old)), patched(os.environ, "WORKSHOP_TEST_VAR", lambda old: "x"):
        assert names["added"] == ("was", None) and os.environ["WORKSHOP_TEST_VAR"] == "x"
    assert names == {"kept": 1} and "WORKSHOP_TEST_VAR" not in os.environ


# ------------------------------------------------------------------ collectives


class _Log:
    def __init__(self, only=None):
        self.seen, self.only = [], only

    def enter(self, op, args, kwargs):
        if self.only and op not in self.only:
            return None
        self.seen.append(("enter", op))
        return op

    def leave(self, token, error):
        if token is not None:
            self.seen.append(("leave", token, type(error).__name__ if error else None))


def test_observers_share_one_wrapper_and_torch_is_put_back():
    original = dist.all_reduce
    a, b = _Log(), _Log(only={"barrier"})
    with collectives.observing(a):
        wrapped = dist.all_reduce
        with collectives.observing(b):
            assert dist.all_reduce is wrapped  # a second observer wraps nothing again
            with pytest.raises((ValueError, RuntimeError)):  # no process group: torch's own error passes through
                dist.all_reduce(torch.ones(1))
        assert dist.all_reduce is wrapped  # a's still there
    assert dist.all_reduce is original and torch.autograd.backward.__module__.startswith("torch")
    assert a.seen[0] == ("enter", "all_reduce") and a.seen[1][0] == "leave" and a.seen[1][2] is not None
    assert b.seen == []  # it observes barriers only


def test_backward_is_observed_for_the_hang_watch():
    log = _Log(only={collectives.BACKWARD})
    x = torch.ones(2, requires_grad=True)
    with collectives.observing(log):
        (2 * x).sum().backward()
    assert log.seen == [("enter", "backward"), ("leave", "backward", None)]
    assert x.grad.tolist() == [2.0, 2.0]


# ------------------------------------------------------------------ the hang record


BLOCK = ["rank 0 has waited 4 s in all_reduce #3 (float32[1]), called at a.py:9 in train()",
         "never arrived: rank 1",
         "rank 1 is in all_gather #3 (2 tensors, first float32[8]) at a.py:5 in spread(), not in all_reduce #3: the "
         "ranks called different collectives"]


def test_the_saved_record_names_who_is_waited_for(tmp_path):
    path = tmp_path / "hang.json"
    assert hangreport.load(path) == [] and hangreport.missing_rank(path) is None
    hangreport.save(path, 0, BLOCK, left=[1])  # rank 1 has left: not a lasting hang
    assert hangreport.missing_rank(path) is None
    hangreport.save(path, 0, BLOCK)
    saved = hangreport.load(path)
    assert [b["missing"] for b in saved] == [[1], [1]] and saved[1]["waiting_for"] == [1]
    assert hangreport.missing_rank(path) == hangreport.one_line(BLOCK)
    assert hangreport.missing_rank(path).startswith("rank 0 waits in all_reduce #3 (called at a.py:9 in train()); "
                                                    "rank 1 never joined it: it is in all_gather #3")
    assert not list(tmp_path.glob(".hang.json.*"))  # no temporary file left behind


# ------------------------------------------------------------------ first lines


@pytest.mark.parametrize(("err", "line", "sentence"), [
    (RuntimeError("[../gloo/transport.cc:1] Connection closed by peer. More text\nsecond line"),
     "[../gloo/transport.cc:1] Connection closed by peer. More text", "Connection closed by peer"),
    (KeyError(), "KeyError", "KeyError"),
    ("  plain text\nnext", "plain text", "plain text"),
])
def test_first_line_and_first_sentence(err, line, sentence):
    assert first_line(err) == line and first_sentence(err) == sentence


def test_first_line_is_cut_to_its_limit():
    assert first_line(ValueError("x" * 500), 300) == "x" * 300


# ------------------------------------------------------------------ the process-tree killer


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_kill_tree_ends_a_process_and_the_child_it_started_in_another_session():
    import psutil

    from workshop_lib.lab.processes import kill_tree

    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], "
            "start_new_session=True); print('ready', flush=True); time.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"  # the grandchild exists now
    tree = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    assert len(tree) == 2
    kill_tree(proc, grace=5, first=signal.SIGTERM)
    assert proc.returncode == -signal.SIGTERM  # reaped through the Popen: its code is readable
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in tree)
