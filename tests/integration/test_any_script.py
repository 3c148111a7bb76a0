"""The script checker on a DDP script written elsewhere (tests/workers/elsewhere: the tutorials' form, a Trainer
class, argparse positionals, a sibling data module, snapshots by global rank 0), as a learner would use it:
``python -m workshop_lib.check train.py 4 2 --snapshot_path ...``.

The fixture itself is never changed (the hang watch's tests use it too): each mistake is a copy of its text with one
edit, beside a copy of its data module. The mistakes run in one call of the checker; the correct script and the
one given no arguments through the command, as a learner runs them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO
from workshop_lib.engine import script

ELSEWHERE = REPO / "tests" / "workers" / "elsewhere"
TEXT = (ELSEWHERE / "train.py").read_text()
SAVE = "        torch.save(snapshot, self.snapshot_path)\n"
WRAP = "        self.model = DDP(self.model, device_ids=[self.local_rank] if torch.cuda.is_available() else None)\n"
SET_EPOCH = "        self.train_data.sampler.set_epoch(epoch)\n"

# name -> (edits to train.py, what the checker's line must say; <<text>>: the number of the line that holds it)
MISTAKES = {
    "barrier_in_rank_0s_save": ([(SAVE, SAVE + "        dist.barrier()  # wait until the snapshot is written\n")],
                                "rank 0 called barrier at line <<dist.barrier()>> (in _save_snapshot, called at line "
                                "<<self._save_snapshot(epoch)>>)"),
    "never_wrapped": ([(WRAP, ""), ("self.model.module.state_dict()", "self.model.state_dict()")],
                      "train.py: rank 0 never wrapped its model in DistributedDataParallel: the replicas differ by up "
                      "to "),
    "no_set_epoch": ([(SET_EPOCH, "")],
                     "train.py: epoch 2 read the same training items in the same order as epoch 1 on every rank: "
                     "sampler.set_epoch is never called"),
}
DEADLOCK = ("line <<self._save_snapshot(epoch)>> runs under `if self.global_rank == 0 and epoch % self.save_every == "
            "0:` (line <<if self.global_rank == 0>>): a barrier that rank 0 alone reaches waits for ranks that never "
            "call it, a deadlock; call it on every rank, or move it out of the block")


def _expected(template: str, text: str) -> str:
    lines = text.splitlines()
    return re.sub(r"<<(.+?)>>", lambda m: str(next(i for i, code in enumerate(lines, 1) if m.group(1) in code)), template)


def _copy(folder, text: str):
    folder.mkdir()
    shutil.copy(ELSEWHERE / "datautils.py", folder)
    (folder / "train.py").write_text(text)
    return folder / "train.py"


def _check(args, cwd):
    return subprocess.run([sys.executable, "-m", "workshop_lib.check", *map(str, args)], capture_output=True,
                          text=True, timeout=170, cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO),
                                                                 "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    """{name: (status, line, the script's text)} for each mistake, checked in one call."""
    tmp = tmp_path_factory.mktemp("elsewhere")
    paths = []
    for name, (edits, _) in MISTAKES.items():
        text = TEXT
        for old, new in edits:
            assert text.count(old) == 1, f"{old!r} is not in train.py once: update the mistake"
            text = text.replace(old, new)
        paths.append(_copy(tmp / name, text))
    results = [script.check_scripts([path], argv=["4", "2", "--snapshot_path", str(path.parent / "snapshot.pt")])[0]
               for path in paths]
    return {name: (*result, path.read_text()) for name, path, result in zip(MISTAKES, paths, results, strict=True)}


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_tutorials_script_passes_with_its_own_arguments_and_says_what_was_judged(tmp_path):
    snapshot = tmp_path / "snapshot.pt"
    proc = _check([ELSEWHERE / "train.py", 4, 2, "--batch_size", 32, "--snapshot_path", snapshot], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said, verdict = proc.stdout.splitlines()
    assert said.startswith("train.py is not a workshop step (no --step, its name is not stepN_*.py), judged by the "
                           "rules for any DDP script: every rank joins one group, as its own rank, with the backend of "
                           "its device; every rank runs the script it was given (no TODO left open"), said
    assert "; the same collectives in the same order on every rank; " in said
    assert ". Left to a workshop step (--step N): check_all_reduce's all-reduce leaves every rank the sum of what the "\
           "ranks held; every rank loads the same split; " in said
    assert said.endswith("; what rank 0 logs is the sum, or the mean, over every rank's batches; step 4's snapshot and "
                         "resume (6 rules)"), said
    assert verdict == (
        "\N{CHECK MARK} train.py: 2 ranks, 4 epoch(s): each read its own 256 of 512 training items, a new order each "
        "epoch; the same 32 collectives on every rank (each backward() through DDP counted: it all-reduces the "
        "gradients outside no_sync()); the replicas started equal and stayed equal (spread 0 after 32 step(s)); "
        "rank 0 alone wrote snapshot.pt; every rank left the group in a finally; at 1 and 3 ranks the shards held "
        "too"), verdict
    assert "never called init_process_group" not in proc.stdout
    assert snapshot.is_file()  # written where the script's own argument said


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_scripts_own_argparse_message_is_shown(tmp_path):
    proc = _check([ELSEWHERE / "train.py"], tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdict = proc.stdout.splitlines()[-1]
    assert verdict.startswith("\N{BALLOT X} train.py: rank 0 exited with code 2 (line "), verdict
    assert verdict.endswith("): train.py: error: the following arguments are required: total_epochs, save_every; its "
                            "own arguments go after its path: python -m workshop_lib.check [options] train.py ARGS"), \
        verdict


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", MISTAKES)
def test_each_mistake_in_the_tutorials_form_is_named(verdicts, name):
    status, line, text = verdicts[name]
    assert status == "wrong" and _expected(MISTAKES[name][1], text) in line, line
    assert "\n" not in line
    if name == "barrier_in_rank_0s_save":
        assert _expected(DEADLOCK, text) in line, line
