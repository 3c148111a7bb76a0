"""One rank of the script checker's run: the learner's scripts in turn, each as ``__main__``, watched from outside.

    python -m workshop_lib.checks.rank MANIFEST.json   # RANK, WORLD_SIZE ... from the environment (the runner sets them)

For each item of the manifest this process runs the script as torchrun would
(``runpy``, ``sys.argv`` set), with the hang watch attached from outside
(:func:`workshop_lib.debug.hangwatch.attach`) and the recorder
(:func:`workshop_lib.checks.record.recording`), and records how the script
ended: ``ok``, ``exit`` (a non-zero SystemExit, argparse's or an InputError's)
or ``error`` (the exception, its first line, and the line of the script where
it left). A rank the runner kills has no end: it was stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import shutil
import socket
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from workshop_lib.checks.record import Recorder, recording
from workshop_lib.debug import hangwatch
from workshop_lib.debug.hangreport import RECORD_VARIABLE
from workshop_lib.debug.patching import patched
from workshop_lib.errors import first_line

HANG_AFTER = 4.0  # seconds a collective may wait before the watch asks every rank where it is


def _where(err: BaseException, script: str) -> int | None:
    """The line of the script where ``err`` left it (its innermost frame in the script)."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if os.path.abspath(f.filename) == script]
    return frames[-1].lineno if frames else None


def _ending(err: BaseException | None, script: str) -> dict:
    if err is None:
        return {"how": "ok"}
    if isinstance(err, SystemExit):
        if err.code in (None, 0):
            return {"how": "ok"}
        message = getattr(err, "message", None) or str(err.code)
        return {"how": "exit", "code": err.code if isinstance(err.code, int) else 1, "message": message[:300],
                "at": _where(err, script)}
    return {"how": "error", "error": type(err).__name__, "message": first_line(err, 300), "at": _where(err, script)}


def _after_the_host(real):
    """``init_process_group`` called once rank 0's store listens (on ranks other than 0): then as given.

    Under torchrun the agent hosts the store before any rank starts. Here rank 0's
    own env:// rendezvous hosts it, and a rank that gets there first finds nothing
    listening: torch's client then retries only after about half a second, which
    made every checked run that much slower. The wait is bounded by the group's
    timeout; the call itself is unchanged.
    """
    def arrive(*args, **kw):
        if os.environ.get("RANK") != "0" and "store" not in kw and kw.get("init_method", "env://") == "env://":
            address = (os.environ.get("MASTER_ADDR", ""), int(os.environ.get("MASTER_PORT", "0")))
            timeout = kw.get("timeout")
            deadline = time.monotonic() + (timeout.total_seconds() if timeout is not None else 60.0)
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(address, timeout=1.0).close()
                    break
                except OSError:
                    time.sleep(0.01)
        return real(*args, **kw)
    return arrive


def run_script(prefix: str, script: str, argv: list[str], hang_record: str) -> dict:
    """Run ``script`` as ``__main__`` with ``argv``, watched and recorded under ``prefix``; how it ended."""
    script = os.path.abspath(script)
    rec = Recorder(prefix)
    rec.add("start", line=False, pid=os.getpid(), argv=argv)
    saved_argv = sys.argv
    sys.argv = [script, *argv]
    after = float(os.environ.get(hangwatch.AFTER_VARIABLE, HANG_AFTER))
    hangwatch.attach(threshold=after, record=hang_record, poll=0.25)
    error: BaseException | None = None
    try:
        with patched(dist, "init_process_group", _after_the_host), recording(rec):
            runpy.run_path(script, run_name="__main__")
    except BaseException as err:  # every way out is an outcome to report
        error = err
    finally:
        sys.argv = saved_argv
        hangwatch.detach()  # says this rank left; the next script gets a watch of its own
    still_joined = dist.is_available() and dist.is_initialized()
    end = rec.add("end", line=False, left_group=not still_joined, **_ending(error, script))
    rec.close()
    if still_joined:  # a script that never left: the next one must join afresh
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    # Private, and needed: group names are numbered per process; the next script's must start where its peer's do.
    dist.distributed_c10d._world.group_count = 0
    return end


def run_rank(manifest: Path, rank: int, world_size: int) -> None:
    """Each item of the manifest in turn, each on its own port; then exit at once.

    Between items the ranks wait for each other on a control store (rank 0 hosts it): a peer still in the
    last script must not find the next one's rendezvous already started.
    """
    import torch._dynamo  # noqa: F401 (DDP imports it on first use, 2-3 s: here, so that no rank waits on its peer's)

    from workshop_lib.lab.launch import free_port

    items = json.loads(Path(manifest).read_text())
    control = dist.TCPStore("127.0.0.1", int(os.environ["CONTROL_PORT"]), world_size, is_master=rank == 0,
                            timeout=timedelta(seconds=120), wait_for_workers=False)
    for i, item in enumerate(items):
        if rank == 0:
            if item.get("copy"):  # a run that continues another's --out gets a copy of it (the original stays)
                shutil.copytree(*item["copy"], dirs_exist_ok=True)
            # Each script's port is picked just before it runs: gloo's own connections take ephemeral ports
            # meanwhile, so none is picked ahead.
            control.set(f"item{i}/port", str(free_port()))
        os.environ["MASTER_PORT"] = control.get(f"item{i}/port").decode()
        os.environ[RECORD_VARIABLE] = item["hang"]
        run_script(f"{item['prefix']}.rank{rank}", item["script"], item["argv"], item["hang"])
        sys.stdout.flush()
        control.set(f"item{i}/rank{rank}", "done")
        control.wait([f"item{i}/rank{r}" for r in range(world_size)], timedelta(seconds=120))
    # Rank 0 hosts the store: it leaves last, once every peer is past its last wait (else a peer's wait fails).
    control.set(f"bye{rank}", "")
    if rank == 0:
        control.wait([f"bye{r}" for r in range(world_size)], timedelta(seconds=120))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter shutdown: gloo's destructors sometimes abort there


if __name__ == "__main__":
    run_rank(Path(sys.argv[1]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
