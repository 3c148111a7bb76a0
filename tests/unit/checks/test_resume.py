"""Step 4's snapshot lines judged from what torch.save and torch.load were given, observed in this process.

The 2-rank runs of the whole check are in test_script.py; here the observers and the rules alone, on a few
lines a learner might write, in milliseconds.
"""

from __future__ import annotations

import os
import shutil

import torch

from workshop_lib.checks import resume, rules
from workshop_lib.checks.recorder import Recorder, recording
from workshop_lib.checks.runner import Run


def _case(rec: Recorder) -> rules.Case:
    return rules.Case(Run({0: rec.events}), 4)


def test_a_temporary_file_copied_into_place_is_named(tmp_path):
    rec = Recorder()
    path = tmp_path / resume.SNAPSHOT
    with recording(rec):
        torch.save({"epoch": 0}, f"{path}.tmp")
        shutil.copyfile(f"{path}.tmp", path)  # a copy: snapshot.pt is written a second time, not renamed
    line = resume.writing_mistake(_case(rec), tmp_path)
    assert line.startswith("the temporary file snapshot.pt.tmp is still in --out after the run: move it onto "
                           "snapshot.pt with os.replace"), line


def test_a_file_object_and_os_replace_pass(tmp_path):
    rec = Recorder()
    path = tmp_path / resume.SNAPSHOT
    with recording(rec):
        with open(f"{path}.tmp", "wb") as f:
            torch.save({"epoch": 0}, f)
        os.replace(f"{path}.tmp", path)
    assert [e["path"] for e in rec.events if e["kind"] == "save"] == [f"{path}.tmp"]  # the file object's name
    assert resume.writing_mistake(_case(rec), tmp_path) is None


def test_weights_only_false_is_named_and_true_passes(tmp_path):
    path = tmp_path / resume.SNAPSHOT
    torch.save({"epoch": 0}, path)
    for weights_only, expected in ((False, "rank 0 loaded snapshot.pt with weights_only=False (line "), (True, None)):
        rec = Recorder()
        with recording(rec):
            torch.load(path, map_location="cpu", weights_only=weights_only)
        line = resume.loading_mistake(Run({0: rec.events}))
        assert line == expected if expected is None else line.startswith(expected), line
