"""Causes read from the script's text (which function holds a line, a destroy outside a finally): they explain a
mistake the run showed, or show what a CPU run cannot (``device_ids`` on a GPU node). What runs on some ranks alone
is :mod:`branches`'."""

from __future__ import annotations

import ast

from workshop_lib.engine.branches import parse, scope


def function_at(text: str, line: int | None) -> str | None:
    """The name of the innermost function of the script that holds ``line``."""
    tree = parse(text)
    return getattr(scope(tree, line), "name", None) if tree is not None and line else None


def destroy_outside_finally(source: str) -> int | None:
    """The line of a dist.destroy_process_group() call that is not inside a ``finally:``, if any."""
    tree = ast.parse(source)
    protected = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            for stmt in node.finalbody:
                protected |= {id(n) for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == \
                "destroy_process_group" and id(node) not in protected:
            return node.lineno
    return None


def _global_rank_names(tree: ast.Module) -> set[str]:
    """Names assigned from dist.get_rank() or os.environ["RANK"] (the global rank)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
            values = [node.value]
            if isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple):
                targets, values = node.targets[0].elts, node.value.elts
            for t, v in zip(targets, values, strict=False):
                text = ast.unparse(v)
                if isinstance(t, ast.Name) and ("get_rank" in text or "'RANK'" in text or '"RANK"' in text):
                    names.add(t.id)
    return names


def global_rank_device_ids(text: str) -> tuple[int, str] | None:
    """(line, expression) of a ``device_ids=`` that names the global rank (dist.get_rank(), RANK, or a name for it)."""
    tree = parse(text)
    if tree is None:
        return None
    ranks = _global_rank_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "device_ids":
                    used = {n.id for n in ast.walk(kw.value) if isinstance(n, ast.Name)} & ranks
                    if used or "get_rank" in ast.unparse(kw.value):
                        return node.lineno, ast.unparse(kw.value)
    return None


def world_scale(text: str, line: int | None) -> tuple[int, str] | None:
    """(line, expression) of a division or multiplication by the world size (dist.get_world_size(), or a name with
    "world" in it) in the function that holds ``line``, before it, outside what is printed: what scaled a figure logged
    at ``line`` that the all_reduce had already summed."""
    tree = parse(text)
    if tree is None or not line:
        return None
    printed = {id(n) for s in ast.walk(tree) if isinstance(s, ast.JoinedStr) for n in ast.walk(s)}
    for node in sorted(ast.walk(scope(tree, line)), key=lambda n: getattr(n, "lineno", 0)):
        op = node.op if isinstance(node, ast.BinOp | ast.AugAssign) and id(node) not in printed else None
        if not isinstance(op, ast.Div | ast.FloorDiv | ast.Mult) or node.lineno > line:
            continue
        said = ast.unparse(node.right if isinstance(node, ast.BinOp) else node.value)
        if "world" in said.lower():
            return node.lineno, ast.unparse(node)
    return None
