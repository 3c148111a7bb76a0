"""Which lines of a script run on some ranks alone, read from its text: the ``if`` tests that depend on the rank.

A test depends on the rank when it mentions one: a name or attribute with ``rank`` in it (``rank``,
``dist.get_rank()``, ``cfg.local_rank``), the variable ``"RANK"`` of the environment, or a name assigned from
those (``is_main = rank == 0``, ``report = Reporter(...) if rank == 0 else None``). A call that is merely given
the rank (``to_resume(cfg, rank)``) does not make its result the rank's.
"""

from __future__ import annotations

import ast

_CASTS = ("int", "str", "bool", "float")


def parse(source: str) -> ast.Module | None:
    """The script's tree; None if it does not parse."""
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def _mentions(expr: ast.AST, names: set[str]) -> bool:
    """Does ``expr`` read the rank anywhere in it?"""
    for n in ast.walk(expr):
        if isinstance(n, ast.Name) and (n.id in names or "rank" in n.id.lower()):
            return True
        if isinstance(n, ast.Attribute) and "rank" in n.attr.lower():
            return True
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.endswith("RANK"):
            return True
    return False


def _is_rank(value: ast.AST, names: set[str]) -> bool:
    """Is ``value`` the rank, a test of it, or a choice made by one (what makes the name it is assigned to the rank's)?"""
    if isinstance(value, ast.Compare | ast.BoolOp | ast.UnaryOp | ast.Name | ast.Attribute | ast.Subscript):
        return _mentions(value, names)
    if isinstance(value, ast.IfExp):
        return _mentions(value.test, names)
    if isinstance(value, ast.Call):
        func = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", "")
        return "rank" in func.lower() or (func in _CASTS and any(_is_rank(a, names) for a in value.args))
    return False


def rank_names(tree: ast.AST) -> set[str]:
    """The names that hold the rank, a test of it, or a value chosen by one (to a fixpoint)."""
    names: set[str] = set()
    while True:
        before = len(names)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
                continue
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            pairs = [(target, node.value)]
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs = list(zip(target.elts, node.value.elts, strict=False))
            names |= {t.id for t, v in pairs if isinstance(t, ast.Name) and _is_rank(v, names)}
        if len(names) == before:
            return names


def _conditions(tree: ast.AST) -> list[tuple[ast.AST, range]]:
    """Each ``if`` (statement or expression) with a test about the rank, and the lines it guards."""
    names = rank_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _mentions(node.test, names):
            found.append((node, range(node.body[0].lineno, node.end_lineno + 1)))
        elif isinstance(node, ast.IfExp) and _mentions(node.test, names):
            found.append((node, range(node.lineno, node.end_lineno + 1)))
    return found


def rank_condition(source: str, line: int | None) -> tuple[int, str] | None:
    """(the ``if``'s line, its test) of the innermost ``if`` around ``line`` whose test depends on the rank; None if
    every rank runs the line (as far as the text shows)."""
    tree = parse(source)
    if tree is None or not line:
        return None
    around = [node for node, lines in _conditions(tree) if line in lines]
    if not around:
        return None
    inner = max(around, key=lambda n: (n.lineno, n.col_offset))
    return inner.lineno, ast.unparse(inner.test)


def scope(tree: ast.Module, line: int) -> ast.AST:
    """The innermost function around ``line``, else the module."""
    around = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
              and n.lineno <= line <= n.end_lineno]
    return max(around, key=lambda n: n.lineno, default=tree)


def _assigned(node: ast.AST) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def set_under_rank(source: str, line: int | None, name: str) -> tuple[int, str] | None:
    """(the condition's line, its test) when each assignment of ``name`` before ``line``, in the function around it,
    is under a rank condition or chooses by one (``x = f() if rank == 0 else None``); else None."""
    tree = parse(source)
    if tree is None or not line:
        return None
    sets = [n.lineno for n in ast.walk(scope(tree, line)) if isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign)
            and n.lineno < line and name in _assigned(n)]
    conditions = [rank_condition(source, at) for at in sets]
    return conditions[-1] if sets and all(conditions) else None


def names_read(source: str, line: int | None) -> list[str]:
    """The names that the simple statement at ``line`` reads, in order, each once."""
    tree = parse(source)
    if tree is None or not line:
        return []
    simple = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and not hasattr(n, "body")
              and n.lineno <= line <= n.end_lineno]
    found = [n for s in simple for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    return list(dict.fromkeys(n.id for n in sorted(found, key=lambda n: (n.lineno, n.col_offset))))


def rank_exit(source: str) -> tuple[str, int, str, int] | None:
    """('break' | 'return', its line, the test, the test's line) of a loop's exit under a rank condition."""
    tree = parse(source)
    for loop in ast.walk(tree) if tree is not None else ():
        for stop in ast.walk(loop) if isinstance(loop, ast.For | ast.While) else ():
            found = rank_condition(source, stop.lineno) if isinstance(stop, ast.Break | ast.Return) else None
            if found and loop.lineno < found[0]:
                return type(stop).__name__.lower(), stop.lineno, found[1], found[0]
    return None
