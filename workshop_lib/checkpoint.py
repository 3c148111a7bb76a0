"""Snapshots: survive a killed rank or a Ctrl-C by resuming where the last epoch ended.

Global rank 0 writes ``OUT/snapshot.pt`` after every epoch, atomically (a
temporary file in the same directory, then a rename), so a kill at any moment
leaves either the previous snapshot or the new one, never half a file. When
torchrun restarts the group (``--max-restarts``), or the same command runs
again, the script finds it and carries on from the next epoch.

A snapshot is resumed only by the run it belongs to: it records a fingerprint,
every TrainConfig field that changes training (all but the run-only ones such
as ``--out`` or ``--epochs``) and the SHA-256 of the data file's content. A run
with other settings stops with one line naming them and the ways out
(``--out`` elsewhere, or ``--fresh``), whether the old run was interrupted or
finished. A snapshot whose epochs are all trained means the run got as far as
its final evaluation: the rerun evaluates it again, it never retrains.

Resuming gives exactly the numbers of an uninterrupted run because nothing
random depends on how the process got here. There is one RNG mechanism:
:func:`seed_epoch` reseeds every rank from (seed, epoch, rank) at each epoch
start (dropout masks differ per rank, and must), and the sampler's shuffle
follows ``set_epoch``. So no RNG state is saved; the snapshot holds the model,
the optimizer's moments, the best model so far and the Reporter's history.

Loading uses ``torch.load(weights_only=True)``: a snapshot holds tensors and
plain containers only, and a file from elsewhere cannot run code on load.

Every rank reads the snapshot itself, so with several nodes ``--out`` must be
on a file system they share. Nothing here talks to the other ranks.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from workshop_lib.config import TrainConfig, training_fields
from workshop_lib.errors import InputError, first_line
from workshop_lib.paths import write_atomic

SNAPSHOT = "snapshot.pt"
FORMAT = 2
_KEYS = {"format", "epoch", "epochs", "world_size", "fingerprint", "model", "optimizer", "best", "report",
         "sampler_epoch"}
_hashes: dict[tuple, str] = {}


def seed_epoch(seed: int, epoch: int, rank: int) -> None:
    """Seed torch, numpy and python's RNGs from (seed, epoch, rank) alone.

    A restarted rank then draws the same dropout masks as it would have without
    the restart; each rank still draws its own.
    """
    s = int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1)[0])
    torch.manual_seed(s)
    np.random.seed(s)
    random.seed(s)


def data_hash(path: Path) -> str:
    """SHA-256 of the data file's bytes (computed once per file version and process)."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _hashes:
        _hashes[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _hashes[key]


def fingerprint(cfg: TrainConfig, vocab_size: int) -> dict:
    """What decides the training: every non-run-only setting, with the data file's content instead of its path."""
    fp = {k: getattr(cfg, k) for k in training_fields() if k != "data"}
    fp.update(data_sha256=data_hash(cfg.data), vocab_size=vocab_size)
    return fp


def _differences(then: dict, now: dict) -> list[str]:
    diff = []
    for k in now:
        if then.get(k) == now[k]:
            continue
        if k == "data_sha256":
            diff.append("the data file's content")
        else:
            diff.append(f"{k.replace('_', '-')} {then.get(k)} there, {now[k]} now")
    return diff


def save(cfg: TrainConfig, epoch: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, best,
         report) -> Path:
    """After epoch ``epoch``, on global rank 0 only: write OUT/snapshot.pt atomically (``model``: the plain one)."""
    snapshot = {"format": FORMAT, "epoch": epoch, "epochs": cfg.epochs, "world_size": report.world_size,
                "fingerprint": fingerprint(cfg, model.embed.num_embeddings), "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "best": best.state_dict(), "report": report.state_dict(),
                "sampler_epoch": epoch}
    buf = io.BytesIO()
    torch.save(snapshot, buf)
    path = Path(cfg.out) / SNAPSHOT
    write_atomic(path, buf.getvalue())
    return path


def read(path: Path) -> dict:
    """Load and sanity-check a snapshot; anything wrong with the file is one InputError."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"snapshot {path} not found; pass an existing file to --resume, or leave it out")
    try:
        snap = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # random bytes fail anywhere in the unpickler: KeyError, EOFError, ...
        first = first_line(err, 160)
        raise InputError(f"snapshot {path} is corrupt or not a snapshot ({first}); "
                            f"start afresh with --fresh, or choose another --out") from None
    if not isinstance(snap, dict) or not snap.keys() >= _KEYS or snap["format"] != FORMAT:
        raise InputError(f"snapshot {path} is not a workshop snapshot (format {FORMAT}); "
                            f"start afresh with --fresh, or choose another --out")
    return snap


def check_compatible(snap: dict, path: Path, cfg: TrainConfig, world_size: int, vocab_size: int) -> None:
    """Refuse a snapshot of another run (settings, data, world size, or more epochs), naming the difference."""
    ways_out = "start a new run with --out elsewhere, or --fresh to replace it"
    if snap["world_size"] != world_size:
        raise InputError(f"snapshot {path} was written by {snap['world_size']} processes, this run has "
                            f"{world_size}; relaunch with {snap['world_size']} processes in all to resume it, "
                            f"or {ways_out}")
    diff = _differences(snap["fingerprint"], fingerprint(cfg, vocab_size))
    if diff:
        raise InputError(f"snapshot {path} belongs to another run ({'; '.join(diff)}); rerun with its "
                            f"settings to resume it, or {ways_out}")
    if snap["epoch"] + 1 > cfg.epochs:
        raise InputError(f"snapshot {path} has {snap['epoch'] + 1} epochs trained, more than --epochs "
                            f"{cfg.epochs}; pass --epochs {snap['epoch'] + 1} or more to use it, or {ways_out}")


@dataclass(frozen=True)
class Latest:
    """The snapshot a run resumes from: where it is, what it holds, and the run's epochs."""

    path: Path
    snapshot: dict
    epochs: int  # this run's --epochs


def load_latest(cfg: TrainConfig, rank: int, world_size: int, vocab_size: int) -> Latest | None:
    """The snapshot to resume from (``--resume``, else OUT/snapshot.pt), checked; None: start afresh.

    Call it on every rank, before anything is written: a snapshot of another run
    stops every rank with one line. ``--fresh`` ignores any snapshot, and global
    rank 0 removes the old one and its metrics; but not after torchrun restarted
    the group (TORCHELASTIC_RESTART_COUNT > 0): the snapshot is then this run's own.
    """
    path = Path(cfg.resume) if cfg.resume is not None else Path(cfg.out) / SNAPSHOT
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    if cfg.fresh and not restarted:
        mine = Path(cfg.out) / SNAPSHOT  # only ever the one in --out, never a file given to --resume
        if rank == 0 and mine.is_file():
            for old in (mine, Path(cfg.out) / "metrics.json"):
                old.unlink(missing_ok=True)
            print(f"--fresh: removed the old run's {SNAPSHOT} and metrics.json in {cfg.out}; starting afresh",
                  flush=True)
        return None
    if cfg.resume is None and not path.is_file():
        return None
    found = read(path)
    check_compatible(found, path, cfg, world_size, vocab_size)
    return Latest(path, found, cfg.epochs)


def restore(latest: Latest | None, model: torch.nn.Module, optimizer: torch.optim.Optimizer, best,
            report=None) -> int:
    """Load a snapshot from :func:`load_latest` into the run; return the first epoch still to train.

    ``model`` is the plain model (``model.module`` under DDP); ``report``, global
    rank 0's Reporter (None on the other ranks), gets the history and says where
    the run resumes.
    """
    if latest is None:
        return 0
    path, snap = latest.path, latest.snapshot
    try:
        model.load_state_dict(snap["model"])
        optimizer.load_state_dict(snap["optimizer"])
    except (RuntimeError, ValueError, KeyError) as err:
        first = first_line(err, 160)
        raise InputError(f"snapshot {path} does not fit this model ({first}); "
                         f"start afresh with --fresh, or choose another --out") from None
    best.load_state_dict(snap["best"])
    done = snap["epoch"] + 1
    if report is not None:
        report.load_state_dict(snap["report"])
        note = ""
        if done == latest.epochs:  # nothing to train: the run reached its final evaluation before
            note = ("; the run had finished (metrics.json): evaluating it again, nothing to train"
                    if _finished(report, done) else
                    "; all epochs are trained, but the final evaluation did not finish: running it, nothing to train")
        report.print(f"resuming from {path}: epoch {done}/{latest.epochs} was done{note}")
    return done  # the first epoch still to train (the random state is seed_epoch's, as in an uninterrupted run)


def _finished(report, epochs: int) -> bool:
    """Did this run complete? Its last act is writing metrics.json (atomically), after the final evaluation."""
    path = Path(report.cfg.out) / "metrics.json"
    try:
        metrics = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return metrics.get("script") == report.script and len(metrics.get("history", ())) == epochs
