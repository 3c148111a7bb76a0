"""TrainConfig and its flags: one flag per field, made in one place."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from workshop_lib.config import TrainConfig, build_parser, parse_args, training_fields
from workshop_lib.errors import InputError


def test_no_flags_give_the_defaults():
    assert parse_args([]) == TrainConfig()


def test_every_field_has_its_flag():
    other = TrainConfig(data=Path("x.csv"), smiles_col="s", label_col="y", limit=50, heldout_frac=0.2, dev_frac=0.3,
                        split_seed=1, embed_dim=8, hidden=4, layers=2, dropout=0.2, epochs=3, batch_size=5, lr=0.1,
                        weight_decay=0.0, seed=7, out=Path("o"), timeout=9.0, tensorboard=False, resume=None,
                        fresh=True)
    assert all(getattr(other, f.name) != f.default for f in dataclasses.fields(TrainConfig) if f.name != "resume")
    argv = ["--data", "x.csv", "--smiles-col", "s", "--label-col", "y", "--limit", "50", "--heldout-frac", "0.2",
            "--dev-frac", "0.3", "--split-seed", "1", "--embed-dim", "8", "--hidden", "4", "--layers", "2",
            "--dropout", "0.2", "--epochs", "3", "--batch-size", "5", "--lr", "0.1", "--weight-decay", "0",
            "--seed", "7", "--out", "o", "--timeout", "9", "--no-tensorboard", "--fresh"]
    assert parse_args(argv) == other


def test_the_flags_that_went_are_gone():
    """--backend (on a GPU node CUDA_VISIBLE_DEVICES= forces gloo) and --progress/--no-progress (no tqdm)."""
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    assert not {"backend", "progress"} & names
    for flag in ("--backend", "--no-progress"):
        with pytest.raises(SystemExit) as exited:
            parse_args([flag, "gloo"] if flag == "--backend" else [flag])
        assert exited.value.code == 2


def test_limit_help_says_what_it_does():
    text = build_parser("t").format_help()
    assert "seeded random subset of N molecules" in " ".join(text.split())


def test_run_only_fields_stay_out_of_the_fingerprint():
    fields = set(training_fields())
    assert {"lr", "seed", "limit", "hidden", "batch_size", "data", "dropout", "weight_decay"} <= fields
    assert not {"out", "epochs", "timeout", "tensorboard", "resume", "fresh"} & fields


@pytest.mark.parametrize(("argv", "message"), [
    (["--heldout-frac", "1.5"], "argument --heldout-frac: must be between 0 and 1"),
    (["--epochs", "0"], "argument --epochs: must be >= 1, got 0"),
    (["--epocs", "3"], "unrecognized arguments: --epocs 3 (see step.py --help)"),
])
def test_argparse_errors_are_one_line_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        parse_args(argv, prog="step.py")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err


@pytest.mark.parametrize(("argv", "message"), [
    (["--fresh", "--resume", "a.pt"], "--fresh and --resume contradict each other; pass one of them"),
    (["--dropout", "1.5"], "--dropout must be in [0, 1), got 1.5"),
])
def test_contradictions_are_an_input_error(argv, message):
    with pytest.raises(InputError) as raised:
        parse_args(argv)
    assert raised.value.message == message
    assert raised.value.code == f"error: {message}"  # what Python prints, alone, before it exits with status 1
