"""The lab stays on torch's public surface: no private torch state written, no private torch function replaced.

Read from the source (the AST of every module of workshop_lib/, tools/, tests/ and benchmarks/, and every code
cell of the notebooks), not from a run: a write or a patch that a run happens not to reach is found too. The lab
reads none of torch's private names either (DDP's buckets come from a communication hook, the group's timeout from
the script's own ``init_process_group`` call).
"""

from __future__ import annotations

import ast
import json

import pytest

from tests.conftest import REPO

TREES = ("workshop_lib", "tools", "tests", "benchmarks")
PATCHERS = {"setattr", "patch.object", "monkeypatch.setattr", "mock.patch.object"}


def _sources() -> list[tuple[str, str]]:
    found = [(str(p.relative_to(REPO)), p.read_text()) for tree in TREES for p in sorted((REPO / tree).rglob("*.py"))]
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            if cell["cell_type"] == "code":
                code = "".join(cell["source"])
                lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in code.splitlines()]
                found.append((f"{nb.relative_to(REPO)}[{i}]", "\n".join(lines)))
    return found


class _Names(ast.NodeVisitor):
    """What each local name is, where it is an import of torch: ``dist`` -> ``torch.distributed``."""

    def __init__(self):
        self.torch: dict[str, str] = {}
        self.imported: list[str] = []  # every torch module or name imported, in full

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] == "torch":
                self.torch[alias.asname or "torch"] = alias.name if alias.asname else "torch"
                self.imported.append(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.module.split(".")[0] == "torch":
            for alias in node.names:
                self.torch[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                self.imported.append(f"{node.module}.{alias.name}")


def _dotted(node: ast.AST, names: dict[str, str]) -> str | None:
    """``dist.distributed_c10d._world`` -> ``torch.distributed.distributed_c10d._world``; None if not torch's."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in names:
        return ".".join([names[node.id], *reversed(parts)])
    return None


def _private(dotted: str) -> bool:
    """A name with a part that starts with an underscore (not a dunder such as a public class's ``__init__``)."""
    return any(part.startswith("_") and not part.endswith("__") for part in dotted.split(".")[1:])


def _call_name(func: ast.AST) -> str:
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


def findings(where: str, source: str) -> list[str]:
    """Each write to a private torch name, and each patch of one, in ``source``: 'where:line: what'."""
    tree = ast.parse(source)
    names = _Names()
    names.visit(tree)
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            dotted = _dotted(target, names.torch)
            if dotted and _private(dotted):
                found.append(f"{where}:{node.lineno}: writes {dotted}")
        if isinstance(node, ast.Call) and _call_name(node.func).endswith(tuple(PATCHERS)) and len(node.args) >= 2:
            owner, name = node.args[0], node.args[1]
            dotted = _dotted(owner, names.torch)
            if dotted and isinstance(name, ast.Constant) and isinstance(name.value, str):
                whole = f"{dotted}.{name.value}"
                if _private(whole):
                    found.append(f"{where}:{node.lineno}: replaces {whole}")
        if isinstance(node, ast.Call) and _call_name(node.func) in ("patch", "mock.patch", "unittest.mock.patch") \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            target = node.args[0].value
            if target.split(".")[0] == "torch" and _private(target):
                found.append(f"{where}:{node.lineno}: replaces {target}")
    return found


def private_reads(where: str, source: str) -> list[str]:
    """Each use of a private torch name (an import of one included)."""
    tree = ast.parse(source)
    names = _Names()
    names.visit(tree)
    found = [f"{where}: imports {m}" for m in names.imported if _private(m)]
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:  # the whole chain, once
            dotted = _dotted(node, names.torch)
            if dotted and _private(dotted):
                found.append(f"{where}:{node.lineno}: reads {dotted}")
    return found


SOURCES = _sources()


def test_no_private_torch_state_is_written_and_no_private_torch_function_replaced():
    found = [f for where, source in SOURCES for f in findings(where, source)]
    assert found == [], "\n".join(found)


def test_the_lab_reads_none_of_torchs_private_names():
    lab = [(w, s) for w, s in SOURCES if w.startswith(("workshop_lib/", "notebooks/"))]
    found = [f for where, source in lab for f in private_reads(where, source)]
    assert found == [], "\n".join(found)


def test_no_sitecustomize_changes_what_the_tests_run():
    assert not [p for tree in (*TREES, "notebooks") for p in (REPO / tree).rglob("sitecustomize.py")]
    mentions = [w for w, s in SOURCES if "sitecustomize" in s and not w.endswith("test_public_surface.py")]
    assert mentions == []


@pytest.mark.parametrize(("source", "says"), [
    ("import torch.distributed as dist\ndist.distributed_c10d._world.group_count = 0\n",
     "writes torch.distributed.distributed_c10d._world.group_count"),
    ("from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr\n"
     "with mock.patch.object(dr, '_delay', new=f):\n    pass\n",
     "replaces torch.distributed.elastic.rendezvous.dynamic_rendezvous._delay"),
    ("from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent\n"
     "monkeypatch.setattr(LocalElasticAgent, '_shutdown', f)\n",
     "replaces torch.distributed.elastic.agent.server.local_elastic_agent.LocalElasticAgent._shutdown"),
    ("import unittest.mock\nunittest.mock.patch('torch.distributed._foo', f)\n", "replaces torch.distributed._foo"),
    ("import torch.distributed as dist\n"  # a call-through wrapper of a private function is still a replacement
     "with mock.patch.object(dist, '_broadcast_coalesced', new=g(dist._broadcast_coalesced)):\n    pass\n",
     "replaces torch.distributed._broadcast_coalesced"),
])
def test_the_search_finds_each_kind_it_looks_for(source, says):
    assert [f.split(": ", 1)[1] for f in findings("x.py", source)] == [says]


def test_the_search_lets_public_patches_be():
    source = ("import torch.distributed as dist\nimport torch\nfrom torch.nn.parallel import DistributedDataParallel\n"
              "with mock.patch.object(dist, 'all_reduce', new=f(dist.all_reduce)),\\\n"
              "        mock.patch.object(DistributedDataParallel, 'forward', new=g):\n    pass\n"
              "monkeypatch.setattr(torch.cuda, 'is_initialized', lambda: True)\n")
    assert findings("x.py", source) == []
    assert private_reads("x.py", "import torch._dynamo\nimport torch\ntorch._C._foo()\n") == [
        "x.py: imports torch._dynamo", "x.py:3: reads torch._C._foo"]
