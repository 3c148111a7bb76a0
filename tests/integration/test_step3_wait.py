"""Where the other ranks wait while rank 0 evaluates alone (notebook 03 names the place).

Rank 0's evaluation is slowed down; rank 1, once it is past the epoch's last
collective, looks at its own main thread a moment later. Notebook 03 says it
waits in the next epoch's first ``loss.backward()`` (DDP's gradient all-reduce);
if the step-3 script changes where the ranks meet, this test fails, and the
sentence in notebook 03 (cell nb03-13) must change with it.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
import traceback

import pytest

from workshop_lib.config import TrainConfig
from workshop_lib.lab import forklaunch
from workshop_lib.paths import REPO_ROOT


def _rank(env, out):
    spec = importlib.util.spec_from_file_location("step3_ddp", REPO_ROOT / "solutions" / "step3_ddp.py")
    step3 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step3)
    seen: list[list[str]] = []
    evaluate, spread = step3.evaluate, step3.replica_spread

    def slow_evaluate(*args, **kwargs):
        if not getattr(slow_evaluate, "done", False):  # the first evaluation only
            slow_evaluate.done = True
            time.sleep(3.0)
        return evaluate(*args, **kwargs)

    main = threading.main_thread()

    def look_later():
        time.sleep(1.0)  # rank 0 is still in its 3 s evaluation
        frames = traceback.extract_stack(sys._current_frames()[main.ident])
        seen.append([f"{f.name}: {f.line}" for f in frames])

    def spread_then_look(*args):
        result = spread(*args)
        if env.rank == 1 and not seen and not getattr(spread_then_look, "started", False):
            spread_then_look.started = True
            threading.Thread(target=look_later, daemon=True).start()
        return result

    step3.evaluate, step3.replica_spread = slow_evaluate, spread_then_look
    step3.train(TrainConfig(limit=400, epochs=2, out=out, progress=False, tensorboard=False), env)
    return seen[0] if seen else None


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_while_rank0_evaluates_the_others_wait_in_the_next_backward(tmp_path):
    stack = forklaunch.notebook_launch(_rank, 2, tmp_path, timeout=150)[1]
    assert stack is not None, "rank 1 never got past the first epoch's replica_spread"
    ours = [line for line in stack if line.startswith(("train:", "train_epoch:"))]
    assert ours and ours[0].startswith("train: stats = train_epoch("), stack[-6:]
    assert ours[-1].startswith("train_epoch: loss.backward()"), stack[-6:]
