"""Step 4, checked through a resume: the first run's snapshot, a second run that continues it, an uninterrupted one.

After ``--epochs 2`` into OUT, ``--epochs 3`` into a copy of OUT must load the snapshot safely, train epoch 3 alone
and end with the figures of ``--epochs 3`` into a fresh folder. Only ``map_location`` is read from the call alone:
on CPU it changes nothing. Each judge here is a row of :data:`~workshop_lib.engine.rules.RULES` (step 4's); the
later runs are the case's (:meth:`~workshop_lib.engine.rules.Case.run_again`), each run once, only when the rows
before hold.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from workshop_lib import checkpoint
from workshop_lib.engine.recorder import _at, _of, passes
from workshop_lib.errors import first_line
from workshop_lib.paths import lab_root

if TYPE_CHECKING:
    from workshop_lib.engine.rules import Case

EPOCHS = 3  # the resumed run's --epochs (the first run has the checker's 2)
FIGURES = ("train_loss", "dev_roc_auc", "replica_spread")  # what must match; seconds and speeds may not
PASSED = f"a second run (--epochs {EPOCHS} into the same --out) resumed at epoch {EPOCHS} and ended with the figures " \
         f"of an uninterrupted {EPOCHS}-epoch run"
SNAPSHOT = checkpoint.SNAPSHOT


def snapshot(case: Case) -> str | None:
    """After the first run, OUT/snapshot.pt loads safely and holds its last epoch."""
    if case.out is None:
        return None  # no folder of the run: nothing measured
    path, epochs = case.out / SNAPSHOT, case.epochs
    if not path.is_file():
        return f"no {SNAPSHOT} in --out after the run: at the end of every epoch, global rank 0 writes it there"
    try:
        snap = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # whatever the learner saved: one line
        return (f"{SNAPSHOT} does not load with torch.load(weights_only=True) ({first_line(err, 120)}): save state "
                f"dicts, numbers and plain containers only")
    missing = [k for k in checkpoint.LESSON if not isinstance(snap, dict) or k not in snap]
    if missing:
        return (f"the snapshot has no {', '.join(map(repr, missing))}: save a dict under the keys "
                f"{', '.join(map(repr, checkpoint.LESSON))}")
    if snap["epoch"] != epochs - 1:
        return (f"the snapshot holds epoch {snap['epoch'] + 1} of {epochs}: save at the end of every epoch, with that "
                f"epoch's number")
    return None


def writing(case: Case) -> str | None:
    """From what rank 0's torch.save wrote: the snapshot written in place, or a temporary file left in --out."""
    out = case.out
    saves = [s for s in _of(case.ranks.get(0, []), "save") if s.get("path") and Path(s["path"]).name != "model.pt"]
    in_place = next((s for s in saves if Path(s["path"]).name == SNAPSHOT), None)
    if in_place is not None:
        return (f"rank 0 wrote {SNAPSHOT} with torch.save straight into place{_at(in_place)}: a kill during the write "
                f"leaves half a file, which the next run cannot load; write a temporary file in the same folder, then "
                f"os.replace it onto {SNAPSHOT}")
    elsewhere = next((s for s in saves if out and (lab_root() / s["path"]).resolve().parent != out.resolve()), None)
    if elsewhere is not None:  # a path the run gave relative to its folder, the clone (runner.py)
        return (f"rank 0 wrote the temporary file {elsewhere['path']} outside --out{_at(elsewhere)}: os.replace is "
                f"atomic only within one file system (from another it fails, 'Invalid cross-device link'); write it "
                f"in the same folder as {SNAPSHOT}")
    left = sorted({Path(s["path"]).name for s in saves} & {p.name for p in (out.iterdir() if out else ())})
    if left:
        return (f"the temporary file {left[0]} is still in --out after the run: move it onto {SNAPSHOT} with "
                f"os.replace, one atomic rename (a copy writes the file again, and a kill during it leaves half a file)")
    return None


def loading(case: Case) -> str | None:
    """From the resumed run's torch.load calls of the snapshot: weights_only=True, and a map_location."""
    for rank, events in sorted(case.later["resumed"].ranks.items() if "resumed" in case.later else ()):
        for load in _of(events, "load"):
            if not load.get("path") or Path(load["path"]).name != SNAPSHOT:
                continue
            said = f"rank {rank} loaded {SNAPSHOT}"
            if load.get("weights_only") is False:
                return (f"{said} with weights_only=False{_at(load)}: unpickling may then run any code the file holds; "
                        f"pass weights_only=True (a snapshot is tensors and plain containers)")
            if load.get("weights_only") is None:
                return (f"{said} without weights_only=True{_at(load)}: torch 2.13 defaults to it, but with "
                        f"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 set, or on a torch before 2.6, it unpickles anything, "
                        f"code included; pass weights_only=True")
            if not load.get("map_location"):
                return (f"{said} without map_location{_at(load)}: on GPUs torch.load puts every tensor back on the "
                        f"device that saved it, cuda:0, on every rank; pass this rank's device")
    return None


def epochs_trained(case: Case) -> str | None:
    """The resumed run trained the epochs after the snapshot's alone (by the sampler's set_epoch, else by its passes
    over the training data)."""
    resumed = case.later.get("resumed")
    events = resumed.ranks.get(0, []) if resumed else []
    trained = [e["epoch"] for e in _of(events, "set_epoch", split="train")] or list(range(len(passes(events, "train"))))
    if resumed is None or trained == list(range(case.epochs, EPOCHS)):
        return None
    shown = ", ".join(str(e + 1) for e in trained) or "none"
    what = f"the second run (--epochs {EPOCHS} into the same --out) trained epoch(s) {shown}, not epoch {EPOCHS} alone"
    if not any(_of(events, "load") for events in resumed.ranks.values()):
        return f"{what}: no rank loaded {SNAPSHOT} (torch.load) when the run started"
    return f"{what}: after loading the snapshot, start the loop at the epoch after the snapshot's"


def figures(case: Case) -> str | None:
    """The resumed run's metrics.json: the uninterrupted run's epochs, and their figures (:data:`FIGURES`)."""
    if not {"resumed", "whole"} <= set(case.later):
        return None
    got, want = ((case.later[run].metrics or {}).get("history", []) for run in ("resumed", "whole"))
    if len(got) != len(want):
        return (f"after resuming, metrics.json holds {len(got)} epochs, the uninterrupted run's {len(want)}: keep the "
                f"given checkpoint.restore_history line, which puts the history back")
    for e, (a, b) in enumerate(zip(got, want, strict=False)):
        for key in FIGURES:
            x, y = a.get(key), b.get(key)
            if isinstance(x, float) and isinstance(y, float) and not math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9):
                return (f"after resuming, epoch {e + 1}'s {key.replace('_', ' ')} is {x:.6g}, where the uninterrupted "
                        f"run has {y:.6g}: load the model's and the optimizer's state from the snapshot, and keep the "
                        f"reseed at the start of every epoch (checkpoint.seed_epoch)")
    return None
