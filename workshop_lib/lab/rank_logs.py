"""What the ranks of notebook_launch leave behind: each rank's log, a line per failed rank, where each was at a timeout."""

from __future__ import annotations

import subprocess
from pathlib import Path

from workshop_lib.errors import first_line


def dump_stacks(path: Path) -> None:
    """Where each rank is stuck, before the launcher kills them: py-spy's dump of every child, native frames too."""
    import psutil

    from workshop_lib.debug.stacks import pyspy_dump

    parts = []
    for child in psutil.Process().children(recursive=True):  # the ranks, and any process a rank started
        try:
            done = pyspy_dump(child.pid, native=True, timeout=15)
            parts.append(f"----- pid {child.pid}\n{done.stdout}{done.stderr}")
        except (OSError, subprocess.TimeoutExpired, psutil.Error) as err:
            parts.append(f"----- pid {child.pid}: no stack ({err})")
    path.write_text("\n".join(parts) or "no child processes left")


def failures(err) -> list[str]:
    """One line per failed rank: 'rank R raised X: message (File ..., line N, in f)', or its exit code."""
    lines = []
    for rank, failure in sorted(err.failures.items()):
        msg = failure.message
        if isinstance(msg, dict):
            stack = msg.get("extraInfo", {}).get("py_callstack", "").strip().splitlines()
            where = next((s.strip() for s in reversed(stack) if s.strip().startswith("File ")), "")
            first = first_line(str(msg.get("message", "?")), 10_000) or "?"
            lines.append(f"rank {rank} raised {first}" + (f" ({where})" if where else ""))
        else:
            lines.append(f"rank {rank} failed with exit code {failure.exitcode}")
    return lines or ["a rank failed"]


def rank_logs(log_dir: str) -> dict[int, str]:
    """{rank: everything it printed}."""
    return {int(p.stem[4:]): p.read_text(errors="replace") for p in sorted(Path(log_dir).glob("rank*.log"))}


def show_rank0(log_dir: str) -> None:
    text = rank_logs(log_dir).get(0, "")
    if text:
        print(text, end="" if text.endswith("\n") else "\n", flush=True)


def failure_report(name: str, failures: list[str], log_dir: str) -> str:
    """The failed ranks, one line each, and the file with every rank's output (kept for reading)."""
    path = Path(log_dir) / "all.log"
    parts = [f"===== rank {rank}\n{text}" for rank, text in sorted(rank_logs(log_dir).items())]
    launcher = Path(log_dir) / "launcher.log"
    if launcher.is_file():
        parts.append(f"===== torch's launcher\n{launcher.read_text(errors='replace')}")
    stacks = Path(log_dir) / "stacks.log"
    if stacks.is_file():  # after a timeout: where every process was
        parts.append(f"===== stacks at the timeout (py-spy dump --native)\n{stacks.read_text(errors='replace')}")
    path.write_text("\n".join(parts))
    return "\n".join([f"notebook_launch of {name} failed:", *failures, f"every rank's output: {path}"])
