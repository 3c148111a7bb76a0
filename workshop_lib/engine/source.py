"""Causes read from the script's text (which function holds a line, a destroy outside a finally): they explain a
mistake the run showed, or show what a CPU run cannot (``device_ids`` on a GPU node). What runs on some ranks alone
is :mod:`branches`'."""

from __future__ import annotations

import ast

from workshop_lib.engine.branches import called, mentions, parse, rank_names, scope


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
        if called(node) == "destroy_process_group" and id(node) not in protected:
            return node.lineno
    return None


def global_rank_device_ids(text: str) -> tuple[int, str] | None:
    """(line, expression) of a ``device_ids=`` that names the global rank (dist.get_rank(), RANK, or a name for it)."""
    tree = parse(text)
    if tree is None:
        return None
    ranks = rank_names(tree, only_global=True)
    return next(((node.lineno, ast.unparse(kw.value)) for node in ast.walk(tree) if isinstance(node, ast.Call)
                 for kw in node.keywords if kw.arg == "device_ids" and mentions(kw.value, ranks, only_global=True)),
                None)


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
