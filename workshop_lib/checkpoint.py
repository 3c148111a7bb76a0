"""Snapshots: survive a killed rank by resuming where the last epoch ended.

Global rank 0 writes ``OUT/snapshot.pt`` after every epoch, atomically (a
temporary file in the same directory, then a rename), so a kill at any moment
leaves either the previous snapshot or the new one, never half a file. When
torchrun restarts the group (``--max-restarts``), the script finds it and
carries on from the next epoch.

Resuming gives exactly the numbers of an uninterrupted run because nothing
random depends on how the process got here: :func:`seed_epoch` reseeds every
rank from (seed, epoch, rank) at each epoch start (dropout masks differ per
rank, and must), the sampler's shuffle follows ``set_epoch``, and the snapshot
holds the model, the optimizer's moments, the best model so far, the
Reporter's history and every rank's RNG states.

Loading uses ``torch.load(weights_only=True)``: a snapshot holds tensors and
plain containers only, and a file from elsewhere cannot run code on load.
"""

from __future__ import annotations

import io
import pickle
import random
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from workshop_lib.config import TrainConfig
from workshop_lib.distributed import DistEnv
from workshop_lib.errors import WorkshopError
from workshop_lib.metrics import write_atomic

SNAPSHOT = "snapshot.pt"
FORMAT = 1
# Settings a resumed run must share with the one that wrote the snapshot: the
# model's shape, and what decides which molecules each rank sees in which order.
MUST_MATCH = ("embed_dim", "hidden", "layers", "batch_size", "seed", "limit", "split_seed")
_KEYS = {"format", "epoch", "world_size", "vocab_size", "settings", "model", "optimizer", "best", "report",
         "rng", "sampler_epoch"}


def seed_epoch(seed: int, epoch: int, rank: int) -> None:
    """Seed torch, numpy and python's RNGs from (seed, epoch, rank) alone.

    A restarted rank then draws the same dropout masks as it would have without
    the restart; each rank still draws its own.
    """
    s = int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1)[0])
    torch.manual_seed(s)
    np.random.seed(s)
    random.seed(s)


def _rng_state(device: torch.device) -> dict:
    """This process's RNG states, as tensors and plain values (safe for weights_only)."""
    _, key, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "numpy": {"key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "python": {"version": version, "internal": list(internal), "gauss": gauss}}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _settings(cfg: TrainConfig) -> dict:
    return {k: getattr(cfg, k) for k in MUST_MATCH}


def save(cfg: TrainConfig, env: DistEnv, epoch: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         best, report) -> Path | None:
    """Every rank calls this after epoch ``epoch``; global rank 0 writes OUT/snapshot.pt."""
    mine = _rng_state(env.device)
    everyone = [None] * env.world_size if env.is_main else None
    if env.world_size > 1:
        dist.gather_object(mine, everyone, dst=0)  # each rank draws its own dropout masks
    else:
        everyone = [mine]
    if not env.is_main:
        return None
    snapshot = {"format": FORMAT, "epoch": epoch, "world_size": env.world_size,
                "vocab_size": model.embed.num_embeddings,
                "settings": _settings(cfg), "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "best": best.state_dict(), "report": report.state_dict(), "rng": everyone,
                "sampler_epoch": epoch}
    buf = io.BytesIO()
    torch.save(snapshot, buf)
    path = Path(cfg.out) / SNAPSHOT
    write_atomic(path, buf.getvalue())
    return path


def read(path: Path) -> dict:
    """Load and sanity-check a snapshot; anything wrong with the file is one WorkshopError."""
    path = Path(path)
    if not path.is_file():
        raise WorkshopError(f"snapshot {path} not found; pass an existing file to --resume, or leave it out")
    try:
        snap = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError, zipfile.BadZipFile, OSError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise WorkshopError(f"snapshot {path} is corrupt or not a snapshot ({first}); "
                            f"delete it or choose another --out to start afresh") from None
    if not isinstance(snap, dict) or not snap.keys() >= _KEYS or snap["format"] != FORMAT:
        raise WorkshopError(f"snapshot {path} is not a workshop snapshot (format {FORMAT}); "
                            f"delete it or choose another --out to start afresh")
    return snap


def check_compatible(snap: dict, path: Path, cfg: TrainConfig, env: DistEnv, vocab_size: int) -> None:
    """Refuse a snapshot from another model size, world size or data order, naming the difference."""
    if snap["world_size"] != env.world_size:
        raise WorkshopError(f"snapshot {path} was written by {snap['world_size']} processes, this run has "
                            f"{env.world_size}; relaunch with {snap['world_size']} processes in all, "
                            f"or choose another --out to start afresh")
    now = {**_settings(cfg), "vocab_size": vocab_size}
    then = {**snap["settings"], "vocab_size": snap["vocab_size"]}
    diff = [f"{k}={then.get(k)} (now {v})" for k, v in now.items() if then.get(k) != v]
    if diff:
        raise WorkshopError(f"snapshot {path} does not fit this run: it has {', '.join(diff)}; "
                            f"rerun with the snapshot's settings or choose another --out to start afresh")


def load_latest(cfg: TrainConfig, env: DistEnv, vocab_size: int) -> tuple[Path, dict] | None:
    """The snapshot to resume from (``--resume``, else OUT/snapshot.pt if it has epochs left), checked; None: start afresh.

    Every rank reads the file itself, so with several nodes ``--out`` must be on a
    filesystem they share; the ranks check that they all found the same epoch.
    """
    path = Path(cfg.resume) if cfg.resume is not None else Path(cfg.out) / SNAPSHOT
    found = read(path) if (cfg.resume is not None or path.is_file()) else None
    if found is not None and cfg.resume is None and found["epoch"] + 1 >= cfg.epochs:
        # A finished run left in --out: nothing of this run is left to resume, so
        # train afresh (a rerun with, say, another --lr must not report the old model).
        if env.is_main:
            print(f"{path} holds a finished {found['epoch'] + 1}-epoch run: starting afresh "
                  f"(--resume {path} continues it instead)", flush=True)
        found = None
    if found is not None:
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
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise WorkshopError(f"snapshot {path} does not fit this model ({first}); "
                            f"choose another --out to start afresh") from None
    best.load_state_dict(snap["best"])
    report.load_state_dict(snap["report"])
    _set_rng_state(snap["rng"][env.rank], env.device)
    report.print(f"resuming from {path}: epoch {snap['epoch'] + 1}/{report.cfg.epochs} was done")
    return snap["epoch"] + 1
