"""Look inside a running torchrun job: every rank's Python stack, side by side.

    python -m workshop_lib.diagnose [PID]   # the only local torchrun job, or the job of this torchrun or rank

It finds torchrun's ranks (psutil) and reads each one's stack with ``py-spy dump``; where py-spy cannot attach,
it sends SIGUSR1 to a rank started with ``-m workshop_lib.watch`` (``faulthandler``) and reads the stack back
from the rank's stderr when that is a file (torchrun's ``--log-dir``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from workshop_lib.debug.frames import is_library, short
from workshop_lib.debug.launchenv import read_launch_env
from workshop_lib.errors import WorkshopError

_PYSPY_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<file>[^()]*?):(?P<line>\d+)\)\s*$")
_FAULT_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Rank:
    rank: int
    pid: int
    frames: list[str]  # "file:line func()", outermost first, the main thread's
    how: str  # "py-spy", "SIGUSR1 -> <log file>", or why there is no stack


def _is_torchrun(proc) -> bool:
    """``torchrun ...`` or ``python -m torch.distributed.run ...`` (the agent that starts the ranks)."""
    import psutil

    try:
        args = proc.cmdline()
    except psutil.Error:  # gone, or not ours to read
        return False
    return "torch.distributed.run" in args or any(Path(a).name == "torchrun" for a in args[:2])


def find_workers(pid: int | None = None) -> tuple[int, dict[int, int]]:
    """(torchrun's pid, {rank: worker pid}) for ``pid`` (torchrun or a worker), or the only local job."""
    import psutil

    def workers_of(agent) -> dict[int, int]:
        found = {}
        for child in agent.children(recursive=True):
            try:
                launch = read_launch_env(child.environ())
            except (psutil.Error, WorkshopError):  # gone, not ours to read, or no worker of torchrun's
                continue
            if launch.under_torchrun:
                found[launch.rank] = child.pid
        return found

    if pid is not None:
        try:
            proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            raise WorkshopError(f"no process {pid}; give the pid of torchrun or of one of its ranks") from None
        agent = next((p for p in [proc, *proc.parents()] if _is_torchrun(p)), None)
        if agent is None:
            raise WorkshopError(f"process {pid} is not a torchrun job nor one of its ranks; give torchrun's pid")
        return agent.pid, workers_of(agent)
    jobs = [(p.pid, workers) for p in psutil.process_iter()
            if p.pid != os.getpid() and _is_torchrun(p) and (workers := workers_of(p))]
    if not jobs:
        raise WorkshopError("no torchrun job with running ranks on this machine; start one, or give its pid")
    if len(jobs) > 1:
        pids = ", ".join(str(p) for p, _ in jobs)
        raise WorkshopError(f"{len(jobs)} torchrun jobs are running (pids {pids}); say which: "
                            f"python -m workshop_lib.diagnose PID")
    return jobs[0]


def pyspy_exe() -> str:
    """py-spy on PATH, else the one installed beside this Python (a venv that is not activated)."""
    return shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))


def pyspy_stack(pid: int, show_all: bool = False, timeout: float = 20.0) -> list[str]:
    """The main thread's frames (outermost first) from ``py-spy dump``; raises RuntimeError if it cannot."""
    # A Jupyter kernel asks child processes for colours (FORCE_COLOR); plain text parses, and reads in a log.
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")} | {"NO_COLOR": "1"}
    try:
        done = subprocess.run([pyspy_exe(), "dump", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RuntimeError(f"py-spy did not run ({err})") from None
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip() or done.stdout.strip() or "py-spy failed").splitlines()[-1][:200])
    frames, in_main = [], False
    for line in _ANSI.sub("", done.stdout).splitlines():
        if line.startswith("Thread "):
            in_main = '"MainThread"' in line or (not frames and f"Thread {pid} " in line)
            continue
        m = _PYSPY_FRAME.match(line)
        if in_main and m:
            frames.append((m["file"], m["line"], m["func"]))
    return _shown(frames[::-1], show_all)


def _shown(frames: list[tuple[str, str, str]], show_all: bool) -> list[str]:
    """'file:line func()' of the frames outside torch and the standard library, and the innermost one."""
    kept = [f for i, f in enumerate(frames) if show_all or not is_library(f[0]) or i == len(frames) - 1]
    return [f"{short(file)}:{line} {func}()" for file, line, func in kept]


def _catches_sigusr1(pid: int) -> bool:
    """Does the process handle SIGUSR1 (hangwatch's faulthandler)? Unhandled, the signal would kill it."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.M).group(1), 16)
    return bool(caught >> (signal.SIGUSR1 - 1) & 1)


def signal_stack(pid: int, show_all: bool = False, wait: float = 5.0) -> tuple[list[str], str]:
    """SIGUSR1: faulthandler writes the stack to the rank's stderr (at once, even while it waits in C++); read back
    if stderr is a file, once the main thread's block (naming ``<module>``) is there and stopped growing."""
    if not hasattr(signal, "SIGUSR1") or not _catches_sigusr1(pid):
        raise RuntimeError("the rank has no SIGUSR1 handler (start the job with -m workshop_lib.watch for one)")
    try:
        log = Path(os.readlink(f"/proc/{pid}/fd/2"))
    except OSError:
        log = None
    start = log.stat().st_size if log is not None and log.is_file() else None
    os.kill(pid, signal.SIGUSR1)
    if start is None:
        return [], f"sent SIGUSR1: the stack is in the rank's stderr ({log or 'not a file'})"
    text, deadline = "", time.monotonic() + wait
    while time.monotonic() < deadline:
        time.sleep(0.05)
        with open(log, errors="replace") as f:
            f.seek(start)
            now = f.read()
        if now == text and "<module>" in now:
            break
        text = now
    # faulthandler prints each thread, innermost first; the main thread's block is the one naming <module>.
    blocks = re.split(r"\n(?=Thread 0x|Current thread 0x)", text)
    main = next((b for b in blocks if "<module>" in b), blocks[-1] if blocks else "")
    frames = [(m["file"], m["line"], m["func"]) for m in map(_FAULT_FRAME.match, main.splitlines()) if m]
    return _shown(frames[::-1], show_all), f"SIGUSR1 -> {log}"


def stacks(workers: dict[int, int], use_pyspy: bool = True, show_all: bool = False) -> list[Rank]:
    ranks = []
    for rank, pid in sorted(workers.items()):
        why = ""
        if use_pyspy:
            try:
                ranks.append(Rank(rank, pid, pyspy_stack(pid, show_all), "py-spy"))
                continue
            except RuntimeError as err:
                why = f"py-spy: {err}; "
        try:
            frames, how = signal_stack(pid, show_all)
            ranks.append(Rank(rank, pid, frames, why + how))
        except (RuntimeError, OSError) as err:
            ranks.append(Rank(rank, pid, [], f"{why}no stack: {err}"))
    return ranks


def side_by_side(ranks: Sequence[Rank], width: int | None = None) -> str:
    """One column per rank, outermost frame at the top, the deepest frames aligned at the bottom."""
    width = width or max(30, (shutil.get_terminal_size((160, 20)).columns - 3 * len(ranks)) // max(len(ranks), 1))
    cols = [[f"rank {r.rank} (pid {r.pid})", "-" * min(width, 40)] +
            [piece for frame in r.frames for piece in textwrap.wrap(frame, width) or [""]] for r in ranks]
    height = max(len(c) for c in cols)
    cols = [c[:2] + [""] * (height - len(c)) + c[2:] for c in cols]  # pad above the frames: innermost rows line up
    rows = [" | ".join(c[i].ljust(width) for c in cols).rstrip() for i in range(height)]
    notes = [f"rank {r.rank}: {r.how}" for r in ranks if r.how != "py-spy"]
    return "\n".join(rows + notes)


def main(argv: Sequence[str] | None = None) -> str:
    p = argparse.ArgumentParser(prog="python -m workshop_lib.diagnose", description=__doc__.splitlines()[0])
    p.add_argument("pid", nargs="?", type=int, help="torchrun's pid or a rank's (default: the only local job)")
    p.add_argument("--all", action="store_true", help="show torch's and the standard library's frames too")
    p.add_argument("--no-py-spy", dest="pyspy", action="store_false", help="use the SIGUSR1 fallback only")
    p.add_argument("--width", type=int, default=None, help="characters per column")
    args = p.parse_args(argv)
    agent, workers = find_workers(args.pid)
    if not workers:
        raise WorkshopError(f"torchrun {agent} has no running ranks (finished, or still starting); try again")
    text = f"torchrun pid {agent}: {len(workers)} rank(s); each rank's main thread, outermost frame first\n"
    text += side_by_side(stacks(workers, args.pyspy, args.all), args.width)
    print(text, flush=True)
    return text
