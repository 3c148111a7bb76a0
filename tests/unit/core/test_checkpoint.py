"""Snapshots: what they hold, exact resume, safe loading, and clear errors for bad or foreign files.

Step 4's own lines write and load the snapshot (plain torch); workshop_lib.checkpoint keeps the books: which file
to resume, the refusal of another run's snapshot, the best model and the history.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil

import numpy as np
import pytest
import torch

from tests.conftest import load_step, one_process_world, raises_in_process
from workshop_lib import checkpoint
from workshop_lib.errors import InputError

QUICK = ["--limit", "300", "--no-tensorboard"]


@pytest.fixture
def step4(world_of_one):
    """Step 4's main, in-process, in a gloo group of one (torchrun's variables for one process)."""
    return load_step("step4_snapshots")


def train(step4, out, *args) -> dict:
    """Run step 4 into ``out``; return its metrics.json."""
    step4.main([*QUICK, "--out", str(out), *args])
    return json.loads((out / "metrics.json").read_text())


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    """A finished 1-epoch run of step 4 (QUICK), trained once for the module: the old run most tests start from."""
    out = tmp_path_factory.mktemp("one-epoch")
    with pytest.MonkeyPatch.context() as monkeypatch, one_process_world(monkeypatch):
        train(load_step("step4_snapshots"), out, "--epochs", "1")
    return out


def trained(one_epoch, out) -> dict:
    """``out`` as ``train(step4, out, "--epochs", "1")`` leaves it (a copy of :func:`one_epoch`); its metrics.json."""
    shutil.copytree(one_epoch, out, dirs_exist_ok=True)
    return json.loads((out / "metrics.json").read_text())


def fail(step4, *args) -> str:
    """Run step 4 expecting a user error; return its one line, as Python prints it (then exits with status 1)."""
    with raises_in_process(InputError) as raised:
        step4.main([*QUICK, *args])
    line = f"{raised.value.code}\n"
    assert line.count("\n") == 1 and line.startswith("error: "), line
    return line


@pytest.mark.timeout(120)
def test_snapshot_holds_everything_and_loads_weights_only(step4, tmp_path):
    train(step4, tmp_path, "--epochs", "2")
    snap = torch.load(tmp_path / checkpoint.SNAPSHOT, weights_only=True)
    assert snap["epoch"] == 1 and snap["world_size"] == 1
    assert snap.keys() == {"epoch", "model", "optimizer", "format", "world_size", "fingerprint", "best", "report"}
    assert not any(k.startswith("module.") for k in snap["model"])  # the plain model's keys
    assert "rng" not in snap  # one RNG mechanism: seed_epoch, nothing restored from the file
    assert snap["optimizer"]["state"], "the optimizer's moments are saved"
    assert snap["best"]["epoch"] in (0, 1) and snap["best"]["state"].keys() == snap["model"].keys()
    assert [h["epoch"] for h in snap["report"]["history"]] == [0, 1]
    fp = snap["fingerprint"]
    assert fp["lr"] == 8e-3 and fp["limit"] == 300 and len(fp["data_sha256"]) == 64
    assert not {"out", "epochs", "timeout", "tensorboard", "resume", "fresh"} & fp.keys()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "model.pt", checkpoint.SNAPSHOT]  # no .tmp


@pytest.mark.timeout(120)
def test_resume_continues_exactly_where_it_stopped(step4, tmp_path, capsys):
    train(step4, tmp_path / "a", "--epochs", "2")
    resumed = train(step4, tmp_path / "a", "--epochs", "3")
    assert "resuming from" in capsys.readouterr().out
    straight = train(step4, tmp_path / "b", "--epochs", "3")
    assert [h["train_loss"] for h in resumed["history"]] == [h["train_loss"] for h in straight["history"]]
    assert [h["dev_roc_auc"] for h in resumed["history"]] == [h["dev_roc_auc"] for h in straight["history"]]
    assert (resumed["best_epoch"], resumed["heldout_roc_auc"]) == (straight["best_epoch"], straight["heldout_roc_auc"])


@pytest.mark.timeout(120)
def test_resume_from_an_explicit_path_into_a_new_out(step4, tmp_path, one_epoch):
    trained(one_epoch, tmp_path / "a")
    m = train(step4, tmp_path / "b", "--epochs", "2", "--resume", str(tmp_path / "a" / checkpoint.SNAPSHOT))
    assert [h["epoch"] for h in m["history"]] == [0, 1]
    assert json.loads((tmp_path / "b" / "metrics.json").read_text())["epochs"] == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_corrupt_snapshot_is_one_line(step4, tmp_path, damage, one_epoch):
    trained(one_epoch, tmp_path)
    path = tmp_path / checkpoint.SNAPSHOT
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage": os.urandom(4096), "empty": b""}[damage])
    err = fail(step4, "--epochs", "2", "--out", str(tmp_path))
    assert f"snapshot {path} is corrupt" in err and "choose another --out" in err


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # would create the marker file if unpickled


@pytest.mark.timeout(60)
def test_a_snapshot_with_code_in_it_is_refused_without_running_it(step4, tmp_path):
    """The script's own torch.load(..., weights_only=True) refuses it: torch's error, and the code never runs."""
    marker = tmp_path / "pwned"
    torch.save({"format": 1, "model": _Payload(str(marker))}, tmp_path / "evil.pt")
    with raises_in_process(pickle.UnpicklingError, match="Weights only load failed"):
        step4.main([*QUICK, "--resume", str(tmp_path / "evil.pt"), "--out", str(tmp_path / "out")])
    assert not marker.exists()


@pytest.mark.timeout(60)
def test_a_file_that_is_not_a_snapshot(step4, tmp_path):
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    err = fail(step4, "--resume", str(tmp_path / "other.pt"), "--out", str(tmp_path / "out"))
    assert "is not a workshop snapshot" in err


@pytest.mark.timeout(60)
def test_resume_from_a_missing_file(step4, tmp_path):
    err = fail(step4, "--resume", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "out"))
    assert "nope.pt not found" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(120)
def test_another_model_size_is_refused(step4, tmp_path):
    train(step4, tmp_path, "--epochs", "1", "--hidden", "16")
    err = fail(step4, "--epochs", "2", "--out", str(tmp_path))
    assert "belongs to another run (hidden 16 there, 32 now)" in err


@pytest.mark.timeout(120)
def test_another_world_size_is_refused(step4, tmp_path, one_epoch):
    trained(one_epoch, tmp_path)
    path = tmp_path / checkpoint.SNAPSHOT
    snap = torch.load(path, weights_only=True)
    snap["world_size"] = 2  # as if two processes had written it
    torch.save(snap, path)
    err = fail(step4, "--epochs", "2", "--out", str(tmp_path))
    assert "was written by 2 processes, this run has 1" in err


@pytest.mark.timeout(60)
def test_a_failed_write_keeps_the_previous_snapshot(step4, tmp_path, monkeypatch, one_epoch):
    trained(one_epoch, tmp_path)
    path = tmp_path / checkpoint.SNAPSHOT
    before = path.read_bytes()

    def crash(*_):
        raise OSError("disk full")

    real = os.replace
    monkeypatch.setattr(os, "replace", crash)
    with raises_in_process(OSError, match="disk full"):
        train(step4, tmp_path, "--epochs", "2")
    monkeypatch.setattr(os, "replace", real)
    assert path.read_bytes() == before  # the new one stays in the temporary file, never half on snapshot.pt
    again = train(step4, tmp_path, "--epochs", "2")  # the next run resumes from the old one
    assert len(again["history"]) == 2


def test_seed_epoch_depends_on_seed_epoch_and_rank_only():
    def draws(seed, epoch, rank):
        checkpoint.seed_epoch(seed, epoch, rank)
        return torch.rand(3).tolist(), np.random.rand(), random.random()

    first = draws(0, 1, 0)
    torch.rand(100)  # whatever happened before
    assert draws(0, 1, 0) == first
    assert draws(0, 1, 1) != first and draws(0, 2, 0) != first and draws(1, 1, 0) != first


@pytest.mark.timeout(120)
@pytest.mark.parametrize("old_run", ["interrupted", "finished"])
def test_another_learning_rate_never_resumes_the_old_run(step4, tmp_path, capsys, old_run, one_epoch):
    """Ctrl-C after epoch 1 of 3, or a finished 1-epoch run, then a rerun with --lr 1e-3: one line, both alike."""
    trained(one_epoch, tmp_path)
    epochs = "3" if old_run == "interrupted" else "1"
    err = fail(step4, "--epochs", epochs, "--lr", "1e-3", "--out", str(tmp_path))
    assert err == (f"error: snapshot {tmp_path / checkpoint.SNAPSHOT} belongs to another run (lr 0.008 there, "
                   f"0.001 now); rerun with its settings to resume it, or start a new run with --out elsewhere, "
                   f"or --fresh to replace it\n")
    fresh = train(step4, tmp_path, "--epochs", epochs, "--lr", "1e-3", "--fresh")
    assert "starting afresh" in capsys.readouterr().out
    assert fresh["config"]["lr"] == 1e-3 and len(fresh["history"]) == int(epochs)
    assert torch.load(tmp_path / checkpoint.SNAPSHOT, weights_only=True)["fingerprint"]["lr"] == 1e-3


@pytest.mark.timeout(120)
def test_another_data_file_with_the_same_vocabulary_never_resumes(step4, tmp_path, small_csv):
    data = tmp_path / "data.csv"
    data.write_text(small_csv.read_text())
    train(step4, tmp_path / "out", "--epochs", "1", "--data", str(data))
    lines = data.read_text().splitlines()
    num, name, label, smiles = lines[1].split(",", 3)
    lines[1] = ",".join([num, name, str(1 - int(label)), smiles])  # one label flipped: same molecules, same tokens
    data.write_text("\n".join(lines) + "\n")
    err = fail(step4, "--epochs", "2", "--data", str(data), "--out", str(tmp_path / "out"))
    assert "belongs to another run (the data file's content)" in err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("crash", ["heldout evaluation", "metrics write"])
def test_a_crash_after_the_last_snapshot_finishes_without_retraining(step4, tmp_path, capsys, monkeypatch, crash):
    straight = train(step4, tmp_path / "straight", "--epochs", "2")
    capsys.readouterr()
    if crash == "metrics write":
        target, name = __import__("workshop_lib.report", fromlist=["report"]), "write_metrics"
    else:
        target, name = step4, "evaluate"
    real, calls = getattr(target, name), []

    def crashing(*args, **kwargs):
        calls.append(1)
        if crash == "metrics write" or len(calls) == 3:  # 2 dev evaluations, then the heldout one
            raise OSError(f"crash during the {crash}")
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, crashing)
    with raises_in_process(OSError, match="crash during"):
        train(step4, tmp_path / "a", "--epochs", "2")
    monkeypatch.setattr(target, name, real)
    assert not (tmp_path / "a" / "metrics.json").exists()
    capsys.readouterr()
    again = train(step4, tmp_path / "a", "--epochs", "2")
    out = capsys.readouterr().out
    assert "epoch 2/2 was done; all epochs are trained, but the final evaluation did not finish: running it" in out
    assert "train loss" not in out  # no epoch trained again
    assert again["history"] == [{**h, "seconds": a["seconds"], "samples_per_second": a["samples_per_second"]}
                                for h, a in zip(straight["history"], again["history"], strict=True)]
    assert (again["best_epoch"], again["heldout_roc_auc"]) == (straight["best_epoch"], straight["heldout_roc_auc"])


@pytest.mark.timeout(120)
def test_a_finished_run_is_evaluated_again_and_more_epochs_continue_it(step4, tmp_path, capsys, one_epoch):
    first = trained(one_epoch, tmp_path)
    again = train(step4, tmp_path, "--epochs", "1")
    out = capsys.readouterr().out
    assert "epoch 1/1 was done; the run had finished (metrics.json): evaluating it again, nothing to train" in out
    assert "train loss" not in out.split("resuming from")[1]
    assert again["history"] == first["history"] and again["heldout_roc_auc"] == first["heldout_roc_auc"]
    longer = train(step4, tmp_path, "--epochs", "2")
    assert "resuming from" in capsys.readouterr().out
    assert longer["history"][0] == first["history"][0] and len(longer["history"]) == 2  # epoch 1 kept, 2 added
    err = fail(step4, "--epochs", "1", "--out", str(tmp_path))
    assert "has 2 epochs trained, more than --epochs 1; pass --epochs 2 or more" in err


def test_fresh_and_resume_together_are_refused(step4, tmp_path):
    err = fail(step4, "--fresh", "--resume", str(tmp_path / "x.pt"), "--out", str(tmp_path / "out"))
    assert "--fresh and --resume contradict each other" in err


@pytest.mark.timeout(120)
def test_fresh_does_not_throw_away_its_own_snapshot_after_a_torchrun_restart(step4, tmp_path, capsys, monkeypatch):
    """torchrun --max-restarts reruns the same argv, --fresh included: round 2 must resume round 1's snapshot."""
    train(step4, tmp_path, "--epochs", "1", "--lr", "1e-3", "--fresh")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # what torchrun sets in a restarted round
    resumed = train(step4, tmp_path, "--epochs", "2", "--lr", "1e-3", "--fresh")
    assert "resuming from" in capsys.readouterr().out and len(resumed["history"]) == 2


@pytest.mark.parametrize(("snapshot", "said"), [
    ({"epoch": 0, "model": {}, "optimizer": {}},  # a learner's dict, the workshop's record left out
     "snapshot snap.pt has 'epoch', 'model', 'optimizer' but not the workshop's record ('best', 'fingerprint', "
     "'format', 'report', 'world_size'): the script that wrote it left out "
     "snapshot.update(checkpoint.run_record(best, report)) before saving"),
    ({"weights": 1}, "snapshot snap.pt is not a workshop snapshot: it has the keys 'weights' and lacks 'best', "),
    ([1, 2], "snapshot snap.pt holds a list, where a workshop snapshot is a dict"),
    ({k: 0 for k in checkpoint._KEYS} | {"format": 2}, "snapshot snap.pt is of format 2, and this workshop reads "
                                                         f"format {checkpoint.FORMAT}"),
], ids=["no record", "other keys", "not a dict", "another format"])
def test_a_snapshot_that_is_not_this_workshops_says_what_it_found(snapshot, said, monkeypatch):
    from workshop_lib.config import TrainConfig

    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS", raising=False)
    with pytest.raises(InputError) as err:
        checkpoint.refuse_another_run(snapshot, "snap.pt", TrainConfig(), 2)
    assert str(err.value).startswith(f"error: {said}"), str(err.value)
    assert "(format 3" not in str(err.value) and "restart" not in str(err.value)
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")  # as torchrun --max-restarts=3 gives its workers
    with pytest.raises(InputError) as err:
        checkpoint.refuse_another_run(snapshot, "snap.pt", TrainConfig(), 2)
    assert str(err.value).endswith("(torchrun restarts the ranks all the same, and each restart stops here: stop it "
                                   "with Ctrl-C and fix this first)")
