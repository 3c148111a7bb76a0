"""``diff solutions/step3_ddp.py solutions/step4_snapshots.py`` is the snapshot lesson of notebook 04a, and only it.

Step 4's ``train`` is a copy of step 3's in notebook 04a: when step 3 changes, this
test names the lines that now differ, and the copy must follow.
"""

from __future__ import annotations

import difflib

from tests.conftest import SOLUTIONS

ONLY_IN_STEP3 = ["from workshop_lib import distributed", 'report = Reporter(cfg, "step3_ddp", env.device, env)',
                 "for epoch in range(cfg.epochs):"]
ONLY_IN_STEP4 = ["from workshop_lib import checkpoint, distributed",
                 "latest = checkpoint.load_latest(cfg, env, len(splits.tokenizer))",  # before anything is written
                 'report = Reporter(cfg, "step4_snapshots", env.device, env)',
                 "start = checkpoint.restore(latest, env, raw_model, optimizer, best, report)",
                 "for epoch in range(start, cfg.epochs):",
                 "checkpoint.seed_epoch(cfg.seed, epoch, env.rank)",
                 "checkpoint.save(cfg, env, epoch, raw_model, optimizer, best, report)",
                 "spread = replica_spread(model, env)"]


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
