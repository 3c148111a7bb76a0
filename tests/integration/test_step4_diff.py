"""``diff solutions/step3_ddp.py solutions/step4_snapshots.py`` is the snapshot lesson of notebook 04a, and only it.

Step 4's ``main`` is a copy of step 3's in notebook 04a: when step 3 changes, this
test names the lines that now differ, and the copy must follow. Nothing else differs:
no distributed line, no import but ``checkpoint`` (the restart workaround is an
environment variable in the launch command, not a line of the script).
"""

from __future__ import annotations

import difflib

from tests.conftest import SOLUTIONS

ONLY_IN_STEP3 = ["torch.manual_seed(cfg.seed + rank)",  # step 4 seeds each epoch from (seed, epoch, rank) instead
                 'report = Reporter(cfg, "step3_ddp", splits, model.module, world_size) if rank == 0 else None',
                 "for epoch in range(cfg.epochs):"]
ONLY_IN_STEP4 = ["from workshop_lib import checkpoint",
                 "latest = checkpoint.load_latest(cfg, rank, world_size, len(splits.tokenizer))",  # before any write
                 'report = Reporter(cfg, "step4_snapshots", splits, model.module, world_size) if rank == 0 else None',
                 "first_epoch = checkpoint.restore(latest, model.module, optimizer, best, report)",
                 "for epoch in range(first_epoch, cfg.epochs):",
                 "checkpoint.seed_epoch(cfg.seed, epoch, rank)",
                 "checkpoint.save(cfg, epoch, model.module, optimizer, best, report)",  # rank 0 alone
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
