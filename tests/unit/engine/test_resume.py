"""Step 4's snapshot lines judged from what torch.save and torch.load were given, observed in this process.

The 2-rank runs of the whole check are in test_script.py (the solution, another right way, the loop restarting at
epoch 0, the snapshot lines out of rank 0's block); here the observers and the rules alone, on a few lines a learner
might write, in milliseconds: each verdict of :func:`resume.snapshot`, :func:`resume.writing` and
:func:`resume.loading` (rows of the rule table) once. The runs would only repeat what these record: the same
observers of torch.save and torch.load, the same rules, behind a 2-rank run (three for a resume).
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest
import torch

from workshop_lib.engine import resume, rules
from workshop_lib.engine.recorder import Recorder, recording
from workshop_lib.engine.runner import Run


def _case(rec: Recorder | None, out=None) -> rules.Case:
    return rules.Case(Run({0: rec.events if rec else []}), 4, out=out)


def _loaded(rec: Recorder) -> str | None:
    """The verdict on a resumed run whose rank 0 made ``rec``'s calls."""
    first = _case(None)
    first.later["resumed"] = _case(rec)
    return resume.loading(first)


def test_a_temporary_file_copied_into_place_is_named(tmp_path):
    rec = Recorder()
    path = tmp_path / resume.SNAPSHOT
    with recording(rec):
        torch.save({"epoch": 0}, f"{path}.tmp")
        shutil.copyfile(f"{path}.tmp", path)  # a copy: snapshot.pt is written a second time, not renamed
    line = resume.writing(_case(rec, tmp_path))
    assert line.startswith("the temporary file snapshot.pt.tmp is still in --out after the run: move it onto "
                           "snapshot.pt with os.replace"), line


def _here() -> int:
    """The caller's line (the recorder names the learner's line of each call it observes)."""
    return sys._getframe(1).f_lineno


def test_a_snapshot_written_straight_into_place_is_named(tmp_path):
    rec = Recorder()
    with recording(rec):
        at = _here() + 1  # the next line
        torch.save({"epoch": 0}, tmp_path / resume.SNAPSHOT)
    assert resume.writing(_case(rec, tmp_path)) == (
        f"rank 0 wrote snapshot.pt with torch.save straight into place (line {at}): a kill during the write leaves "
        "half a file, which the next run cannot load; write a temporary file in the same folder, then os.replace it "
        "onto snapshot.pt")


def test_a_temporary_file_in_another_folder_is_named(tmp_path):
    rec = Recorder()
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir(), elsewhere.mkdir()
    with recording(rec):
        at = _here() + 1
        torch.save({"epoch": 0}, elsewhere / "snapshot.tmp")
        os.replace(elsewhere / "snapshot.tmp", out / resume.SNAPSHOT)  # works here, one file system: not across two
    assert resume.writing(_case(rec, out)) == (
        f"rank 0 wrote the temporary file {elsewhere / 'snapshot.tmp'} outside --out (line {at}): os.replace is atomic "
        "only within one file system (from another it fails, 'Invalid cross-device link'); write it in the same "
        "folder as snapshot.pt")


@pytest.mark.parametrize("rename", [os.replace, os.rename])  # os.rename is atomic on POSIX too
def test_a_file_object_and_an_atomic_rename_pass(tmp_path, rename):
    rec = Recorder()
    path = tmp_path / resume.SNAPSHOT
    with recording(rec):
        with open(f"{path}.tmp", "wb") as f:
            torch.save({"epoch": 0}, f)
        rename(f"{path}.tmp", path)
    assert [e["path"] for e in rec.events if e["kind"] == "save"] == [f"{path}.tmp"]  # the file object's name
    assert resume.writing(_case(rec, tmp_path)) is None


def test_weights_only_false_is_named_and_true_passes(tmp_path):
    path = tmp_path / resume.SNAPSHOT
    torch.save({"epoch": 0}, path)
    for weights_only, expected in ((False, "rank 0 loaded snapshot.pt with weights_only=False (line "), (True, None)):
        rec = Recorder()
        with recording(rec):
            torch.load(path, map_location="cpu", weights_only=weights_only)
        line = _loaded(rec)
        assert line == expected if expected is None else line.startswith(expected), line


@pytest.mark.parametrize(("arguments", "expected"), [
    ({"map_location": "cpu"}, "rank 0 loaded snapshot.pt without weights_only=True (line {at}): torch 2.13 defaults "
                              "to it, but with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 set, or on a torch before 2.6, it "
                              "unpickles anything"),
    ({"weights_only": True}, "rank 0 loaded snapshot.pt without map_location (line {at}): on GPUs torch.load puts "
                             "every tensor back on the device that saved it"),
], ids=["no weights_only", "no map_location"])
def test_a_load_without_weights_only_or_map_location_is_named(tmp_path, arguments, expected):
    path = tmp_path / resume.SNAPSHOT
    torch.save({"epoch": 0}, path)
    rec = Recorder()
    with recording(rec):
        at = _here() + 1  # the next line
        torch.load(path, **arguments)
    line = _loaded(rec)
    assert line.startswith(expected.format(at=at)), line


def test_a_snapshot_missing_or_of_an_earlier_epoch_is_named(tmp_path):
    """After a run of 2 epochs: no snapshot.pt at all, then one that holds epoch 1 (saved once, or with epoch 0)."""
    assert resume.snapshot(_case(None, tmp_path)).startswith("no snapshot.pt in --out after the run")
    torch.save({"epoch": 0, "model": {}, "optimizer": {}}, tmp_path / resume.SNAPSHOT)
    assert resume.snapshot(_case(None, tmp_path)).startswith("the snapshot holds epoch 1 of 2: save at the end of every "
                                                           "epoch")
    torch.save({"epoch": 1, "model": {}, "optimizer": {}}, tmp_path / resume.SNAPSHOT)
    assert resume.snapshot(_case(None, tmp_path)) is None
