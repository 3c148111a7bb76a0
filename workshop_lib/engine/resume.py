"""Step 4, checked through a resume: the first run's snapshot, a second run that continues it, an uninterrupted one.

After ``--epochs 2`` into OUT, ``--epochs 3`` into a copy of OUT must load the snapshot safely, train epoch 3 alone
and end with the figures of ``--epochs 3`` into a fresh folder. Only ``map_location`` is read from the call alone:
on CPU it changes nothing.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from workshop_lib import checkpoint
from workshop_lib.engine import rules
from workshop_lib.engine.recorder import _at, _of, passes
from workshop_lib.engine.runner import Run
from workshop_lib.errors import first_line
from workshop_lib.paths import lab_root

EPOCHS = 3  # the resumed run's --epochs (the first run has the checker's 2)
FIGURES = ("train_loss", "dev_roc_auc", "replica_spread")  # what must match; seconds and speeds may not
PASSED = f"a second run (--epochs {EPOCHS} into the same --out) resumed at epoch {EPOCHS} and ended with the figures " \
         f"of an uninterrupted {EPOCHS}-epoch run"
SNAPSHOT = checkpoint.SNAPSHOT


def snapshot_mistake(out: Path, epochs: int) -> str | None:
    """After a run of ``epochs`` epochs, OUT/snapshot.pt must load safely and hold the last one."""
    path = Path(out) / SNAPSHOT
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


def writing_mistake(case: rules.Case, out: Path) -> str | None:
    """From what rank 0's torch.save wrote: the snapshot written in place, or a temporary file left in --out."""
    saves = [s for s in _of(case.ranks.get(0, []), "save") if s.get("path") and Path(s["path"]).name != "model.pt"]
    in_place = next((s for s in saves if Path(s["path"]).name == SNAPSHOT), None)
    if in_place is not None:
        return (f"rank 0 wrote {SNAPSHOT} with torch.save straight into place{_at(in_place)}: a kill during the write "
                f"leaves half a file, which the next run cannot load; write a temporary file in the same folder, then "
                f"os.replace it onto {SNAPSHOT}")
    elsewhere = next((s for s in saves if (lab_root() / s["path"]).resolve().parent != Path(out).resolve()), None)
    if elsewhere is not None:  # a path the run gave relative to its folder, the clone (runner.py)
        return (f"rank 0 wrote the temporary file {elsewhere['path']} outside --out{_at(elsewhere)}: os.replace is "
                f"atomic only within one file system (from another it fails, 'Invalid cross-device link'); write it "
                f"in the same folder as {SNAPSHOT}")
    left = sorted({Path(s["path"]).name for s in saves} & {p.name for p in Path(out).iterdir()})
    if left:
        return (f"the temporary file {left[0]} is still in --out after the run: move it onto {SNAPSHOT} with "
                f"os.replace, one atomic rename (a copy writes the file again, and a kill during it leaves half a file)")
    return None


def loading_mistake(resumed: Run) -> str | None:
    """From the resumed run's torch.load calls of the snapshot: weights_only=True, and a map_location."""
    for rank, events in sorted(resumed.ranks.items()):
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


def _trained(run: Run) -> list[int]:
    """The epochs rank 0 trained, by the sampler's set_epoch (else by its passes over the training data)."""
    events = run.ranks.get(0, [])
    set_to = [e["epoch"] for e in _of(events, "set_epoch", split="train")]
    return set_to if set_to else list(range(len(passes(events, "train"))))


def _differ(resumed: list[dict], whole: list[dict]) -> str | None:
    for e, (a, b) in enumerate(zip(resumed, whole, strict=False)):
        for key in FIGURES:
            x, y = a.get(key), b.get(key)
            if isinstance(x, float) and isinstance(y, float) and not math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9):
                return f"epoch {e + 1}'s {key.replace('_', ' ')} is {x:.6g}, where the uninterrupted run has {y:.6g}"
    return None


def _epochs_mistake(resumed: Run, first: int) -> str | None:
    trained = _trained(resumed)
    if trained == list(range(first, EPOCHS)):
        return None
    shown = ", ".join(str(e + 1) for e in trained) or "none"
    what = f"the second run (--epochs {EPOCHS} into the same --out) trained epoch(s) {shown}, not epoch {EPOCHS} alone"
    if not any(_of(events, "load") for events in resumed.ranks.values()):
        return f"{what}: no rank loaded {SNAPSHOT} (torch.load) when the run started"
    return f"{what}: after loading the snapshot, start the loop at the epoch after the snapshot's"


def mistake(case: rules.Case, work: Path, rerun: Callable[[str], Run]) -> str | None:
    """The first thing wrong with the snapshot or the resume, as one line; None when it continues exactly.

    ``rerun(name)`` runs the script for 3 epochs into WORK/name: ``resumed`` (a copy of the first run's OUT), then
    ``whole``; each only when what came before holds.
    """
    found = snapshot_mistake(work / "out", case.epochs) or writing_mistake(case, work / "out")
    if found:
        return found
    shutil.copytree(work / "out", work / "resumed", dirs_exist_ok=True)
    runs = {}
    for name, what in (("resumed", f"the resumed run (--epochs {EPOCHS} into the same --out)"),
                       ("whole", f"an uninterrupted {EPOCHS}-epoch run")):
        runs[name] = rerun(name)
        message = rules.first_mistake(rules.Case(runs[name], 4, EPOCHS, case.source, case.name, rerun=True))
        if message:
            return f"{what}: {message}"
    found = loading_mistake(runs["resumed"]) or _epochs_mistake(runs["resumed"], case.epochs)
    if found:
        return found
    got, want = ((rules.read_metrics(work / run) or {}).get("history", []) for run in ("resumed", "whole"))
    if len(got) != len(want):
        return (f"after resuming, metrics.json holds {len(got)} epochs, the uninterrupted run's {len(want)}: keep the "
                f"given checkpoint.restore_history line, which puts the history back")
    differ = _differ(got, want)
    if differ:
        return (f"after resuming, {differ}: load the model's and the optimizer's state from the snapshot, and keep "
                f"the reseed at the start of every epoch (checkpoint.seed_epoch)")
    return None
