"""Shared fixtures: tiny CSVs, runners for the step scripts with hard timeouts, and the `slow` marker.

The step scripts run under torchrun. In-process tests call a script's ``main``
in a world of one (:func:`world_of_one`: the variables torchrun would set for one
process, the store on a free port), so its ``init_process_group`` runs as written.

`slow` marks whatever starts processes (torchrun, forked ranks, notebooks): the
quick loop is ``pytest -m "not slow"``. Tests say so with ``@pytest.mark.slow``;
the hook below also marks every nbval notebook cell, and any test whose code
calls one of the process starters, so a test that forgets the mark is still kept
out of the quick loop.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from workshop_lib.launching.launch import torchrun_argv

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = REPO / "solutions"
SHIPPED = REPO / "dataset" / "b3db_classification.csv"  # package data (workshop_lib.dataset, installed)
# What `pip install .` builds the wheel from: the package, its data (dataset/, mapped in pyproject.toml), the build's files.
PACKAGE_SOURCE = ("workshop_lib", "dataset", "pyproject.toml", "setup.py", "README.md", "LICENSE")


def copy_package_source(dest: Path) -> Path:
    """A copy of :data:`PACKAGE_SOURCE` in ``dest``: the build writes build/ and *.egg-info beside its sources."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in PACKAGE_SOURCE:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, dest / name)
    return dest

# A few real molecules (from the shipped table), BBBP's column layout.
BBBP_STYLE = """num,name,p_np,smiles
1,Propanolol,1,[Cl].CC(C)NCC(O)COc1cccc2ccccc12
2,Terbutylchlorambucil,1,C(=O)(OC(C)(C)C)CCCc1ccc(cc1)N(CCCl)CCCl
3,sulphasalazine,0,O=C(O)c1cc(N=Nc2ccc(S(=O)(=O)Nc3ccccn3)cc2)ccc1O
4,moxalactam,0,COC1(NC(=O)C(C(=O)O)c2ccc(O)cc2)C(=O)N2C(C(=O)O)=C(CSc3nnnn3C)COC21
"""


# What torchrun sets in a worker's environment: a child of a test must not inherit it.
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
               "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
               "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
               "TORCHELASTIC_ERROR_FILE", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")


def cpu_env(**extra: str) -> dict[str, str]:
    """Environment for a child process: one thread per rank, no GPU, no torchrun leftovers."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", **extra)
    return env


def run_python(args: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=cpu_env(**env))


def run_torchrun(script: str | Path, args: list[str], nproc: int = 2, timeout: float = 180, flags: tuple = (),
                 **env: str) -> subprocess.CompletedProcess:
    """torchrun --standalone on this machine (``flags``: torchrun's own, more); a hang becomes a TimeoutExpired."""
    cmd = torchrun_argv(script, nproc, flags=flags, args=args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=cpu_env(**env))


def load_step(name: str):
    """A step script of solutions/ as a module (nothing runs: its main is under ``__name__ == "__main__"``)."""
    spec = importlib.util.spec_from_file_location(name, SOLUTIONS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def world_of_one(monkeypatch):
    """torchrun's variables for one process, so a step script's ``main`` joins a real gloo group of one."""
    with one_process_world(monkeypatch):
        yield


@contextlib.contextmanager
def one_process_world(monkeypatch: pytest.MonkeyPatch):
    """:func:`world_of_one`'s setting, for a fixture of a wider scope (its own ``pytest.MonkeyPatch.context()``).

    MASTER_PORT=0: rank 0's store binds a free port itself. One thread, as each rank under torchrun.
    (``@record`` cannot enable faulthandler on pytest's captured stderr: it warns, harmlessly.)
    """
    warnings.filterwarnings("ignore", "Unable to enable fault handler", UserWarning)  # undone after the test
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}.items():
        monkeypatch.setenv(name, value)
    threads = torch_threads(1)
    try:
        yield
    finally:
        torch_threads(threads)


@contextlib.contextmanager
def raises_in_process(exception, match: str | None = None):
    """``pytest.raises`` for a step script's main run in-process, then 0.1 s with the traceback still alive.

    A torch 2.13 deadlock, seen here (1 run of test_checkpoint.py in ~20, under load): when main fails right
    after a collective, its traceback holds the DDP model, whose reducer holds the gloo group. If the traceback
    is dropped before gloo's worker thread has released its last tensor of that collective (it needs the GIL),
    ~ProcessGroupGloo joins that thread while holding the GIL, and both wait for ever. A pause keeps the frames
    (and so the group) alive while the thread finishes; the lab's forked ranks do the same before they leave
    (``workshop_lib.launching.joining.let_gloo_finish``).
    """
    with pytest.raises(exception, match=match) as info:
        yield info
    time.sleep(0.1)


def torch_threads(n: int) -> int:
    """Set torch's intra-op threads; return the number before."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    return before


@pytest.fixture
def bbbp_style_csv(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.csv"
    path.write_text(BBBP_STYLE)
    return path


@pytest.fixture(scope="session")
def small_csv(tmp_path_factory) -> Path:
    """600 shipped molecules, renamed to BBBP's layout (num,name,p_np,smiles)."""
    import pandas as pd

    df = pd.read_csv(SHIPPED).sample(n=600, random_state=0).reset_index(drop=True)
    df.insert(0, "num", range(1, len(df) + 1))
    path = tmp_path_factory.mktemp("data") / "bbbp_layout.csv"
    df.to_csv(path, index=False)
    return path


_STARTS_PROCESSES = re.compile(r"\b(run_torchrun|run_python|torchrun|notebook_launch|Launch|nodes|reference_(metrics|run)|"
                               r"subprocess\.\w+)\(")
_PROCESS_FIXTURES = {"cluster", "step0_twice", "loaded_by", "verdicts"}


def pytest_configure(config) -> None:
    # The run's id, known to this (controlling) process too, so that it can remove what the workers saved under it.
    if not hasattr(config, "workerinput") and getattr(config.option, "testrunuid", "absent") is None:
        import uuid

        config.option.testrunuid = uuid.uuid4().hex


def pytest_sessionfinish(session) -> None:
    if hasattr(session.config, "workerinput"):  # a worker: the controller removes them once every worker is done
        return
    from tests.reliability import remove_reference_runs

    for run_id in {getattr(session.config.option, "testrunuid", None), str(os.getpid())} - {None}:  # xdist's, or none
        remove_reference_runs(run_id)


def _longest_first(items) -> None:
    """Order the files by their measured seconds (tests/durations.json, ``python -m tools.durations``), longest first,
    each file's items in their own order: pytest-xdist (``--dist loadfile --no-loadscope-reorder``) hands the files
    out in this order, so that no long file starts last while the other worker has nothing left."""
    path = REPO / "tests" / "durations.json"
    seconds = json.loads(path.read_text()) if path.is_file() else {}
    items.sort(key=lambda item: seconds.get(item.path.relative_to(REPO).as_posix(), 0.0), reverse=True)  # stable


def pytest_collection_modifyitems(config, items) -> None:
    _longest_first(items)
    gpus = None
    for item in items:
        if item.get_closest_marker("gpu"):
            if gpus is None:
                import torch

                gpus = torch.cuda.device_count()
            if not gpus:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; none is visible"))
        if item.get_closest_marker("slow"):
            continue
        if item.path.suffix == ".ipynb" or _PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
            continue
        function = getattr(item, "function", None)
        try:
            source = inspect.getsource(function) if function is not None else ""
        except (OSError, TypeError):
            source = ""
        if _STARTS_PROCESSES.search(source.split(":", 1)[-1]):  # the body, not the name
            item.add_marker(pytest.mark.slow)


# Torch's own words that differ between the releases CI runs, as (2.15's, 2.13's): tests that quote torch's message
# compare in 2.13's words (in_213_words), so the same assertion holds on both passes.
TORCH_WORDS = (
    ("nccl2 requires at least one CUDA device", "Distributed package doesn't have NCCL built in"),  # a CUDA build, no GPU
    ("device_id parameter must be a device with a valid index, e.g. cpu:0 or cuda:0",
     "device_id parameter must be an accelerator with an index"),
)


def in_213_words(text: str) -> str:
    for newer, older in TORCH_WORDS:
        text = text.replace(newer, older)
    return text
