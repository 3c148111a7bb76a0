"""The one way the tools stop a process and everything it started: :func:`kill_tree` (psutil)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def kill_tree(proc: subprocess.Popen | int, grace: float = 10.0, first: int = signal.SIGTERM) -> None:
    """Send ``first`` to ``proc`` and all its descendants, wait up to ``grace`` s, then SIGKILL what is left.

    The descendants are found before any signal: a worker whose agent died is no longer anyone's child.
    A ``Popen`` is reaped through itself, so its return code stays readable.
    """
    import psutil

    pid = proc if isinstance(proc, int) else proc.pid
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.send_signal(first)
    # Wait on the descendants, and on a root given by pid unless it is this process's own child: its owner (a
    # multiprocessing launcher) reaps it, and would lose track of it if psutil reaped it here.
    others = [p for p in tree if p.pid != pid or (isinstance(proc, int) and _parent(p) != os.getpid())]
    if isinstance(proc, subprocess.Popen):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    _, alive = psutil.wait_procs(others, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=max(grace, 1.0))
    if isinstance(proc, subprocess.Popen) and proc.poll() is None:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(grace, 1.0))


def _parent(process) -> int | None:
    import psutil

    try:
        return process.ppid()
    except psutil.Error:
        return None
