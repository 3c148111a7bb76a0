"""Each step script is the canonical PyTorch it teaches (issue 24's "Done when"), read from its syntax tree.

From ``workshop_lib`` a script imports the core only (the domain: data, model, metrics,
report, config, snapshots), never a distributed line and never a tool. Steps 1-4 join
the group in the textbook form, through torchrun's env://; the training loop is in the
script itself; steps 2-4 give a DistributedSampler to a plain DataLoader; steps 3-4 wrap
the model in DDP; the group is always left, in a ``finally``.
"""

from __future__ import annotations

import ast
import re

import pytest

from tests.conftest import REPO, SOLUTIONS

STEPS = sorted(p.stem for p in SOLUTIONS.glob("step*.py"))
DISTRIBUTED = [s for s in STEPS if not s.startswith("step0")]
TOOLS = ("workshop_lib.distributed", "workshop_lib.debug", "workshop_lib.checks", "workshop_lib.lab",
         "workshop_lib.scaling", "workshop_lib.watch")


def core_modules() -> set[str]:
    """The core, as the import-linter contract in pyproject.toml names it (what the step scripts teach from)."""
    text = (REPO / "pyproject.toml").read_text()  # (tomllib is Python 3.11+; the project runs on 3.10)
    contract = next(c for c in text.split("[[tool.importlinter.contracts]]") if 'type = "forbidden"' in c
                    and '"workshop_lib.model"' in c.split("forbidden_modules")[0])
    return set(re.findall(r'"(workshop_lib\.\w+)"', contract.split("source_modules", 1)[1].split("]", 1)[0]))


def tree(step: str) -> ast.Module:
    return ast.parse((SOLUTIONS / f"{step}.py").read_text(), filename=f"{step}.py")


def calls(node: ast.AST, name: str) -> list[ast.Call]:
    """Every call of ``name`` (``name(...)`` or ``anything.name(...)``) under ``node``."""
    def called(call: ast.Call) -> str | None:
        f = call.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None

    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and called(n) == name]


def workshop_imports(module: ast.Module) -> set[str]:
    """Every workshop_lib module the script imports (``from workshop_lib import x`` counts as workshop_lib.x)."""
    found = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("workshop_lib")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("workshop_lib"):
            if node.module == "workshop_lib":
                found |= {f"workshop_lib.{a.name}" for a in node.names}
            else:
                found.add(node.module)
    return found


@pytest.mark.parametrize("step", STEPS)
def test_it_imports_only_the_core_from_workshop_lib(step):
    imported = workshop_imports(tree(step))
    assert imported, "a step script uses the workshop's data and model"
    assert not [m for m in imported if m.startswith(TOOLS)], imported
    assert imported <= core_modules(), imported - core_modules()


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
    """``main(argv=None)`` under ``if __name__ == "__main__"``; steps 1-4 decorate it with torch's ``@record``."""
    module = tree(step)
    main = next(n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    decorators = [ast.unparse(d) for d in main.decorator_list]
    assert decorators == ([] if step.startswith("step0") else ["record"]), decorators
    assert ast.unparse(module.body[-1]) == "if __name__ == '__main__':\n    main()"
    assert "from torch.distributed.elastic.multiprocessing.errors import record" in ast.unparse(module) \
        or step.startswith("step0")


def test_step0_has_no_distributed_line():
    module = tree("step0_baseline")
    assert not calls(module, "init_process_group") and not calls(module, "DistributedSampler")
    assert not [n for n in ast.walk(module) if isinstance(n, ast.ImportFrom)
                and (n.module or "").startswith("torch.distributed")]
