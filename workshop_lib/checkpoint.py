"""What step 4's snapshots need besides the lesson: the refusal of another run's snapshot, and the run's history.

The lesson stands in the step script, in plain torch: the dict of the epoch and the model's and the optimizer's
``state_dict()``, written by global rank 0 to a temporary file and moved onto OUT/snapshot.pt with ``os.replace``,
loaded on every rank with ``torch.load(path, map_location=device, weights_only=True)``, and the loop going on after
the snapshot's epoch. Here: which file to resume (:func:`to_resume`), the run's fingerprint (every setting that
changes training and the data file's SHA-256), world size, best model and history for the dict (:func:`run_record`),
one line that refuses another run's snapshot (:func:`refuse_another_run`), and the history put back
(:func:`restore_history`). :func:`seed_epoch` reseeds every rank from (seed, epoch, rank) at each epoch start, so
the epoch is all the RNG state a snapshot needs. Nothing here talks to the other ranks.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import zipfile
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch

from workshop_lib.config import TrainConfig, training_fields
from workshop_lib.errors import InputError

SNAPSHOT = "snapshot.pt"
FORMAT = 3
LESSON = ("epoch", "model", "optimizer")  # the keys the step script's own lines write
_KEYS = {"format", "world_size", "fingerprint", "best", "report", *LESSON}
_WAYS_OUT = "start a new run with --out elsewhere, or --fresh to replace it"
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


def fingerprint(cfg: TrainConfig) -> dict:
    """What decides the training: every non-run-only setting, with the data file's content instead of its path."""
    return {**{k: getattr(cfg, k) for k in training_fields() if k != "data"}, "data_sha256": data_hash(cfg.data)}


def _differences(then: dict, now: dict) -> list[str]:
    return ["the data file's content" if k == "data_sha256" else f"{k.replace('_', '-')} {then.get(k)} there, {v} now"
            for k, v in now.items() if then.get(k) != v]


def to_resume(cfg: TrainConfig, rank: int) -> Path | None:
    """The snapshot to resume from (``--resume``, else OUT/snapshot.pt if there is one); None: start afresh.

    Call it on every rank, before anything is written. ``--fresh`` ignores any
    snapshot, and global rank 0 removes the old one and its metrics; but not after
    torchrun restarted the group (TORCHELASTIC_RESTART_COUNT > 0): the snapshot is
    then this run's own. A file that is not a torch file at all stops with one line.
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
    if not path.is_file():
        if cfg.resume is None:
            return None
        raise InputError(f"snapshot {path} not found; pass an existing file to --resume, or leave it out")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; this one is cut short, empty or other bytes
        raise InputError(f"snapshot {path} is corrupt or not a snapshot (not a file torch.save wrote); start afresh "
                         f"with --fresh, or choose another --out")
    return path


def run_record(best, report) -> dict:
    """Global rank 0's bookkeeping for the snapshot dict: this run's fingerprint and world size, the best model, the
    history (``report``: the Reporter)."""
    return {"format": FORMAT, "world_size": report.world_size, "fingerprint": fingerprint(report.cfg),
            "best": best.state_dict(), "report": report.state_dict()}


def refuse_another_run(snapshot, path: Path, cfg: TrainConfig, world_size: int) -> None:
    """Stop with one line if ``snapshot`` (as loaded) is no workshop snapshot, or another run's: its settings, data,
    world size, or more epochs trained than this run's ``--epochs``."""
    fresh = "start afresh with --fresh, or choose another --out"
    if not isinstance(snapshot, dict):
        _refuse(f"snapshot {path} holds a {type(snapshot).__name__}, where a workshop snapshot is a dict; {fresh}")
    missing = sorted(_KEYS - snapshot.keys())
    if missing and not set(LESSON) - snapshot.keys():  # the lesson's keys, without the workshop's record
        _refuse(f"snapshot {path} has {', '.join(map(repr, LESSON))} but not the workshop's record "
                f"({', '.join(map(repr, missing))}): the script that wrote it left out "
                f"snapshot.update(checkpoint.run_record(best, report)) before saving; keep that given line, then {fresh}")
    if missing:
        _refuse(f"snapshot {path} is not a workshop snapshot: it has the keys {', '.join(map(repr, sorted(snapshot)))} "
                f"and lacks {', '.join(map(repr, missing))}; {fresh}")
    if snapshot["format"] != FORMAT:
        _refuse(f"snapshot {path} is of format {snapshot['format']!r}, and this workshop reads format {FORMAT}; {fresh}")
    if snapshot["world_size"] != world_size:
        _refuse(f"snapshot {path} was written by {snapshot['world_size']} processes, this run has "
                f"{world_size}; relaunch with {snapshot['world_size']} processes in all to resume it, or {_WAYS_OUT}")
    diff = _differences(snapshot["fingerprint"], fingerprint(cfg))
    if diff:
        _refuse(f"snapshot {path} belongs to another run ({'; '.join(diff)}); rerun with its settings to resume it, "
                f"or {_WAYS_OUT}")
    if snapshot["epoch"] + 1 > cfg.epochs:
        _refuse(f"snapshot {path} has {snapshot['epoch'] + 1} epochs trained, more than --epochs {cfg.epochs}; pass "
                f"--epochs {snapshot['epoch'] + 1} or more to use it, or {_WAYS_OUT}")


def _refuse(message: str) -> NoReturn:
    """Stop with ``message``; under torchrun's --max-restarts, say that every restart will stop here the same way."""
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:  # torchrun gives its workers this variable
        message += (" (torchrun restarts the ranks all the same, and each restart stops here: stop it with Ctrl-C "
                    "and fix this first)")
    raise InputError(message)


def restore_history(snapshot: dict, path: Path, best, report=None) -> None:
    """Put the best model so far into ``best`` and, on global rank 0 (``report``), the history; say where it resumes."""
    best.load_state_dict(snapshot["best"])
    if report is None:
        return
    report.load_state_dict(snapshot["report"])
    done, epochs = snapshot["epoch"] + 1, report.cfg.epochs
    note = ""
    if done == epochs:  # nothing to train: the run reached its final evaluation before
        note = ("; the run had finished (metrics.json): evaluating it again, nothing to train"
                if _finished(report, done) else
                "; all epochs are trained, but the final evaluation did not finish: running it, nothing to train")
    report.print(f"resuming from {path}: epoch {done}/{epochs} was done{note}")


def _finished(report, epochs: int) -> bool:
    """Did this run complete? Its last act is writing metrics.json (atomically), after the final evaluation."""
    path = Path(report.cfg.out) / "metrics.json"
    try:
        metrics = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return metrics.get("script") == report.script and len(metrics.get("history", ())) == epochs
