"""``diff solutions/step3_ddp.py solutions/step4_snapshots.py`` is the snapshot lesson of notebook 04a, and only it.

Step 4's ``main`` is a copy of step 3's in notebook 04a: when step 3 changes, this
test names the lines that now differ, and the copy must follow. Nothing else differs:
no distributed line, no import but ``checkpoint`` (the workshop's bookkeeping; the restart workaround is an
environment variable in the launch command, not a line of the script). The snapshot itself is plain torch:
the dict of state_dicts and the epoch, a temporary file and ``os.replace``, ``torch.load`` with ``map_location``
and ``weights_only=True``, the loop from the epoch after the snapshot's.
"""

from __future__ import annotations

import difflib

from tests.conftest import SOLUTIONS

ONLY_IN_STEP3 = ["torch.manual_seed(cfg.seed + rank)",  # step 4 seeds each epoch from (seed, epoch, rank) instead
                 'report = Reporter(cfg, "step3_ddp", splits, model, world_size) if rank == 0 else None',
                 "for epoch in range(cfg.epochs):"]
ONLY_IN_STEP4 = ["from workshop_lib import checkpoint",
                 # the atomic write: a temporary file, then os.replace
                 "def save_snapshot(snapshot: dict, path) -> None:",
                 '"""Write ``snapshot`` to ``path`` so that a kill at any moment leaves the old file or the new one, '
                 'never half."""',
                 'tmp = f"{path}.tmp"',
                 "torch.save(snapshot, tmp)",
                 "os.replace(tmp, path)",
                 # loading, on every rank, before anything is written
                 "resume_from = checkpoint.to_resume(cfg, rank)",
                 "snapshot = None",
                 "if resume_from is not None:",
                 "snapshot = torch.load(resume_from, map_location=device, weights_only=True)",
                 "checkpoint.refuse_another_run(snapshot, resume_from, cfg, world_size)",
                 'report = Reporter(cfg, "step4_snapshots", splits, model, world_size) if rank == 0 else None',
                 # resuming: the states, and the loop from the epoch after the snapshot's
                 "first_epoch = 0",
                 "if snapshot is not None:",
                 'model.module.load_state_dict(snapshot["model"])',
                 'optimizer.load_state_dict(snapshot["optimizer"])',
                 'first_epoch = snapshot["epoch"] + 1',
                 "checkpoint.restore_history(snapshot, resume_from, best, report)",
                 "for epoch in range(first_epoch, cfg.epochs):",
                 "checkpoint.seed_epoch(cfg.seed, epoch, rank)",
                 # the snapshot, on global rank 0 alone
                 'snapshot = {"epoch": epoch, "model": model.module.state_dict(), "optimizer": optimizer.state_dict()}',
                 "snapshot.update(checkpoint.run_record(best, report))",
                 "save_snapshot(snapshot, cfg.out / checkpoint.SNAPSHOT)",
                 "spread = replica_spread(model)"]  # a resumed run may have no epoch left to train


def code(name: str) -> list[str]:
    """The script after its docstring, each line without indentation or comment."""
    text = (SOLUTIONS / f"{name}.py").read_text()
    body = text.split('"""', 2)[2]
    return [line.split("  #")[0].strip() for line in body.splitlines() if line.strip()]


def test_step4_is_step3_plus_the_snapshot_lines():
    diff = list(difflib.ndiff(code("step3_ddp"), code("step4_snapshots")))
    removed = [line[2:] for line in diff if line.startswith("- ")]
    added = [line[2:] for line in diff if line.startswith("+ ")]
    assert removed == ONLY_IN_STEP3, removed
    assert added == ONLY_IN_STEP4, added
