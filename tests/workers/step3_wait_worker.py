"""Step 3 with rank 0's first evaluation held back, to see where rank 1 waits meanwhile: step3_wait_worker.py DIR ARGS.

Rank 1, once past the first epoch's last collective, watches its own main thread
until it stays in one place (blocked: 0.5 s unchanged), and writes that stack to
DIR/rank1.json. Rank 0's first evaluate() waits for that file, then goes on, so
the job finishes. Under torchrun with 2 ranks (tests/integration/test_step3_wait.py).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
import traceback
from pathlib import Path

import torch.distributed as dist

from tests.conftest import SOLUTIONS

STABLE = 25  # polls of 20 ms with the same stack: the thread is blocked, not computing


def main_thread_stack() -> list[str]:
    frames = traceback.extract_stack(sys._current_frames()[threading.main_thread().ident])
    return [f"{f.name}: {f.line}" for f in frames]


def watch_main_thread(out: Path, limit: float = 60.0) -> None:
    last, same, end = None, 0, time.monotonic() + limit
    while time.monotonic() < end:
        stack = main_thread_stack()
        same = same + 1 if stack == last else 0
        if same >= STABLE:
            break
        last = stack
        time.sleep(0.02)
    out.write_text(json.dumps(last))


def main() -> None:
    out, argv = Path(sys.argv[1]), sys.argv[2:]
    spec = importlib.util.spec_from_file_location("step3_ddp", SOLUTIONS / "step3_ddp.py")
    step3 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step3)
    evaluate, spread, looked = step3.evaluate, step3.replica_spread, out / "rank1.json"

    def held_evaluate(*args, **kwargs):
        if not getattr(held_evaluate, "done", False):  # the first evaluation only
            held_evaluate.done = True
            end = time.monotonic() + 60
            while not looked.exists() and time.monotonic() < end:
                time.sleep(0.02)
        return evaluate(*args, **kwargs)

    def spread_then_look(model):
        result = spread(model)
        if dist.get_rank() == 1 and not getattr(spread_then_look, "started", False):
            spread_then_look.started = True
            threading.Thread(target=watch_main_thread, args=(looked,), daemon=True).start()
        return result

    step3.evaluate, step3.replica_spread = held_evaluate, spread_then_look
    step3.main(argv)


if __name__ == "__main__":
    main()
