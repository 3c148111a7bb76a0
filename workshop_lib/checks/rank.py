"""One rank of the script checker's run: the learner's scripts in turn, each under :func:`record.spying`.

    python -m workshop_lib.checks.rank MANIFEST.json   # RANK and WORLD_SIZE from the environment (the checker starts it)
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from pathlib import Path

import torch.distributed as dist

from workshop_lib.checks.record import Recorder, record_calls, spying
from workshop_lib.debug import hangwatch
from workshop_lib.debug.hangreport import RECORD_VARIABLE
from workshop_lib.debug.patching import patched
from workshop_lib.errors import first_line


def _load(script: Path, name: str):
    """The script as a module (its ``__main__`` guard does not run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_script(events: Path, script: Path, argv: list[str], name: str = "learner_script") -> bool:
    """Load the learner's script, run its main(argv) under spying, record how it ended; True if it returned."""
    rec = Recorder(events)
    rec.add("start", pid=os.getpid())
    try:
        module = _load(script, name)
        record_calls(rec, module.__dict__, "mean_over_ranks")
        with spying(rec, module.__dict__):
            try:
                result = module.main(argv)
            finally:  # a watch the script installed and never took off ends with its run, inside the recording
                hangwatch.uninstall()
        spread = result.get("replica_spread") if isinstance(result, dict) else None
        rec.add("end", ok=True, replica_spread=spread)
        return True
    except BaseException as err:  # every failure is an outcome to report
        frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == str(script)]
        first = first_line(err, 300)
        rec.add("end", ok=False, error=type(err).__name__, message=first, at=frames[-1].lineno if frames else None)
        return False
    finally:
        if dist.is_available() and dist.is_initialized():  # a script that never left: the next one must join afresh
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        dist.distributed_c10d._world.group_count = 0  # the next script's group keys start where its peers' do


def run_rank(manifest: Path, rank: int, world_size: int) -> None:
    """One rank of a checked run: each script of the manifest in turn, each on its own port; then exit at once.

    After each script the ranks wait for each other on a control store (rank 0 hosts it), and rank 0 keeps
    the script's rendezvous store open until then: a peer still joining must not find it gone.
    """
    from datetime import timedelta

    from workshop_lib import distributed
    from workshop_lib.lab.launch import free_port

    items = json.loads(Path(manifest).read_text())
    control = dist.TCPStore("127.0.0.1", items[0]["control_port"], world_size, is_master=rank == 0,
                            timeout=timedelta(seconds=60), wait_for_workers=False)
    stores: list = []

    def keeping(real):
        def keep(*args, **kw):
            stores.append(real(*args, **kw))
            return stores[-1]
        return keep

    with patched(distributed, "rendezvous_store", keeping):
        for i, item in enumerate(items):
            if rank == 0:  # each script's port is picked just before it runs: gloo's own connections take
                control.set(f"item{i}/port", str(free_port()))  # ephemeral ports meanwhile, so none is picked ahead
            os.environ["MASTER_PORT"] = control.get(f"item{i}/port").decode()
            os.environ[RECORD_VARIABLE] = f"{item['events']}.hang.json"  # the script's hang watch saves its block there
            run_script(Path(f"{item['events']}.rank{rank}.jsonl"), Path(item["script"]), item["argv"], item["name"])
            control.set(f"item{i}/rank{rank}", "done")
            control.wait([f"item{i}/rank{r}" for r in range(world_size)], timedelta(seconds=120))
            stores.clear()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter shutdown: gloo's destructors sometimes abort there


if __name__ == "__main__":
    run_rank(Path(sys.argv[1]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
