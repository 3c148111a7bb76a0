"""All hyper-parameters in one dataclass, and the one argparse that fills it.

Defaults were chosen by measured time-to-accuracy on a 2-core CPU (see
benchmarks/): a small bidirectional LSTM reaches a better ROC AUC sooner than
the original workshop's 3-layer model. 64 molecules per process is where one
CPU thread trains fastest per molecule (smaller batches pay fixed per-step
costs, larger ones pad more and fall out of cache).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib.errors import InputError
from workshop_lib.paths import DEFAULT_DATA


def _checked(kind: type, holds, said: str):
    """A flag's type: ``kind`` of the text, an argparse error unless ``holds(value)``."""
    def parse(text: str):
        value = kind(text)
        if not holds(value):
            raise argparse.ArgumentTypeError(f"must be {said}, got {value}")
        return value

    parse.__name__ = kind.__name__  # argparse's "invalid int value: 'x'"
    return parse


_positive_int = _checked(int, lambda v: v >= 1, ">= 1")
_positive_float = _checked(float, lambda v: v > 0, "> 0")
_fraction = _checked(float, lambda v: 0 < v < 1, "between 0 and 1")


def _opt(default, help: str, type=None, run_only: bool = False):
    """A TrainConfig field with its flag's help text (the field's comment, in one place).

    ``run_only``: it changes how or where this run goes, not what it trains, so
    a snapshot written under another value may still be resumed.
    """
    return field(default=default, metadata={"help": help, "type": type, "run_only": run_only})


@dataclass(frozen=True)
class TrainConfig:
    # --- data ---
    data: Path = _opt(DEFAULT_DATA, "CSV with a SMILES column and a 0/1 label column (default: the shipped B3DB table)")  # noqa: RUF009
    smiles_col: str | None = _opt(None, "name of the SMILES column (default: detect: smiles, smi, ...)")
    label_col: str | None = _opt(None, "name of the 0/1 label column (default: detect: p_np, label, ...)")
    limit: int | None = _opt(None, "train on a seeded random subset of N molecules, for quick runs (default: all)",
                             _positive_int)
    heldout_frac: float = _opt(0.1, "share held out for the final test (as the original workshop)", _fraction)
    dev_frac: float = _opt(0.2, "share of the rest used for model selection", _fraction)
    split_seed: int = _opt(1729, "seed of the stratified split and of --limit's subset (the original workshop's)")
    # --- model ---
    embed_dim: int = _opt(32, "token embedding size", _positive_int)
    hidden: int = _opt(32, "LSTM hidden size per direction", _positive_int)
    layers: int = _opt(1, "stacked bidirectional LSTM layers", _positive_int)
    dropout: float = _opt(0.1, "dropout in the head (and between LSTM layers), in [0, 1)")
    # --- optimisation ---
    epochs: int = _opt(12, "passes over the training split (more epochs continue a shorter run in --out)",
                       _positive_int, run_only=True)
    batch_size: int = _opt(64, "molecules per process per step; global batch = this x world size", _positive_int)
    lr: float = _opt(8e-3, "AdamW learning rate", _positive_float)
    weight_decay: float = _opt(1e-4, "AdamW weight decay")
    seed: int = _opt(0, "seed for weights, shuffling and dropout")
    # --- run ---
    out: Path = _opt(Path("runs/latest"), "where rank 0 writes metrics.json, TensorBoard and snapshots",  # noqa: RUF009
                     run_only=True)
    timeout: float = _opt(120.0, "seconds a rank waits on the others before giving up", _positive_float,
                          run_only=True)
    tensorboard: bool = _opt(True, "TensorBoard event files on rank 0", run_only=True)
    resume: Path | None = _opt(None, "snapshot to resume from (default: OUT/snapshot.pt if it fits this run)",  # noqa: RUF009
                               run_only=True)
    fresh: bool = _opt(False, "start afresh, replacing the snapshot and results in --out", run_only=True)

    def as_dict(self) -> dict:
        """JSON-friendly view (paths as strings), for metrics.json and TensorBoard hparams."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self).items()}


def training_fields() -> tuple[str, ...]:
    """The fields that change what is trained: a snapshot resumes only under the same values."""
    return tuple(f.name for f in dataclasses.fields(TrainConfig) if not f.metadata["run_only"])


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (no usage dump) and exits 2."""

    def error(self, message: str) -> None:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


_PARSERS = {"Path": Path, "Path | None": Path, "str | None": str, "int": int, "int | None": int, "float": float}


def build_parser(description: str, prog: str | None = None) -> argparse.ArgumentParser:
    """The flags every step script shares: one per TrainConfig field, named after it, with its help."""
    p = _OneLineParser(prog=prog, description=description.strip().splitlines()[0], allow_abbrev=False)
    for f in dataclasses.fields(TrainConfig):
        flag, meta = "--" + f.name.replace("_", "-"), f.metadata
        if f.type == "bool":  # a switch: --no-tensorboard turns a default-on field off, --fresh a default-off one on
            name = flag if not f.default else "--no-" + f.name
            p.add_argument(name, dest=f.name, action="store_false" if f.default else "store_true",
                           help=f"turn off the {meta['help']}" if f.default else meta["help"])
            continue
        p.add_argument(flag, type=meta["type"] or _PARSERS[f.type], default=f.default, help=meta["help"])
    return p


def parse_args(argv: Sequence[str] | None = None, description: str = "a step script of the DDP workshop",
               prog: str | None = None) -> TrainConfig:
    """The script's flags (``sys.argv`` by default) as a TrainConfig; a bad flag is one line and exit code 2.

    ``description``: the script's docstring; its first line heads ``--help``.
    """
    ns = vars(build_parser(description, prog).parse_args(sys.argv[1:] if argv is None else list(argv)))
    cfg = TrainConfig(**ns)
    if not 0.0 <= cfg.dropout < 1.0:
        raise InputError(f"--dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.fresh and cfg.resume is not None:
        raise InputError("--fresh and --resume contradict each other; pass one of them")
    return cfg
