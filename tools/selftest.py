"""Is this machine ready for the lab? One command, a few seconds, one line::

    python -m tools.selftest

It checks what the lab needs, the slow parts at the same time:

* torch imports;
* two Gloo ranks all-reduce: two fresh Python processes join one group (on a file store, so no port is
  needed) and sum ``rank + 1``; 30 s at most;
* the dataset is there: the shipped table (the default of ``--data``) with its SMILES and labels;
* JupyterLab starts: a real server on a free local port, stopped as soon as it serves the lab's page; 60 s at most;
* the lab's JupyterLab settings are installed (``python -m tools.jupyter_settings``).

It prints ``ready: ...`` and exits 0, or ``not ready: ...`` naming each thing that is missing and its fix,
in one line, and exits 1.
"""

from __future__ import annotations

import csv
import json
import os
import secrets
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


def check_torch() -> Result:
    try:
        import torch
    except Exception as err:  # an ImportError, or a broken wheel failing in its own way
        return Result(False, f"torch does not import ({type(err).__name__}: {err}): {INSTALL}")
    return Result(True, f"torch {torch.__version__}")


def check_all_reduce(timeout: float = 30.0, rank_code: str = RANK) -> Result:
    """Two processes, one Gloo group, one all-reduce; stopped after ``timeout`` s."""
    from workshop_lib.lab.processes import kill_tree

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
    return Result(True, f"2 Gloo ranks all-reduced in {seconds:.1f} s")


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
    return Result(True, f"{shown}: {rows:,} molecules")


def check_jupyterlab(timeout: float = 60.0, command: list[str] | None = None) -> Result:
    """A real JupyterLab server: started, asked for the lab's page, stopped."""
    from workshop_lib.lab.launch import free_port
    from workshop_lib.lab.processes import kill_tree

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
                                                f"{time.monotonic() - start:.1f} s")
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


def run() -> list[Result]:
    """Every check; the two that start processes run at the same time."""
    results = [check_torch()]
    with ThreadPoolExecutor(2) as pool:
        lab = pool.submit(check_jupyterlab)
        reduce = pool.submit(check_all_reduce) if results[0].ok else None
        results += [reduce.result()] if reduce else []
        results += [check_dataset(), lab.result(), check_settings()]
    return results


def verdict(results: list[Result]) -> tuple[int, str]:
    """(exit code, the one line)."""
    failed = [r.text for r in results if not r.ok]
    if failed:
        return 1, "not ready: " + "; and ".join(failed)
    return 0, "ready: " + "; ".join(r.text for r in results)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        raise SystemExit(f"usage: python -m tools.selftest (no arguments; got {' '.join(argv)})")
    code, line = verdict(run())
    print(line, file=sys.stderr if code else sys.stdout, flush=True)
    raise SystemExit(code)


if __name__ == "__main__":
    from workshop_lib.lab.cli import run_cli

    raise SystemExit(run_cli(main))
