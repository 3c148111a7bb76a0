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
"""

from __future__ import annotations

import hashlib
import io
import json
import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from workshop_lib.config import TrainConfig, training_fields
from workshop_lib.distributed import DistEnv, read_launch_env
from workshop_lib.errors import WorkshopError, first_line
from workshop_lib.paths import write_atomic

SNAPSHOT = "snapshot.pt"
FORMAT = 2
_last: dict = {}  # what this process last wrote: for the message after a Ctrl-C (cli.run_cli)
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


def save(cfg: TrainConfig, env: DistEnv, epoch: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         best, report) -> Path | None:
    """Every rank calls this after epoch ``epoch``; global rank 0 writes OUT/snapshot.pt."""
    if not env.is_main:
        return None
    snapshot = {"format": FORMAT, "epoch": epoch, "epochs": cfg.epochs, "world_size": env.world_size,
                "fingerprint": fingerprint(cfg, model.embed.num_embeddings), "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "best": best.state_dict(), "report": report.state_dict(),
                "sampler_epoch": epoch}
    buf = io.BytesIO()
    torch.save(snapshot, buf)
    path = Path(cfg.out) / SNAPSHOT
    write_atomic(path, buf.getvalue())
    _last.update(path=path, done=f"{epoch + 1}/{cfg.epochs}")
    return path


def last_saved() -> str | None:
    """One line on the snapshot this process wrote last, and how to go on from it; None if it wrote none."""
    if not _last:
        return None
    return (f"{_last['path']} holds epoch {_last['done']}; run the same command again to resume from it "
            "(--fresh starts over)")


def read(path: Path) -> dict:
    """Load and sanity-check a snapshot; anything wrong with the file is one WorkshopError."""
    path = Path(path)
    if not path.is_file():
        raise WorkshopError(f"snapshot {path} not found; pass an existing file to --resume, or leave it out")
    try:
        snap = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # random bytes fail anywhere in the unpickler: KeyError, EOFError, ...
        first = first_line(err, 160)
        raise WorkshopError(f"snapshot {path} is corrupt or not a snapshot ({first}); "
                            f"start afresh with --fresh, or choose another --out") from None
    if not isinstance(snap, dict) or not snap.keys() >= _KEYS or snap["format"] != FORMAT:
        raise WorkshopError(f"snapshot {path} is not a workshop snapshot (format {FORMAT}); "
                            f"start afresh with --fresh, or choose another --out")
    return snap


def check_compatible(snap: dict, path: Path, cfg: TrainConfig, env: DistEnv, vocab_size: int) -> None:
    """Refuse a snapshot of another run (settings, data, world size, or more epochs), naming the difference."""
    ways_out = "start a new run with --out elsewhere, or --fresh to replace it"
    if snap["world_size"] != env.world_size:
        raise WorkshopError(f"snapshot {path} was written by {snap['world_size']} processes, this run has "
                            f"{env.world_size}; relaunch with {snap['world_size']} processes in all to resume it, "
                            f"or {ways_out}")
    diff = _differences(snap["fingerprint"], fingerprint(cfg, vocab_size))
    if diff:
        raise WorkshopError(f"snapshot {path} belongs to another run ({'; '.join(diff)}); rerun with its "
                            f"settings to resume it, or {ways_out}")
    if snap["epoch"] + 1 > cfg.epochs:
        raise WorkshopError(f"snapshot {path} has {snap['epoch'] + 1} epochs trained, more than --epochs "
                            f"{cfg.epochs}; pass --epochs {snap['epoch'] + 1} or more to use it, or {ways_out}")


def load_latest(cfg: TrainConfig, env: DistEnv, vocab_size: int) -> tuple[Path, dict] | None:
    """The snapshot to resume from (``--resume``, else OUT/snapshot.pt), checked; None: start afresh.

    Every rank reads the file itself, so with several nodes ``--out`` must be on a
    filesystem they share; the ranks check that they all found the same epoch.
    ``--fresh`` ignores any snapshot, and rank 0 removes the old one and its metrics;
    but not after torchrun restarted the group: the snapshot is then this run's own.
    """
    path = Path(cfg.resume) if cfg.resume is not None else Path(cfg.out) / SNAPSHOT
    found = None
    if cfg.fresh and read_launch_env().restart_count == 0:
        mine = Path(cfg.out) / SNAPSHOT  # only ever the one in --out, never a file given to --resume
        if env.is_main and mine.is_file():
            for old in (mine, Path(cfg.out) / "metrics.json"):
                old.unlink(missing_ok=True)
            print(f"--fresh: removed the old run's {SNAPSHOT} and metrics.json in {cfg.out}; starting afresh",
                  flush=True)
    elif cfg.resume is not None or path.is_file():
        found = read(path)
        check_compatible(found, path, cfg, env, vocab_size)
    if env.world_size > 1:
        epoch = torch.tensor([found["epoch"] if found else -1] * 2, device=env.device)
        epoch[1] = -epoch[1]
        dist.all_reduce(epoch, op=dist.ReduceOp.MAX)  # [max epoch, -min epoch] over all ranks
        if epoch[0].item() != -epoch[1].item():
            raise WorkshopError(f"ranks disagree on the snapshot {path} (epochs {-epoch[1].item()} to "
                                f"{epoch[0].item()}); with several nodes --out must be on a shared filesystem")
    return (path, found) if found is not None else None


def restore(latest: tuple[Path, dict] | None, env: DistEnv, model: torch.nn.Module,
            optimizer: torch.optim.Optimizer, best, report) -> int:
    """Load a snapshot from :func:`load_latest` into the run; return the first epoch still to train."""
    if latest is None:
        return 0
    path, snap = latest
    try:
        model.load_state_dict(snap["model"])
        optimizer.load_state_dict(snap["optimizer"])
    except (RuntimeError, ValueError, KeyError) as err:
        first = first_line(err, 160)
        raise WorkshopError(f"snapshot {path} does not fit this model ({first}); "
                            f"start afresh with --fresh, or choose another --out") from None
    best.load_state_dict(snap["best"])
    report.load_state_dict(snap["report"])
    done = snap["epoch"] + 1
    note = ""
    if done == report.cfg.epochs:  # nothing to train: the run reached its final evaluation before
        note = ("; the run had finished (metrics.json): evaluating it again, nothing to train" if _finished(report, done)
                else "; all epochs are trained, but the final evaluation did not finish: running it, nothing to train")
    report.print(f"resuming from {path}: epoch {done}/{report.cfg.epochs} was done{note}")
    return done  # the first epoch still to train (the random state is seed_epoch's, as in an uninterrupted run)


def _finished(report, epochs: int) -> bool:
    """Did this run complete? Its last act is writing metrics.json (atomically), after the final evaluation."""
    path = Path(report.cfg.out) / "metrics.json"
    try:
        metrics = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return metrics.get("script") == report.script and len(metrics.get("history", ())) == epochs
