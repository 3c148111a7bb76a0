"""Each step script is the canonical PyTorch it teaches (issue 24's "Done when"), read from its syntax tree.

From ``workshop_lib`` a script imports the core only (the domain: data, model, metrics,
report, config, snapshots), never a distributed line and never a tool. Steps 1-4 join
the group in the textbook form, through torchrun's env://; the training loop is in the
script itself; steps 2-4 give a DistributedSampler to a plain DataLoader; steps 3-4 wrap
the model in DDP; the group is always left, in a ``finally``.
"""

from __future__ import annotations

import ast
import sys

import nbformat
import pytest

from tests.conftest import REPO, SOLUTIONS

STEPS = sorted(p.stem for p in SOLUTIONS.glob("step*.py"))
SCRIPTS = sorted(p.stem for p in SOLUTIONS.glob("*.py"))  # the steps and the hang labs' scripts
DISTRIBUTED = [s for s in STEPS if not s.startswith("step0")]
TOOLS = ("workshop_lib.distributed", "workshop_lib.debug", "workshop_lib.checks", "workshop_lib.engine",
         "workshop_lib.launching", "workshop_lib.figures", "workshop_lib.authoring", "workshop_lib.scaling",
         "workshop_lib.watch")
# The course's tooling, outside the package: tools/ and the site's extension (docs/_ext/, on Sphinx's path).
COURSE_TOOLING = ("tools", *(p.stem for p in (REPO / "docs" / "_ext").glob("*.py")))


def core_modules() -> set[str]:
    """The core, as pyproject.toml's import-linter contract names it: the lowest layer of workshop_lib."""
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")  # pytest brings tomli on 3.10
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c.get("containers") == ["workshop_lib"])
    assert contract.get("exhaustive"), "the contract over workshop_lib must be exhaustive: no module outside a layer"
    return {f"workshop_lib.{name.strip()}" for name in contract["layers"][-1].split(":")}


def package_modules() -> set[str]:
    """Every module and package of workshop_lib (what the wheel holds): the core and the instruments."""
    found = set()
    for path in (REPO / "workshop_lib").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def tree(step: str) -> ast.Module:
    return ast.parse((SOLUTIONS / f"{step}.py").read_text(), filename=f"{step}.py")


def imports(module: ast.Module) -> set[str]:
    """Every module ``module`` imports; ``from a import b`` counts as ``a.b`` (b may be a module) and as ``a``."""
    found = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def calls(node: ast.AST, name: str) -> list[ast.Call]:
    """Every call of ``name`` (``name(...)`` or ``anything.name(...)``) under ``node``."""
    def called(call: ast.Call) -> str | None:
        f = call.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None

    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and called(n) == name]


def workshop_imports(module: ast.Module) -> set[str]:
    """Every workshop_lib module the script imports (``from workshop_lib import x`` counts as workshop_lib.x)."""
    modules = package_modules()
    return {m for m in imports(module) if m in modules and m != "workshop_lib"}


@pytest.mark.parametrize("script", SCRIPTS)
def test_it_imports_only_the_core_from_workshop_lib(script):
    imported = workshop_imports(tree(script))
    assert imported, "a script of solutions/ uses the workshop's data and model"
    assert not [m for m in imported if m.startswith(TOOLS)], imported
    assert imported <= core_modules(), imported - core_modules()
    assert not {m.split(".")[0] for m in imports(tree(script))} & set(COURSE_TOOLING)


def notebook_imports(path) -> set[str]:
    """What a notebook's code cells import, read after IPython turns its magics (``%%writefile``, ``!cmd``) into
    Python, as the kernel does."""
    from IPython.core.inputtransformer2 import TransformerManager

    python = TransformerManager()
    found = set()
    for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
        if cell.cell_type == "code":
            found |= imports(ast.parse(python.transform_cell(cell.source), filename=f"{path.name} cell {i}"))
    return found


@pytest.mark.parametrize("path", sorted((REPO / "notebooks").glob("[0-9][0-9]*_*.ipynb")), ids=lambda p: p.name)
def test_a_notebook_imports_only_the_package_never_the_course_tooling(path):
    """The core and the instruments, which the wheel holds; never tools/ or the site's extension."""
    imported = notebook_imports(path)
    ours = {m for m in imported if m.split(".")[0] == "workshop_lib"}
    assert ours, f"{path.name} imports nothing of workshop_lib"
    modules = package_modules()
    not_modules = {m for m in ours if m not in modules and m.rsplit(".", 1)[0] not in modules}
    assert not not_modules, f"{path.name} imports what the package does not hold: {sorted(not_modules)}"
    tooling = sorted(m for m in imported if m.split(".")[0] in COURSE_TOOLING)
    assert not tooling, f"{path.name} imports the course's tooling, which is not installed: {tooling}"


@pytest.mark.parametrize("step", DISTRIBUTED)
def test_it_joins_the_group_in_the_textbook_form(step):
    """``dist.init_process_group(backend, timeout=..., device_id=...)``: env://, the backend first, no store of ours."""
    inits = calls(tree(step), "init_process_group")
    assert inits, "steps 1-4 join a process group"
    for call in inits:
        keywords = {k.arg for k in call.keywords}
        assert len(call.args) == 1 and "backend" not in keywords, ast.unparse(call)  # the backend, first
        assert keywords <= {"timeout", "device_id"}, ast.unparse(call)  # no store=, rank=, world_size=, init_method=


@pytest.mark.parametrize("step", STEPS)
def test_the_training_loop_is_in_the_script_itself(step):
    """A for loop over a loader that calls zero_grad, backward and step, written in the script."""
    loops = [node for node in ast.walk(tree(step)) if isinstance(node, ast.For)
             and all(calls(node, name) for name in ("zero_grad", "backward", "step"))]
    assert loops, "no loop of zero_grad(), backward() and step() in the script"
    assert any("loader" in ast.unparse(loop.iter) for loop in loops), [ast.unparse(loop.iter) for loop in loops]


def _assigned(function: ast.AST, name: str) -> list[ast.expr]:
    return [node.value for node in ast.walk(function) if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)]


@pytest.mark.parametrize("step", [s for s in STEPS if s >= "step2"])
def test_a_plain_dataloader_gets_a_distributed_sampler(step):
    module = tree(step)
    found = []
    for function in (n for n in ast.walk(module) if isinstance(n, ast.FunctionDef)):
        for call in calls(function, "DataLoader"):
            kw = {k.arg: k.value for k in call.keywords}
            assert "batch_sampler" not in kw, ast.unparse(call)  # a plain DataLoader: batch_size and sampler
            sampler = kw.get("sampler")
            values = _assigned(function, sampler.id) if isinstance(sampler, ast.Name) else [sampler]
            if any(isinstance(v, ast.Call) and calls(v, "DistributedSampler") for v in values if v is not None):
                found.append(ast.unparse(call))
    assert found, "no DataLoader(..., sampler=DistributedSampler(...))"


@pytest.mark.parametrize("step", STEPS)
def test_ddp_wraps_the_model_from_step_3(step):
    wraps = calls(tree(step), "DDP") + calls(tree(step), "DistributedDataParallel")
    assert bool(wraps) == (step >= "step3"), [ast.unparse(c) for c in wraps]


@pytest.mark.parametrize("step", DISTRIBUTED)
def test_the_group_is_always_left_in_a_finally(step):
    tries = [node for node in ast.walk(tree(step)) if isinstance(node, ast.Try)
             and any(calls(stmt, "destroy_process_group") for stmt in node.finalbody)]
    assert tries, "no try: ... finally: dist.destroy_process_group()"


@pytest.mark.parametrize("step", STEPS)
def test_nothing_runs_at_import_and_a_failure_reaches_torchruns_summary(step):
    """``main(argv=None)`` under ``if __name__ == "__main__"``; steps 1-4 decorate it with torch's ``@record``, and their
    guard says in one line how to start them where torchrun did not."""
    module = tree(step)
    main = next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    decorators = [ast.unparse(d) for d in main.decorator_list]
    assert decorators == ([] if step.startswith("step0") else ["record"]), decorators
    guard = "if __name__ == '__main__':\n    main()"
    if not step.startswith("step0"):  # plain python: one line, how to start it (torchrun sets RANK)
        guard = ("if __name__ == '__main__':\n    if 'RANK' not in os.environ:\n        raise SystemExit(f'start it with "
                 "torchrun: torchrun --standalone --nproc_per_node=2 {os.path.relpath(__file__)}')\n    main()")
    assert ast.unparse(module.body[-1]) == guard
    assert "from torch.distributed.elastic.multiprocessing.errors import record" in ast.unparse(module) \
        or step.startswith("step0")


def test_step0_has_no_distributed_line():
    module = tree("step0_baseline")
    assert not calls(module, "init_process_group") and not calls(module, "DistributedSampler")
    assert not [n for n in ast.walk(module) if isinstance(n, ast.ImportFrom)
                and (n.module or "").startswith("torch.distributed")]


def test_step_3s_exercise_leaves_every_use_of_the_plain_model_to_the_learner():
    """model.module (evaluate, keep, restore, save) is what learners get wrong: 03 gives none of it away."""
    todo = (REPO / "exercises" / "step3_ddp_todo.py").read_text()
    solved = (REPO / "solutions" / "step3_ddp.py").read_text()
    assert "model.module" not in todo, [line for line in todo.splitlines() if "model.module" in line]
    uses = [line.strip() for line in solved.splitlines() if "model.module" in line and not line.lstrip().startswith("#")]
    assert {"best.restore(model.module)", 'torch.save(model.module.state_dict(), cfg.out / "model.pt")'} <= set(uses)
