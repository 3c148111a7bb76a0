"""The rank-dependent branches of a learner's code, read from its text: the ``if`` about the rank that holds a line,
and a name set only under one (``None`` on the other ranks). Both checkers name the cause with these."""

from __future__ import annotations

import ast
import re

_NONE_ATTRIBUTE = re.compile(r"'NoneType' object has no attribute '(\w+)'")


def _tree(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def _rank_names(tree: ast.AST) -> set[str]:
    """Names that stand for a rank test: ``rank``-like names, and names assigned from an expression about the rank
    (``master_process = rank == 0``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Compare | ast.BoolOp | ast.UnaryOp) \
                and _about_rank(node.value, set()):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _about_rank(test: ast.AST, aliases: set[str]) -> bool:
    """The expression reads a rank: a name or attribute with "rank" in it, a call of get_rank(), or an alias."""
    for node in ast.walk(test):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name is not None and ("rank" in name.lower() or name in aliases):
            return True
    return False


def _conditions(tree: ast.AST) -> list[tuple[ast.AST, list[ast.stmt] | ast.expr, str]]:
    """(the ``if`` or ``x if c else y`` node, the part it guards, its test as written) for each test about the rank;
    an ``else`` part is guarded by the test negated."""
    aliases = _rank_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If | ast.IfExp) and _about_rank(node.test, aliases):
            test = ast.unparse(node.test)
            found.append((node, node.body, test))
            if node.orelse:
                found.append((node, node.orelse, f"not ({test})"))
    return found


def _span(part: list[ast.stmt] | ast.expr) -> tuple[int, int]:
    first, last = (part[0], part[-1]) if isinstance(part, list) else (part, part)
    return first.lineno, last.end_lineno or last.lineno


def rank_condition(source: str, line: int) -> tuple[int, str] | None:
    """(the ``if``'s line, its test) of the innermost condition about the rank whose branch holds ``line`` of
    ``source``; None where no such condition holds it (or the source does not parse)."""
    tree = _tree(source)
    if tree is None:
        return None
    holding = [(node, test) for node, part, test in _conditions(tree)
               if _span(part)[0] <= line <= _span(part)[1]]
    if not holding:
        return None
    node, test = max(holding, key=lambda found: found[0].lineno)
    return node.lineno, test


def _function_at(tree: ast.Module, line: int) -> ast.AST:
    """The innermost function that holds ``line``, else the module."""
    found: ast.AST = tree
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and \
                node.lineno <= line <= (node.end_lineno or node.lineno) and node.lineno > getattr(found, "lineno", 0):
            found = node
    return found


def _only_under_rank(scope: ast.AST, name: str, source: str) -> tuple[int, int, str] | None:
    """(the assignment's line, the condition's line, its test) where ``name`` gets a value other than None only
    under a condition about the rank; None where it is also set on every rank."""
    guarded = []
    for node in ast.walk(scope):
        if not (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)):
            continue
        value = node.value
        if _is_none(value):
            continue  # the placeholder of the other ranks
        if isinstance(value, ast.IfExp) and (_is_none(value.body) or _is_none(value.orelse)):
            found = rank_condition(source, value.orelse.lineno if _is_none(value.body) else value.body.lineno)
        else:
            found = rank_condition(source, node.lineno)
        if found is None:
            return None  # set on every rank somewhere: not the cause
        guarded.append((node.lineno, *found))
    tests = {(where, test) for _, where, test in guarded}
    if any((where, f"not ({test})") in tests for where, test in tests):
        return None  # set in both branches of one rank test: on every rank
    return min(guarded) if guarded else None


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def none_on_rank(source: str, line: int, message: str, rank: int | None = None) -> str | None:
    """The cause of torch's or Python's "'NoneType' object has no attribute 'x'" raised at ``line`` of ``source``: the
    name read there that is set only under a condition about the rank, said in one line with its fix; else None."""
    attribute = _NONE_ATTRIBUTE.search(message or "")
    tree = _tree(source)
    if attribute is None or tree is None:
        return None
    scope = _function_at(tree, line)
    read = [node for node in ast.walk(scope) if getattr(node, "lineno", None) == line]
    # the name whose attribute is read first (x.world_size), then every other name the line reads (f(x))
    direct = [n.value.id for n in read if isinstance(n, ast.Attribute) and n.attr == attribute.group(1)
              and isinstance(n.value, ast.Name)]
    names = dict.fromkeys(direct + [n.id for n in read if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)])
    for name in names:
        found = _only_under_rank(scope, name, source)
        if found is not None:
            assigned, where, test = found
            who = f"rank {rank}" if rank is not None else "the other ranks"
            at = f"line {where}" if assigned == where else f"line {where}; assigned at line {assigned}"
            return (f"{name} is None on {who}: it is assigned only under `if {test}:` ({at}); create it on every "
                    f"rank or use it under the same condition")
    return None
