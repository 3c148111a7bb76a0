"""A step script under torchrun from a notebook cell (:func:`torchrun`), as a learner would run it in a terminal.

The hang watch is attached from outside (``-m workshop_lib.watch``); rank 0's lines and a progress bar are shown,
and rank 0's metrics.json returned. (A function defined in the notebook runs through :mod:`~.forklaunch`.)
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from workshop_lib.config import TrainConfig
from workshop_lib.errors import WorkshopError
from workshop_lib.launching import ends
from workshop_lib.launching.processes import kill_tree
from workshop_lib.paths import lab_root, shown

TAIL_LINES = 40
WATCH = ("-m", "workshop_lib.watch")  # torchrun's way to run a module: the script then runs with the hang watch
_RANK_PREFIX = re.compile(r"^\[(?P<role>[A-Za-z_]+)(?P<rank>\d+)\]:(?P<text>.*)$")
_EPOCH_LINE = re.compile(r"^epoch (\d+)/(\d+)\s")


class LaunchError(WorkshopError):
    """A launched job failed or timed out; the message ends with the tail of its output."""

    def __init__(self, message: str, output: Sequence[str] = ()):
        super().__init__(message)
        self.output = list(output)


class RunResult(dict):
    """Rank 0's metrics.json (empty when the script writes none), plus how the run went."""

    command: str  # what you would type in a terminal at the repository root
    output: list[str]  # every line of every rank, as "[rank N] text"
    seconds: float  # wall time of the whole launch, start-up included

    def rank_lines(self, rank: int = 0) -> list[str]:
        """The lines one rank printed, without the label."""
        tag = f"[rank {rank}] "
        return [line[len(tag):] for line in self.output if line.startswith(tag)]


def _resolve(path: str | os.PathLike) -> Path:
    """Relative to the clone's root (:func:`~workshop_lib.paths.lab_root`), as in the printed command."""
    return (lab_root() / path).resolve()  # an absolute path stays itself


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _reader(stream, lines: queue.Queue) -> None:
    for line in stream:
        # torchrun's --tee writes each rank's stdout and stderr through separate pipes: on a busy machine a
        # line's "[default0]:" prefix can land before the previous line's newline. Split such lines again; an
        # empty fragment so split off is dropped.
        line = line.rstrip("\n").rsplit("\r", 1)[-1]
        m = _RANK_PREFIX.match(line)
        role = re.escape(m.group("role")) if m else None  # torchrun's role ("default"), not a rank's own "[rank0]:"
        first, *rest = re.split(rf"(?<=.)(?=\[{role}\d+\]:)", line) if role else [line]
        lines.put(first)
        for fragment in rest:
            if _RANK_PREFIX.fullmatch(fragment).group("text"):
                lines.put(fragment)
    lines.put(None)


class _EpochBar:
    """A tqdm bar (a widget in Jupyter) advanced by rank 0's "epoch k/N" lines."""

    def __init__(self, epochs: int, enabled: bool):
        self.bar = self._display = None
        if enabled:
            from tqdm.auto import tqdm
            from tqdm.notebook import tqdm as notebook_tqdm

            if issubclass(tqdm, notebook_tqdm):  # a widget: shown with a display id, so close() can replace it
                from IPython.display import display

                self.bar = tqdm(total=epochs, desc="epochs", unit="epoch", display=False)
                self._display = display(self.bar.container, display_id=True)
            else:
                self.bar = tqdm(total=epochs, desc="epochs", unit="epoch", file=sys.stderr)

    def feed(self, text: str) -> None:
        m = _EPOCH_LINE.match(text)
        if self.bar is not None and m:
            self.bar.total = int(m.group(2))
            self.bar.update(int(m.group(1)) - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            final = str(self.bar)  # "epochs: 100%|...| 2/2 [...]"
            self.bar.close()
            if self._display is not None:
                # JupyterLab keeps drawing the widget (now at 100%); the text a saved notebook falls back
                # to is the final state, not the "0/2" of the first display.
                view = {"version_major": 2, "version_minor": 0, "model_id": self.bar.container.model_id}
                self._display.update({"application/vnd.jupyter.widget-view+json": view, "text/plain": final},
                                     raw=True)
            self.bar = None  # closed once, however many paths close it (Ctrl-C, then finally)


def torchrun(script: str | os.PathLike, nproc: int = 2, args: Sequence[object] = (), out: str | os.PathLike | None = None,
             timeout: float = 600, progress: bool = True, show: str | None = "rank0", watch: bool = True,
             env: dict[str, str] | None = None) -> RunResult:
    """Run ``torchrun --standalone --nproc_per_node=NPROC [-m workshop_lib.watch] SCRIPT ARGS`` (:func:`start_job`);
    return rank 0's metrics.

    Paths are relative to the repository root. ``--out``: from ``args``, else ``out``, else a fresh folder under
    runs/ (``out=False``: none). ``show``: "rank0" prints rank 0's lines, "all" every line with its rank, None
    nothing (read ``result.output``). ``env``: more variables, e.g. ``{"CUDA_VISIBLE_DEVICES": ""}``.
    """
    if show not in ("rank0", "all", None):
        raise WorkshopError(f"show={show!r} is not an option; use show='rank0', 'all' or None")
    script, args, out_dir = _arguments(script, args, out)
    epochs = int(_flag_value(args, "--epochs") or TrainConfig().epochs)
    command = torchrun_command(shown(script), nproc, watch=watch, args=args)
    print(f"$ {command}", flush=True)
    log_dir = tempfile.mkdtemp(prefix="torchrun-logs-")
    start, started_at = time.perf_counter(), time.time()
    # --tee 3 copies every rank's stdout and stderr to our pipe, each line prefixed "[default<rank>]:".
    proc = start_job(script, args, nproc, ["--tee", "3", "--log-dir", log_dir], env=env, watch=watch)
    bar = _EpochBar(epochs, progress)
    try:
        output = _follow(proc, show, bar, start + timeout, timeout)
    except KeyboardInterrupt:  # the notebook's stop button, or Ctrl-C: stop every rank as a terminal's Ctrl-C would
        kill_tree(proc, first=signal.SIGINT)
        bar.close()
        print(_interrupted(out_dir), file=sys.stderr, flush=True)
        raise
    except BaseException:
        kill_tree(proc)
        raise
    finally:
        bar.close()
    if proc.returncode != 0:
        raise LaunchError(_failure(f"exited with code {proc.returncode} (torchrun logs: {log_dir})", output,
                                   rank_ends(Path(log_dir), output)), output)
    shutil.rmtree(log_dir, ignore_errors=True)
    result = RunResult()
    written = out_dir / "metrics.json" if out_dir is not None else None
    if written and written.is_file() and written.stat().st_mtime >= started_at - 1:  # not an old run's
        from workshop_lib.metrics import read_metrics

        result.update(read_metrics(written))
    result.command, result.output, result.seconds = command, output, time.perf_counter() - start
    return result


def _arguments(script: str | os.PathLike, args: Sequence, out: str | os.PathLike | bool | None) -> tuple:
    """(the script's path, its arguments with --out added where it applies, the out directory)."""
    script = _resolve(script)
    if not script.is_file():
        raise WorkshopError(f"script {shown(script)} not found; check the path (relative to {lab_root()})")
    args = [str(a) for a in args]
    if out is not False and _flag_value(args, "--out") is None:
        if out is None:
            (lab_root() / "runs").mkdir(exist_ok=True)
            out = tempfile.mkdtemp(prefix=f"{script.stem}-", dir=lab_root() / "runs")
        args += ["--out", shown(_resolve(out))]
    return script, args, _resolve(given) if (given := _flag_value(args, "--out")) else None


def torchrun_argv(script: str | os.PathLike, nproc: int | None = 2, *, standalone: bool = True,
                 nnodes: int | None = None, rdzv: tuple[str, str, str] | None = None, flags: Sequence[object] = (),
                 module: bool = False, watch: bool | Sequence[object] = False, args: Sequence[object] = (),
                 python: str | os.PathLike = sys.executable) -> list[str]:
    """The project's one torchrun command line: ``[python, -m, torch.distributed.run, FLAGS, TARGET, ARGS]``.

    FLAGS: ``--standalone`` (one node, its rendezvous on a free port; ``standalone=False`` for several nodes, or
    where ``flags`` name a rendezvous of their own), ``--nnodes``, ``--nproc_per_node`` (``nproc=None``: ``flags``
    name it, a learner's as written), ``rdzv`` = (backend, endpoint, id), then ``flags`` as given
    (``--max-restarts=1``, ``--tee 3``). TARGET: ``script``, or ``-m script`` (``module``), after
    ``-m workshop_lib.watch`` and the watch's own options (``watch``: True, or those options).
    :func:`torchrun_command` is the same line as typed in a terminal.
    """
    assert not (standalone and (nnodes or rdzv)), "--standalone is one node's rendezvous: several nodes name theirs"
    watching = [*WATCH, *map(str, () if isinstance(watch, bool) else watch)] if watch else []
    rendezvous = [f"--rdzv-backend={rdzv[0]}", f"--rdzv-endpoint={rdzv[1]}", f"--rdzv-id={rdzv[2]}"] if rdzv else []
    return [str(python), "-m", "torch.distributed.run", *(["--standalone"] if standalone else []),
            *([f"--nnodes={nnodes}"] if nnodes else []), *([f"--nproc_per_node={nproc}"] if nproc else []),
            *rendezvous, *map(str, flags), *watching, *(["-m"] if module else []), str(script), *map(str, args)]


def torchrun_command(script: str | os.PathLike, nproc: int | None = 2, **options) -> str:
    """:func:`torchrun_argv`'s line as a learner types it: ``torchrun ...``, quoted for a shell."""
    return shlex.join(["torchrun", *torchrun_argv(script, nproc, **options)[3:]])


def start_job(script: Path | str, args: Sequence[str], nproc: int | None = 2, torchrun_flags: Sequence[str] = (),
              env: dict[str, str] | None = None, watch: bool = False, **options) -> subprocess.Popen:
    """:func:`torchrun_argv` of ``script args`` (one node, unless ``options`` say otherwise), in a session of its own.

    The lab's one way to start a job: one thread per rank unless OMP_NUM_THREADS says otherwise, its lines on a
    pipe. Stop it with :func:`workshop_lib.launching.processes.kill_tree`.
    """
    argv = torchrun_argv(script, nproc, flags=torchrun_flags, watch=watch, args=args, **options)
    full_env = {"OMP_NUM_THREADS": "1", **os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen(argv, cwd=lab_root(), env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True, bufsize=1)


def _follow(proc: subprocess.Popen, show: str | None, bar, deadline: float, timeout: float) -> list[str]:
    """Read the job's lines until it ends, labelled by rank; show them as asked and feed rank 0's to the bar."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    output: list[str] = []
    while True:
        try:
            raw = lines.get(timeout=max(0.0, min(1.0, deadline - time.perf_counter())))
        except queue.Empty:
            if time.perf_counter() >= deadline:
                kill_tree(proc)
                raise LaunchError(_failure(f"timed out after {timeout:g}s; stopped every rank", output),
                                  output) from None
            continue
        if raw is None:
            break
        m = _RANK_PREFIX.match(raw)
        rank, text = (int(m.group("rank")), m.group("text")) if m else (None, raw)
        line = f"[rank {rank}] {text}" if rank is not None else f"[torchrun] {text}"
        output.append(line)
        if rank == 0:
            bar.feed(text)
        if show == "all":
            print(line, flush=True)
        elif show == "rank0" and rank == 0:
            print(text, flush=True)
    proc.wait(timeout=30)
    return output


def _interrupted(out_dir: Path | None) -> str:
    """What an interrupted launch leaves, and how to go on."""
    if out_dir is not None and (snapshot := out_dir / "snapshot.pt").is_file():
        return (f"interrupted: every rank stopped; the last whole snapshot is {shown(snapshot)}: "
                f"run the same command again to resume from it")
    return "interrupted: every rank stopped"


def _failure(what: str, output: Sequence[str], ended: Sequence[dict] = ()) -> str:
    """How each rank ended (:func:`rank_ends`, a line each), then the ranks' last lines; torchrun's own only if the
    ranks said nothing."""
    ranks = [line for line in output if line.startswith("[rank ")]
    tail = ranks[-TAIL_LINES:] or output[-TAIL_LINES:]
    said = "".join(f"\n{ends.summary(end)}" for end in ended)
    if not tail:
        return f"torchrun {what}{said}; no rank printed anything"
    return f"torchrun {what}{said}\nLast lines:\n" + "\n".join(tail)


# torchrun's summary of the failed workers (torch.distributed.elastic.multiprocessing.errors' template):
# "  rank      : 1 (local_rank: 1)", then "  exitcode  : -6 (pid: 123) (SIGABRT)".
_SUMMARY_RANK = re.compile(r"^\s*rank\s*: (\d+) \(local_rank: \d+\)")
_SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*: (-?\d+) \(pid: \d+\)")
def rank_ends(log_dir: Path, output: Sequence[str]) -> list[dict]:
    """The end record (:mod:`~.ends`) of each rank of the last attempt that raised or died, the culprits first
    (one node: local = global).

    From torchrun's ``--log-dir``: a rank's ``error.json`` (its Python error, written by ``@record``), else, for a rank
    torchrun's summary names with an exit code of its own, that code and the last lines of its stderr (an abort in
    C++: gloo's "collective mismatch"); ordered by when its stderr was last written. A rank torchrun stopped (SIGTERM,
    no error of its own) is left out: it is the failure's consequence."""
    import json

    exits, rank = {}, None
    for line in output:
        text = line.removeprefix("[torchrun] ")
        if m := _SUMMARY_RANK.match(text):
            rank = int(m[1])
        elif rank is not None and (m := _SUMMARY_EXIT.match(text)):
            exits[rank], rank = int(m[1]), None
    attempts = sorted(log_dir.glob("*/attempt_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    found = []
    for folder in attempts[-1].iterdir() if attempts else ():
        if not folder.name.isdigit():
            continue
        rank, error, stderr = int(folder.name), folder / "error.json", folder / "stderr.log"
        when = stderr.stat().st_mtime if stderr.is_file() else float("inf")
        if error.is_file():  # torch's "Type: message" as @record wrote it
            message = json.loads(error.read_text()).get("message", {})
            said = (message.get("message") if isinstance(message, dict) else str(message)) or "?"
            kind, _, text = said.splitlines()[0].partition(": ")
            found.append({"rank": rank, "how": "raised", "type": kind, "message": text[:400], "time": when})
        elif rank in exits and exits[rank] != -signal.SIGTERM:
            found.append(ends.killed(rank, exits[rank], stderr))
    return ends.culprits_first(found)


def free_port() -> int:
    """A port free a moment ago, for what must know its port before it starts (a second node, a JupyterLab server).

    Where a program can bind port 0 itself (torchrun --standalone), let it: another process can take this one first.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
