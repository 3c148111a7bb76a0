"""Helpers for the fault, multi-node and SLURM tests: ports, live launches, process trees (through psutil).

Not a test module: tests/integration/test_faults.py, test_multinode.py and test_slurm.py
import it. Every launch starts in its own session, so :func:`stop` can end the
launcher and every worker it spawned, and nothing outlives a test. Tests wait
for events (a line of output, a file), never for a guessed number of seconds.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
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

import psutil
from filelock import FileLock

from tests.conftest import REPO, SOLUTIONS, cpu_env
from workshop_lib.debug.stacks import pyspy_exe
from workshop_lib.launching.launch import torchrun_argv

STEP3 = SOLUTIONS / "step3_ddp.py"
STEP4 = SOLUTIONS / "step4_snapshots.py"  # step 3 with snapshots: the script that survives restarts
# Small and quick, but several optimizer steps per epoch so a kill can land inside one.
RUN = ["--limit", "600", "--epochs", "4", "--batch-size", "8", "--no-tensorboard"]
# In torchrun's environment whenever it may restart the group (--max-restarts): torch 2.13's agent otherwise
# shares its TCP store with the workers, and a restarted round can find the dead round's keys
# (docs/reference/restarts.md; tests/integration/test_restarts.py).
RESTARTS = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def listening(port: int) -> bool:
    """Does a local socket listen on ``port`` (without connecting to it)?"""
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
               for c in psutil.net_connections("tcp"))


def listening_port(pid: int) -> int | None:
    """The TCP port ``pid`` listens on, if it listens on one (a store that bound port 0 and took a free one)."""
    try:
        ports = {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    except psutil.Error:
        return None
    return ports.pop() if len(ports) == 1 else None


def alive(pid: int) -> bool:
    """Is ``pid`` running? A zombie (exited, not yet reaped) is not: os.kill(pid, 0) would say it is."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Launch:
    """A command started in its own session; its output is collected live by a thread."""

    def __init__(self, cmd: list, env: dict[str, str] | None = None, cwd: Path = REPO):
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


def still_alive(pids, timeout: float) -> list[int]:
    """The processes of ``pids`` still running (zombies count as gone) once they all ended or ``timeout`` passed."""
    end = time.monotonic() + timeout
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < end:
        time.sleep(0.05)
    return left


def children(pid: int) -> list[int]:
    """Direct children of ``pid``."""
    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def environ_of(pid: int) -> dict[str, str]:
    try:
        return psutil.Process(pid).environ()
    except psutil.Error:
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


def torchrun(args: list, nproc: int = 2, port: int | None = None, launcher: tuple = (), **env: str) -> Launch:
    """torchrun on this machine: --standalone (its store binds a free port itself), or the static rendezvous on ``port``.

    ``args``: torchrun's own flags (``--max-restarts=1``), then the script (or ``-m`` and a module) and its arguments.
    ``env``: more variables for torchrun's environment (``**RESTARTS`` with ``--max-restarts``).
    """
    flags = list(itertools.takewhile(lambda a: str(a).startswith("--"), args))
    target = args[len(flags):]
    module = bool(target) and target[0] == "-m"
    script, *rest = target[module:]
    where = [f"--master-port={port}"] if port else []
    return Launch(torchrun_argv(script, nproc, standalone=not port, flags=[*where, *launcher, *flags], module=module,
                                args=rest), env=cpu_env(**env))


def same_results(a: dict, b: dict) -> None:
    """Exactly the same training: every epoch's loss and AUC, the best epoch, the held-out AUC."""
    assert [h["epoch"] for h in a["history"]] == [h["epoch"] for h in b["history"]]
    for key in ("train_loss", "dev_roc_auc"):
        assert [h[key] for h in a["history"]] == [h[key] for h in b["history"]], key
    for key in ("best_epoch", "dev_roc_auc", "heldout_roc_auc", "world_size", "global_batch_size"):
        assert a[key] == b[key], key


def _run_id() -> str:
    """This pytest run's id, the same in each xdist worker (the one process's pid without xdist)."""
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())


def _reference_folder() -> Path:
    return Path(tempfile.gettempdir())


def remove_reference_runs(run_id: str) -> None:
    """At the end of the run: the saved reference runs of ``run_id`` and their locks."""
    for path in _reference_folder().glob(f"ddp-reference-{run_id}-*"):
        path.unlink(missing_ok=True)


def reference_metrics(script: Path = STEP4) -> dict:
    """metrics.json of an uninterrupted 2-process run of ``script`` with RUN (:func:`reference_run`)."""
    return reference_run(script)["metrics"]


@functools.cache
def reference_run(script: Path = STEP4) -> dict:
    """An uninterrupted 2-process torchrun of ``script`` with RUN, once per session: its ``metrics`` (metrics.json),
    ``output`` (torchrun's, both ranks') and ``files`` (what it wrote into --out).

    Once for all of pytest-xdist's workers: the first to need it runs it under a file lock, the others read it.
    """
    saved = _reference_folder() / f"ddp-reference-{_run_id()}-{script.stem}.json"
    with FileLock(f"{saved}.lock", timeout=300):
        if saved.is_file():
            return json.loads(saved.read_text())
        out = Path(tempfile.mkdtemp(prefix="reference-"))
        try:
            run = torchrun([script, *RUN, "--out", out])
            try:
                rc = run.wait(timeout=150)
            finally:
                stop(run)
            assert rc == 0, run.output[-3000:]
            record = {"metrics": json.loads((out / "metrics.json").read_text()), "output": run.output,
                      "files": sorted(p.name for p in out.iterdir())}
            saved.write_text(json.dumps(record))
            return record
        finally:
            shutil.rmtree(out, ignore_errors=True)


@functools.cache
def pyspy_attaches() -> bool:
    """Can py-spy read another process here? (Not without ptrace rights: a container without CAP_SYS_PTRACE.)"""
    child = subprocess.Popen([sys.executable, "-c", "import time; print('running', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "running\n"  # its interpreter is up: there is a stack to read
        done = subprocess.run([pyspy_exe(), "dump", "--pid", str(child.pid)], capture_output=True, timeout=30)
        return done.returncode == 0
    finally:
        child.kill()
        child.wait()
