"""The notebooks run top to bottom on a GPU node: no cell touches CUDA in the kernel before a notebook_launch.

notebook_launch forks its ranks, and a forked child cannot use CUDA once the
parent has initialised it, so notebook_launch refuses then. On a GPU node a
step's ``main``/``train`` run in the kernel would pick nccl and ``cuda:0``,
initialising CUDA. The notebooks must run such things in a subprocess
(``launch.torchrun``), or only after their last notebook_launch. These tests
check the order in every solution notebook, and simulate "CUDA initialised" to
check that notebook_launch refuses with one line saying what to do.
"""

from __future__ import annotations

import ast

import nbformat
import pytest
import torch

from tests.conftest import REPO
from workshop_lib.errors import WorkshopError
from workshop_lib.launching import forklaunch, spawning

NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]*_*.ipynb"))

SAFE_CUDA = {"is_available", "device_count", "is_initialized"}  # these do not initialise CUDA


def _calls_outside_functions(tree: ast.AST):
    """Every call the kernel makes when the cell runs: not those inside a def, lambda or class body."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        if isinstance(node, ast.Call):
            yield node
        yield from _calls_outside_functions(node)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def touches_cuda(call: ast.Call) -> bool:
    """A step's main/train, distributed.setup, torch.cuda.*, .cuda() or .to("cuda..."), run in the kernel."""
    name = _dotted(call.func)
    if name in ("run_cli", "main", "train") or name.endswith("distributed.setup"):
        return True
    if name.startswith("torch.cuda.") and name.split(".")[2] not in SAFE_CUDA:
        return True
    if name.endswith(".cuda"):
        return True
    return name.endswith(".to") and any(isinstance(a, ast.Constant) and str(a.value).startswith("cuda")
                                        for a in call.args)


def _parse(source: str) -> ast.AST:
    return ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))


def first_cuda_then_fork(cells: list[tuple[str, str]]) -> tuple[str, str] | None:
    """(cell that may initialise CUDA in the kernel, later cell that forks), or None when the order is safe."""
    touched = None
    for cell_id, source in cells:
        calls = list(_calls_outside_functions(_parse(source)))
        if touched is not None and any(_dotted(c.func).endswith("notebook_launch") for c in calls):
            return touched, cell_id
        if touched is None and any(touches_cuda(c) for c in calls):
            touched = cell_id
    return None


def kernel_cells(path) -> list[tuple[str, str]]:
    """(id, source) of the code cells the kernel runs at the top level (script cells only define functions)."""
    nb = nbformat.read(path, as_version=4)
    return [(c.get("id"), c.source) for c in nb.cells if c.cell_type == "code"
            and not any(t.startswith("script:") for t in c.metadata.get("tags", []))]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_no_cell_initialises_cuda_in_the_kernel_before_a_notebook_launch(path):
    bad = first_cuda_then_fork(kernel_cells(path))
    assert bad is None, (f"{path.name}: cell {bad[0]} may initialise CUDA in the kernel on a GPU node, and cell {bad[1]} "
                         "forks ranks after it; run the first in a subprocess (launch.torchrun) or move it after")


def test_the_order_check_catches_an_in_kernel_run_before_a_fork():
    """The cells of notebook 03 as they were: run_cli(main) in the kernel, then a notebook_launch."""
    before = [("speed", 'assert run_cli(main, [*flags, "--out", str(RUNS / "x")]) == 0'),
              ("fork", "for line in forklaunch.notebook_launch(step_then_allreduce, 2):\n    print(line)")]
    assert first_cuda_then_fork(before) == ("speed", "fork")
    assert first_cuda_then_fork(before[::-1]) is None  # the fork first is fine
    subprocess_first = [("speed", 'one = launch.torchrun(script, nproc=1, args=flags)'), before[1]]
    assert first_cuda_then_fork(subprocess_first) is None
    defined_only = [("def", "def rank_fn(env):\n    return train(cfg, env)"), before[1]]  # runs in the forked ranks
    assert first_cuda_then_fork(defined_only) is None
    assert first_cuda_then_fork([("gpu", "x = torch.ones(1).to('cuda')"), before[1]]) == ("gpu", "fork")


def test_notebook_launch_refuses_once_cuda_is_initialised(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # as after any CUDA work in the kernel
    monkeypatch.setenv(spawning.START_METHOD, "fork")  # fork's refusal: a spawned rank may use CUDA
    with pytest.raises(WorkshopError, match="restart the kernel") as err:
        forklaunch.notebook_launch(lambda env: None, 2)
    assert "\n" not in str(err.value)
