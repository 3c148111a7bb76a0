"""Step 4, checked through a resume: the snapshot of the first run, the second run that continues it.

The script checker runs step 4 three times (:func:`workshop_lib.checks.script._items`): ``--epochs 2`` into OUT;
``--epochs 3`` into a copy of OUT (it must find the snapshot, train epoch 3 alone, and report all three); ``--epochs
3`` into a fresh folder, the uninterrupted run whose figures the resumed one must end with.
"""

from __future__ import annotations

import math
from pathlib import Path

from workshop_lib.checks import rules
from workshop_lib.checks.events import _of, passes
from workshop_lib.checks.runner import Run
from workshop_lib.errors import WorkshopError

EPOCHS = 3  # the resumed run's --epochs (the first run has the checker's 2)
FIGURES = ("train_loss", "dev_roc_auc", "replica_spread")  # what must match; seconds and speeds may not
PASSED = f"a second run (--epochs {EPOCHS} into the same --out) resumed at epoch {EPOCHS} and ended with the figures " \
         f"of an uninterrupted {EPOCHS}-epoch run"


def snapshot_mistake(out: Path, epochs: int) -> str | None:
    """After a run of ``epochs`` epochs, OUT/snapshot.pt must hold the last one."""
    from workshop_lib import checkpoint

    path = Path(out) / checkpoint.SNAPSHOT
    if not path.is_file():
        return (f"no {checkpoint.SNAPSHOT} in --out after the run: call checkpoint.save(...) at the end of every "
                f"epoch, on global rank 0")
    try:
        epoch = checkpoint.read(path)["epoch"]
    except WorkshopError as err:
        return str(err)
    except SystemExit as err:  # InputError: a file that is not a snapshot
        return str(getattr(err, "message", err))
    if epoch != epochs - 1:
        return f"the snapshot holds epoch {epoch + 1} of {epochs}: save at the end of every epoch, with that epoch's number"
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


def mistake(case: rules.Case, later: list[Run], work: Path) -> str | None:
    """The first thing wrong with the snapshot or the resume, as one line; None when it continues exactly."""
    found = snapshot_mistake(work / "out", case.epochs)
    if found:
        return found
    resumed, whole = later
    for run, what in ((resumed, f"the resumed run (--epochs {EPOCHS} into the same --out)"),
                      (whole, f"an uninterrupted {EPOCHS}-epoch run")):
        other = rules.Case(run, case.step, EPOCHS, case.source, case.name)
        message = rules.first_mistake(other)
        if message:
            return f"{what}: {message}"
    trained = _trained(resumed)
    if trained != list(range(case.epochs, EPOCHS)):
        shown = ", ".join(str(e + 1) for e in trained) or "none"
        return (f"the second run (--epochs {EPOCHS} into the same --out) trained epoch(s) {shown}, not epoch "
                f"{EPOCHS} alone: start the loop at the epoch checkpoint.restore returns "
                f"(for epoch in range(first_epoch, cfg.epochs))")
    got, want = ((rules.read_metrics(work / run) or {}).get("history", []) for run in ("resumed", "whole"))
    if len(got) != len(want):
        return (f"after resuming, metrics.json holds {len(got)} epochs, the uninterrupted run's {len(want)}: restore "
                f"the report too (checkpoint.restore(latest, model.module, optimizer, best, report))")
    differ = _differ(got, want)
    if differ:
        return (f"after resuming, {differ}: restore the model and the optimizer from the snapshot "
                f"(checkpoint.restore) and reseed every epoch (checkpoint.seed_epoch)")
    return None
