"""One rank of the script checker's run: the learner's script as ``__main__``, watched from outside.

The runner (:mod:`workshop_lib.checks.runner`) starts two processes per checked run, each with
the variables torchrun would set, and each calls :func:`run_item`: it runs the script as torchrun would
(``runpy``, ``sys.argv`` set), with the hang watch attached from outside
(:func:`workshop_lib.debug.hangwatch.attach`) and the recorder
(:func:`workshop_lib.checks.record.recording`), and records how the script
ended: ``ok``, ``exit`` (a non-zero SystemExit, argparse's or an InputError's)
or ``error`` (the exception, its first line, and the line of the script where
it left). A rank the runner kills has no end: it was stopped.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import traceback

import torch.distributed as dist

from workshop_lib.checks.record import Recorder, recording
from workshop_lib.debug import hangwatch
from workshop_lib.errors import first_line
from workshop_lib.paths import lab_root

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
    return {"how": "error", "error": type(err).__name__, "message": first_line(err, 300), "at": _where(err, script),
            "detail": str(err)[:2000]}  # the lines after the first, where torch names what it means (state dict keys)


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
        with recording(rec):
            runpy.run_path(script, run_name="__main__")
    except BaseException as err:  # every way out is an outcome to report
        error = err
    finally:
        sys.argv = saved_argv
        hangwatch.detach()  # says this rank left; the next script gets a watch of its own
    still_joined = dist.is_available() and dist.is_initialized()
    end = rec.add("end", line=False, left_group=not still_joined, **_ending(error, script))
    rec.close()
    if still_joined:  # a script that never left
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return end


def run_item(item: dict, log: str) -> None:
    """One rank of one checked run (in a process of its own, :mod:`workshop_lib.checks.runner`): the script, then return.

    A forked rank keeps the parent's objects unfreed (their destructors need the parent's threads), writes to its own
    log, works in the course folder on one thread, and joins gloo on the loopback by name: a forked process must not
    resolve host names (a lock another thread held at the fork stays locked in the child).
    """
    import gc

    import torch

    gc.freeze()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (lives as long as the rank)
    for name in item["unset"]:  # the checker's own launcher's variables: the script gets only the runner's
        os.environ.pop(name, None)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.chdir(lab_root())
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    run_script(f"{item['prefix']}.rank{rank}", item["script"], item["argv"], item["hang"])
    sys.stdout.flush()
