"""What the ranks of notebook_launch leave behind: each rank's log, a line per failed rank, where each was at a timeout."""

from __future__ import annotations

import json
import subprocess
import traceback
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


def record_failure(log_dir: str, rank: int, err: BaseException) -> None:
    """In a failing rank: its one line, 'rank R raised X: message (File ..., line N, in f)' naming the innermost line
    of the learner's code, and torch's whole message."""
    from workshop_lib.debug import frames

    stack = traceback.extract_tb(err.__traceback__)
    last = frames.raised_at(err) or (stack[-1] if stack else None)  # the learner's line, not torch's inside it
    where = f' (File "{last.filename}", line {last.lineno}, in {last.name})' if last else ""
    line = f"rank {rank} raised {type(err).__name__}: {first_line(err, 10_000) or '?'}{where}"
    (Path(log_dir) / f"rank{rank}.error").write_text(json.dumps({"line": line, "detail": str(err)[:4000]}))


def _recorded(log_dir: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(log_dir).glob("rank*.error"))]


def failures(log_dir: str, result) -> list[str]:
    """One line per failed rank: what it raised (:func:`record_failure`), else how its process ended."""
    lines = [r["line"] for r in _recorded(log_dir)]
    if not lines:  # killed, or ended without raising (os._exit, a crash in C)
        lines = [f"rank {rank} failed with exit code {code}" for rank, code in sorted(result.failed.items())]
    return lines or ["a rank failed"]


def details(log_dir: str) -> list[str]:
    """torch's whole message, for each rank that raised."""
    return [r["detail"] for r in _recorded(log_dir)]


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
    stacks = Path(log_dir) / "stacks.log"
    if stacks.is_file():  # after a timeout: where every process was
        parts.append(f"===== stacks at the timeout (py-spy dump --native)\n{stacks.read_text(errors='replace')}")
    path.write_text("\n".join(parts))
    return "\n".join([f"notebook_launch of {name} failed:", *failures, f"every rank's output: {path}"])
