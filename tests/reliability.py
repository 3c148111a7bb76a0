"""Helpers for the fault, multi-node and SLURM tests: free ports, live launches, process trees.

Not a test module: tests/test_faults.py, test_multinode.py and test_slurm.py
import it. Every launch starts in its own session, so :func:`stop` can end the
launcher and every worker it spawned, and nothing outlives a test.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from workshop_lib.launch import free_port

from .conftest import REPO, SOLUTIONS, cpu_env

STEP3 = SOLUTIONS / "step3_ddp.py"
# Small and quick, but several optimizer steps per epoch so a kill can land inside one.
RUN = ["--limit", "600", "--epochs", "4", "--batch-size", "8", "--no-progress", "--no-tensorboard"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def listening(port: int) -> bool:
    """Does a local socket listen on ``port`` (read from /proc/net, without connecting to it)?"""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    return True
    return False


class Launch:
    """A command started in its own session; its output is collected live by a thread."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None, cwd: Path = REPO):
        self.cmd = [str(c) for c in cmd]
        self.proc = subprocess.Popen(self.cmd, cwd=cwd, env=env or cpu_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, predicate, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return True
            if self.proc.poll() is not None:
                return predicate()
            time.sleep(0.02)
        return False

    def wait(self, timeout: float) -> int:
        """Exit status; a launch still running after ``timeout`` is stopped and fails the test."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop(self)
            raise AssertionError(f"{self.cmd} still running after {timeout}s:\n{self.output[-3000:]}") from None
        self._reader.join(timeout=5)
        return rc


def children(pid: int) -> list[int]:
    """Direct children of ``pid``, from /proc (no psutil)."""
    kids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4, after the "(comm)" that may hold spaces
            if ppid == pid:
                kids.append(int(entry.name))
    return kids


def environ_of(pid: int) -> dict[str, str]:
    with contextlib.suppress(OSError):
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
    return {}


def stop(launch: Launch, grace: float = 5.0) -> None:
    """End the launch's whole session: SIGTERM, then SIGKILL what is left."""
    if launch.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(launch.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            launch.proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(launch.proc.pid, signal.SIGKILL)  # workers left behind by a dead launcher, too
    with contextlib.suppress(subprocess.TimeoutExpired):
        launch.proc.wait(timeout=grace)


def torchrun(args: list, nproc: int = 2, port: int | None = None, launcher: tuple = ()) -> Launch:
    """torchrun's plain static rendezvous on 127.0.0.1 and a free port (as the README's command)."""
    port = port or free_port()
    return Launch([*TORCHRUN, f"--nproc_per_node={nproc}", f"--master-port={port}", *launcher, *args])


def same_results(a: dict, b: dict) -> None:
    """Exactly the same training: every epoch's loss and AUC, the best epoch, the held-out AUC."""
    assert [h["epoch"] for h in a["history"]] == [h["epoch"] for h in b["history"]]
    for key in ("train_loss", "dev_roc_auc"):
        assert [h[key] for h in a["history"]] == [h[key] for h in b["history"]], key
    for key in ("best_epoch", "dev_roc_auc", "heldout_roc_auc", "world_size", "global_batch_size"):
        assert a[key] == b[key], key


@functools.cache
def reference_metrics() -> dict:
    """metrics.json of an uninterrupted 2-process run of RUN (computed once per session)."""
    out = Path(tempfile.mkdtemp(prefix="reference-"))
    try:
        run = torchrun([STEP3, *RUN, "--out", out])
        try:
            rc = run.wait(timeout=150)
        finally:
            stop(run)
        assert rc == 0, run.output[-3000:]
        return json.loads((out / "metrics.json").read_text())
    finally:
        shutil.rmtree(out, ignore_errors=True)
