"""Snapshots: what they hold, exact resume, safe loading, and clear errors for bad or foreign files."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import torch

from workshop_lib import checkpoint
from workshop_lib.cli import run_cli

from .test_errors import load_step

QUICK = ["--limit", "300", "--no-progress", "--no-tensorboard"]


@pytest.fixture
def step3(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank does; the tiny model gains nothing from more
    yield load_step("step3_ddp")
    torch.set_num_threads(threads)


def train(step3, out, *args) -> dict:
    return step3.main([*QUICK, "--out", str(out), *args])


def fail(step3, capsys, *args) -> str:
    """Run step 3 expecting a user error; return its one line."""
    code = run_cli(step3.main, [*QUICK, *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


@pytest.mark.timeout(120)
def test_snapshot_holds_everything_and_loads_weights_only(step3, tmp_path):
    train(step3, tmp_path, "--epochs", "2")
    snap = torch.load(tmp_path / checkpoint.SNAPSHOT, weights_only=True)
    assert snap["epoch"] == 1 and snap["sampler_epoch"] == 1 and snap["world_size"] == 1
    assert {"model", "optimizer", "best", "report", "rng"} <= snap.keys()
    assert snap["optimizer"]["state"], "the optimizer's moments are saved"
    assert snap["best"]["epoch"] in (0, 1) and snap["best"]["state"].keys() == snap["model"].keys()
    assert [h["epoch"] for h in snap["report"]["history"]] == [0, 1]
    assert set(snap["rng"][0]) >= {"torch", "numpy", "python"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".snapshot")]  # no temporary file left


@pytest.mark.timeout(120)
def test_resume_continues_exactly_where_it_stopped(step3, tmp_path, capsys):
    train(step3, tmp_path / "a", "--epochs", "2")
    resumed = train(step3, tmp_path / "a", "--epochs", "3")
    assert "resuming from" in capsys.readouterr().out
    straight = train(step3, tmp_path / "b", "--epochs", "3")
    assert [h["train_loss"] for h in resumed["history"]] == [h["train_loss"] for h in straight["history"]]
    assert [h["dev_roc_auc"] for h in resumed["history"]] == [h["dev_roc_auc"] for h in straight["history"]]
    assert (resumed["best_epoch"], resumed["heldout_roc_auc"]) == (straight["best_epoch"], straight["heldout_roc_auc"])


@pytest.mark.timeout(120)
def test_resume_from_an_explicit_path_into_a_new_out(step3, tmp_path):
    train(step3, tmp_path / "a", "--epochs", "1")
    m = train(step3, tmp_path / "b", "--epochs", "2", "--resume", str(tmp_path / "a" / checkpoint.SNAPSHOT))
    assert [h["epoch"] for h in m["history"]] == [0, 1]
    assert json.loads((tmp_path / "b" / "metrics.json").read_text())["epochs"] == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_corrupt_snapshot_is_one_line(step3, tmp_path, capsys, damage):
    train(step3, tmp_path, "--epochs", "1")
    path = tmp_path / checkpoint.SNAPSHOT
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage": os.urandom(4096), "empty": b""}[damage])
    err = fail(step3, capsys, "--epochs", "2", "--out", str(tmp_path))
    assert f"snapshot {path} is corrupt" in err and "choose another --out" in err


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # would create the marker file if unpickled


@pytest.mark.timeout(60)
def test_a_snapshot_with_code_in_it_is_refused_without_running_it(step3, tmp_path, capsys):
    marker = tmp_path / "pwned"
    torch.save({"format": 1, "model": _Payload(str(marker))}, tmp_path / "evil.pt")
    err = fail(step3, capsys, "--resume", str(tmp_path / "evil.pt"), "--out", str(tmp_path / "out"))
    assert "is corrupt or not a snapshot" in err
    assert not marker.exists()


@pytest.mark.timeout(60)
def test_a_file_that_is_not_a_snapshot(step3, tmp_path, capsys):
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    err = fail(step3, capsys, "--resume", str(tmp_path / "other.pt"), "--out", str(tmp_path / "out"))
    assert "is not a workshop snapshot" in err


@pytest.mark.timeout(60)
def test_resume_from_a_missing_file(step3, tmp_path, capsys):
    err = fail(step3, capsys, "--resume", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "out"))
    assert "nope.pt not found" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(120)
def test_another_model_size_is_refused(step3, tmp_path, capsys):
    train(step3, tmp_path, "--epochs", "1", "--hidden", "16")
    err = fail(step3, capsys, "--epochs", "2", "--out", str(tmp_path))
    assert "does not fit this run: it has hidden=16 (now 32)" in err


@pytest.mark.timeout(120)
def test_another_world_size_is_refused(step3, tmp_path, capsys):
    train(step3, tmp_path, "--epochs", "1")
    path = tmp_path / checkpoint.SNAPSHOT
    snap = torch.load(path, weights_only=True)
    snap["world_size"] = 2  # as if two processes had written it
    torch.save(snap, path)
    err = fail(step3, capsys, "--epochs", "2", "--out", str(tmp_path))
    assert "was written by 2 processes, this run has 1" in err


@pytest.mark.timeout(60)
def test_a_failed_write_keeps_the_previous_snapshot(step3, tmp_path, monkeypatch):
    train(step3, tmp_path, "--epochs", "1")
    path = tmp_path / checkpoint.SNAPSHOT
    before = path.read_bytes()

    def crash(*_):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        train(step3, tmp_path, "--epochs", "2")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", checkpoint.SNAPSHOT]


def test_seed_epoch_depends_on_seed_epoch_and_rank_only():
    def draws(seed, epoch, rank):
        checkpoint.seed_epoch(seed, epoch, rank)
        return torch.rand(3).tolist(), np.random.rand(), random.random()

    first = draws(0, 1, 0)
    torch.rand(100)  # whatever happened before
    assert draws(0, 1, 0) == first
    assert draws(0, 1, 1) != first and draws(0, 2, 0) != first and draws(1, 1, 0) != first


@pytest.mark.timeout(120)
def test_rerunning_a_finished_run_starts_afresh_and_more_epochs_continue_it(step3, tmp_path, capsys):
    first = train(step3, tmp_path, "--epochs", "1")
    again = train(step3, tmp_path, "--epochs", "1")
    out = capsys.readouterr().out
    assert "holds a finished 1-epoch run: starting afresh" in out and "resuming from" not in out
    learned = [(h["train_loss"], h["dev_roc_auc"]) for h in first["history"]]
    assert [(h["train_loss"], h["dev_roc_auc"]) for h in again["history"]] == learned  # trained again, same seed
    assert again["heldout_roc_auc"] == first["heldout_roc_auc"]
    longer = train(step3, tmp_path, "--epochs", "2")
    assert "resuming from" in capsys.readouterr().out
    assert longer["history"][0] == again["history"][0] and len(longer["history"]) == 2  # epoch 1 kept, 2 added
