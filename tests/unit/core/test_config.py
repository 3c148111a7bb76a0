"""TrainConfig and its flags: one flag per field, made in one place."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from workshop_lib.config import TrainConfig, build_parser, parse_config, training_fields
from workshop_lib.errors import WorkshopError


def test_no_flags_give_the_defaults():
    assert parse_config(build_parser("t"), []) == TrainConfig()


def test_every_field_has_its_flag():
    other = TrainConfig(data=Path("x.csv"), smiles_col="s", label_col="y", limit=50, heldout_frac=0.2, dev_frac=0.3,
                        split_seed=1, embed_dim=8, hidden=4, layers=2, dropout=0.2, epochs=3, batch_size=5, lr=0.1,
                        weight_decay=0.0, seed=7, out=Path("o"), timeout=9.0, backend="gloo", progress=False,
                        tensorboard=False, resume=None, fresh=True)
    assert all(getattr(other, f.name) != f.default for f in dataclasses.fields(TrainConfig) if f.name != "resume")
    argv = ["--data", "x.csv", "--smiles-col", "s", "--label-col", "y", "--limit", "50", "--heldout-frac", "0.2",
            "--dev-frac", "0.3", "--split-seed", "1", "--embed-dim", "8", "--hidden", "4", "--layers", "2",
            "--dropout", "0.2", "--epochs", "3", "--batch-size", "5", "--lr", "0.1", "--weight-decay", "0",
            "--seed", "7", "--out", "o", "--timeout", "9", "--backend", "gloo", "--no-progress", "--no-tensorboard",
            "--fresh"]
    assert parse_config(build_parser("t"), argv) == other


def test_limit_help_says_what_it_does():
    text = build_parser("t").format_help()
    assert "seeded random subset of N molecules" in " ".join(text.split())


def test_run_only_fields_stay_out_of_the_fingerprint():
    fields = set(training_fields())
    assert {"lr", "seed", "limit", "hidden", "batch_size", "data", "dropout", "weight_decay"} <= fields
    assert not {"out", "epochs", "timeout", "backend", "progress", "tensorboard", "resume", "fresh"} & fields


@pytest.mark.parametrize(("argv", "message"), [
    (["--heldout-frac", "1.5"], "argument --heldout-frac: must be between 0 and 1"),
    (["--backend", "mpi"], "argument --backend: invalid choice"),
])
def test_bad_values_are_one_line(capsys, argv, message):
    with pytest.raises(SystemExit):
        parse_config(build_parser("t", prog="step.py"), argv)
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err


def test_fresh_with_resume_is_refused():
    with pytest.raises(WorkshopError, match="--fresh and --resume contradict"):
        parse_config(build_parser("t"), ["--fresh", "--resume", "a.pt"])
