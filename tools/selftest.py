"""Is this machine ready for the lab? One command, a few seconds, one line for the instructor::

    python -m tools.selftest

It checks what the lab needs, the slow parts at the same time:

* torch imports; Python is 3.10 or newer; this process may use 2 CPU cores or more;
* ``torchrun`` is on ``PATH`` and is this environment's (the one a terminal's ``torchrun`` line starts);
* two Gloo ranks join one group and all-reduce: two fresh Python processes (on a file store, so no port is
  needed) sum ``rank + 1``; 30 s at most;
* the dataset is there: the shipped table (the default of ``--data``) with its SMILES and labels;
* JupyterLab starts: a real server on a free local port, stopped as soon as it serves the lab's page; 60 s at most;
  and its ``python3`` kernel runs this environment's Python;
* the lab's JupyterLab settings are installed (``python -m tools.jupyter_settings``).

Run from a notebook's cell (``!python -m tools.selftest``, 00's last cell), it finds the kernel among its parent
processes and checks that the kernel is this environment's Python, instead of starting a second JupyterLab;
``--kernel PYTHON`` names a kernel's Python by hand.

It prints ``DDP-WORKSHOP READY: torch 2.13.0, python 3.11, 2 cores, ..., linux`` and exits 0, or
``DDP-WORKSHOP NOT READY: ...`` naming each thing that is missing and its fix (then, in brackets, what the machine
is), in one line, and exits 1. The learner sends that line to the instructor (00 ends with it).
"""

from __future__ import annotations

import csv
import json
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tools import ROOT

INSTALL = "pip install torch==2.13.0 -e \".[lab]\" (the set-up page)"
ACTIVATE = "activate the environment: . .venv/bin/activate, or conda activate ddp-workshop"
HEAD = "DDP-WORKSHOP"  # the line's first word: an instructor finds the lines among the mails and the form's answers

# One rank: join a group of 2 on a file store, all-reduce rank + 1, print the sum.
RANK = """\
import datetime, sys
import torch, torch.distributed as dist
rank, path = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", store=dist.FileStore(path, 2), rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=float(sys.argv[3])))
value = torch.tensor([rank + 1.0])
dist.all_reduce(value)
dist.destroy_process_group()
print(value.item())
"""


@dataclass
class Result:
    ok: bool
    text: str  # what was found, or what is missing and the fix
    brief: str | None = None  # what the ready line says of it ("2 cores"); None: the line leaves it out


def check_torch() -> Result:
    try:
        import torch
    except Exception as err:  # an ImportError, or a broken wheel failing in its own way
        return Result(False, f"torch does not import ({type(err).__name__}: {err}): {INSTALL}")
    return Result(True, f"torch {torch.__version__}", f"torch {torch.__version__}")


def check_python(version: tuple[int, ...] = sys.version_info[:3]) -> Result:
    shown = ".".join(str(v) for v in version[:2])
    if tuple(version[:2]) < (3, 10):
        return Result(False, f"python {shown}: the lab needs 3.10 or newer (the set-up page)")
    return Result(True, f"python {shown}", f"python {shown}")


def check_cores(cores: int | None = None) -> Result:
    """The CPU cores this process may run on (a cluster's allocation, a container's limit): the lab runs 2 ranks."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cores < 2:
        return Result(False, f"{cores} CPU core for this process: the lab's runs start 2 ranks; ask for 2 cores or more")
    return Result(True, f"{cores} CPU cores", f"{cores} cores")


def _prefix(python: str) -> str | None:
    """The environment (``sys.prefix``) of the Python at ``python``; None if it does not run."""
    try:
        out = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _same_environment(python: str) -> bool:
    return Path(python).absolute() == Path(sys.executable).absolute() or _prefix(python) == sys.prefix


def check_torchrun(path: str | None = None) -> Result:
    """``torchrun`` on PATH (or ``path``), started by this environment's Python (its first line says which)."""
    found = path or shutil.which("torchrun")
    if found is None:
        return Result(False, f"torchrun not on PATH ({ACTIVATE})")
    try:
        first = Path(found).read_bytes()[:300].split(b"\n")[0].decode(errors="replace")
    except OSError:
        first = ""
    if first.startswith("#!"):  # a script (pip writes one per entry point); an .exe launcher (Windows) is not read
        words = first[2:].split()
        python = shutil.which(words[1]) if words and Path(words[0]).name == "env" and len(words) > 1 else (
            words[0] if words else "")
        if python and not _same_environment(python):
            return Result(False, f"torchrun on PATH ({found}) is another environment's, not {sys.prefix}'s "
                                 f"({ACTIVATE})")
    return Result(True, f"torchrun on PATH ({found})", "torchrun on PATH")


def check_kernel(python: str | None = None) -> Result:
    """The notebook's kernel runs this environment's Python: ``python`` (the kernel's, given from a notebook), else
    the one JupyterLab's ``python3`` kernel starts (a bare ``python`` there is JupyterLab's own, this one)."""
    if python is None:
        try:
            from jupyter_client.kernelspec import KernelSpecManager

            argv = KernelSpecManager().get_kernel_spec("python3").argv
        except Exception as err:  # no jupyter_client, or no python3 kernel
            return Result(False, f"JupyterLab has no python3 kernel ({type(err).__name__}: {err}): {INSTALL}")
        python = argv[0]
        if python in {"python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}"}:
            return Result(True, "the python3 kernel runs this environment's Python", "kernel: this environment")
    if not _same_environment(python):
        return Result(False, f"the notebook's kernel runs {python}, not this environment's Python ({sys.executable}):"
                             f" pick this environment's kernel (Kernel, Change Kernel), or start JupyterLab after you "
                             f"{ACTIVATE.replace('activate the environment: ', 'activate it: ')}")
    return Result(True, f"the notebook's kernel runs {python}", "kernel: this environment")


def check_all_reduce(timeout: float = 30.0, rank_code: str = RANK) -> Result:
    """Two processes, one Gloo group, one all-reduce; stopped after ``timeout`` s."""
    from workshop_lib.launching.processes import kill_tree

    start = time.monotonic()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    with tempfile.TemporaryDirectory(prefix="selftest-") as tmp:
        ranks = [subprocess.Popen([sys.executable, "-c", rank_code, str(r), str(Path(tmp) / "store"), str(timeout)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for r in (0, 1)]
        try:
            outs = [p.communicate(timeout=max(0.1, timeout - (time.monotonic() - start))) for p in ranks]
        except subprocess.TimeoutExpired:
            for p in ranks:
                kill_tree(p, grace=0)
            return Result(False, f"2 Gloo ranks did not all-reduce within {timeout:.0f} s: a firewall or a hostname "
                                 "that does not resolve can stop Gloo; try GLOO_SOCKET_IFNAME=lo (lo0 on macOS)")
        finally:
            for p in ranks:
                if p.poll() is None:
                    kill_tree(p, grace=0)
    seconds = time.monotonic() - start
    for r, (p, (out, err)) in enumerate(zip(ranks, outs, strict=True)):
        if p.returncode != 0:
            last = next((line for line in reversed(err.strip().splitlines()) if line.strip()), f"exit {p.returncode}")
            return Result(False, f"2 Gloo ranks did not all-reduce: rank {r} failed ({last.strip()[:200]})")
        if out.strip() != "3.0":
            return Result(False, f"2 Gloo ranks all-reduced 1 + 2 to {out.strip()!r} on rank {r}, not 3.0")
    return Result(True, f"2 Gloo ranks all-reduced in {seconds:.1f} s", f"gloo 2-rank join {seconds:.1f} s")


def check_dataset(path: Path | None = None) -> Result:
    """The table ``path`` (default: the one the scripts read, ``TrainConfig().data``) holds the lab's columns."""
    if path is None:
        from workshop_lib.config import TrainConfig

        path = Path(TrainConfig().data)
    shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
    if not path.is_file():
        return Result(False, f"{shown} is missing: it ships with the package; install it again: {INSTALL}")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"smiles", "p_np"} - set(reader.fieldnames or [])
        rows = sum(1 for _ in reader)
    if missing or rows == 0:
        return Result(False, f"{shown} is not the lab's table (columns {reader.fieldnames}, {rows} rows): "
                             f"install it again: {INSTALL}")
    return Result(True, f"{shown}: {rows:,} molecules", f"data {rows:,} molecules")


def check_jupyterlab(timeout: float = 60.0, command: list[str] | None = None) -> Result:
    """A real JupyterLab server: started, asked for the lab's page, stopped."""
    from workshop_lib.launching.launch import free_port
    from workshop_lib.launching.processes import kill_tree

    port, token = free_port(), secrets.token_hex(8)
    command = command or [sys.executable, "-m", "jupyterlab"]
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="selftest-lab-") as tmp:
        log = Path(tmp) / "jupyterlab.log"
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": tmp}
        try:
            server = subprocess.Popen(
                [*command, "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
                 "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT}",
                 *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])],
                stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
        except OSError as err:
            return Result(False, f"JupyterLab does not start ({err}): {INSTALL}")
        try:
            while time.monotonic() - start < timeout:
                if server.poll() is not None:
                    last = (log.read_text(errors="replace").strip().splitlines() or [f"exit {server.returncode}"])[-1]
                    return Result(False, f"JupyterLab does not start ({last.strip()[:200]}): {INSTALL}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=5) as page:
                        if page.status == 200:
                            return Result(True, f"JupyterLab {_version(command)} started in "
                                                f"{time.monotonic() - start:.1f} s", f"JupyterLab {_version(command)}")
                except OSError:
                    time.sleep(0.3)
            return Result(False, f"JupyterLab did not answer within {timeout:.0f} s (its log: the same command "
                                 f"by hand, jupyter lab --no-browser)")
        finally:
            kill_tree(server, grace=5)


def _version(command: list[str]) -> str:
    try:
        from importlib.metadata import version

        return version("jupyterlab")
    except Exception:
        return " ".join(command)


def check_settings(config_dir: Path | None = None) -> Result:
    from tools import jupyter_settings

    target = Path(config_dir or Path(sys.prefix) / "etc" / "jupyter") / "labconfig" / jupyter_settings.SHIPPED.name
    wanted = json.loads(jupyter_settings.SHIPPED.read_text())
    try:
        have = json.loads(target.read_text())
    except (OSError, ValueError):
        have = {}
    if any(have.get(plugin, {}).get(k) != v for plugin, settings in wanted.items() for k, v in settings.items()):
        return Result(False, "the lab's JupyterLab settings are not installed: python -m tools.jupyter_settings")
    return Result(True, "the lab's JupyterLab settings installed")


def notebook_kernel() -> str | None:
    """The Python of the Jupyter kernel this process was started from (a ``!`` line of a notebook's cell), as the
    kernel was launched (its first argument, not the file a venv's link resolves to); None outside a notebook."""
    try:
        import psutil

        for parent in psutil.Process().parents():
            argv = parent.cmdline()
            if any("ipykernel" in a for a in argv[1:3]):
                return argv[0]
    except Exception:  # psutil missing, or a parent gone or not ours to read: no kernel found
        return None
    return None


def run(kernel: str | None = None) -> list[Result]:
    """Every check; the ones that start processes at the same time. ``kernel``: the notebook's kernel's Python (run
    from a notebook, inside a JupyterLab: none is started)."""
    results = [check_torch(), check_python(), check_cores(), check_torchrun()]
    with ThreadPoolExecutor(2) as pool:
        lab = pool.submit(check_jupyterlab) if kernel is None else None
        reduce = pool.submit(check_all_reduce) if results[0].ok else None
        results += [reduce.result()] if reduce else []
        results += [check_dataset()]
        results += [lab.result()] if lab else []
        results += [check_kernel(kernel), check_settings()]
    return results


def verdict(results: list[Result]) -> tuple[int, str]:
    """(exit code, the one line): ready, and what the machine is; or not ready, each thing missing and its fix
    first, then (in brackets) what was found."""
    system = platform.system().lower() or "unknown system"
    failed = [r.text for r in results if not r.ok]
    found = [r.brief for r in results if r.ok and r.brief]
    if failed:
        return 1, f"{HEAD} NOT READY: " + "; and ".join(failed) + f" [{', '.join([*found, system])}]"
    return 0, f"{HEAD} READY: " + ", ".join([*found, system])


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m tools.selftest", description=__doc__.splitlines()[0])
    p.add_argument("--kernel", metavar="PYTHON", help="from a notebook: the kernel's Python (sys.executable); checks "
                                                     "it is this environment's, and starts no JupyterLab")
    args = p.parse_args(argv)
    code, line = verdict(run(args.kernel or notebook_kernel()))
    print(line, flush=True)  # stdout either way: the one line to send, from a terminal or a notebook's cell
    raise SystemExit(code)


if __name__ == "__main__":
    from workshop_lib.cli import run_cli

    raise SystemExit(run_cli(main))
