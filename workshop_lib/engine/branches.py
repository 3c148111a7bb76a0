"""Which lines of a script run on some ranks alone, read from its text: the ``if`` tests that depend on the rank.

A test depends on the rank when it mentions one: a name or attribute with ``rank`` in it (``rank``,
``dist.get_rank()``, ``cfg.local_rank``), the variable ``"RANK"`` of the environment, or a name assigned from
those (``is_main = rank == 0``, ``report = Reporter(...) if rank == 0 else None``). A call that is merely given
the rank (``to_resume(cfg, rank)``) does not make its result the rank's.
"""

from __future__ import annotations

import ast
import re

_CASTS = ("int", "str", "bool", "float")


def parse(source: str) -> ast.Module | None:
    """The script's tree; None if it does not parse."""
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def called(node: ast.AST) -> str | None:
    """The name a call calls (``all_reduce`` of ``dist.all_reduce(...)``); None for anything but a call."""
    func = node.func if isinstance(node, ast.Call) else None
    return getattr(func, "attr", getattr(func, "id", None))


def _leaf(n: ast.AST, only_global: bool) -> bool:
    """Is ``n`` itself the rank: any rank (a name or attribute with ``rank`` in it, a variable ``..RANK`` of the
    environment), or ``only_global``, the global rank (``get_rank``, ``"RANK"``)?"""
    name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
    if only_global:
        return name == "get_rank" or (isinstance(n, ast.Constant) and n.value == "RANK")
    return "rank" in (name or "").lower() or (isinstance(n, ast.Constant) and str(n.value).endswith("RANK"))


def mentions(expr: ast.AST, names: set[str], only_global: bool = False) -> bool:
    """Does ``expr`` read the rank (a name of ``names`` too) anywhere in it?"""
    return any((isinstance(n, ast.Name) and n.id in names) or _leaf(n, only_global) for n in ast.walk(expr))


def _is_rank(value: ast.AST, names: set[str], only_global: bool) -> bool:
    """Is ``value`` the rank, a test of it, or a choice made by one (what makes the name it is assigned to the rank's)?"""
    if isinstance(value, ast.Compare | ast.BoolOp | ast.UnaryOp | ast.Name | ast.Attribute | ast.Subscript):
        return mentions(value, names, only_global)
    if isinstance(value, ast.IfExp):
        return mentions(value.test, names, only_global)
    if isinstance(value, ast.Call):
        return _leaf(value.func, only_global) or (getattr(value.func, "id", "") in _CASTS
                                                  and any(_is_rank(a, names, only_global) for a in value.args))
    return False


def rank_names(tree: ast.AST, only_global: bool = False) -> set[str]:
    """The names that hold the rank (``only_global``: the global rank), a test of it, or a value chosen by one (to a
    fixpoint)."""
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
            names |= {t.id for t, v in pairs if isinstance(t, ast.Name) and _is_rank(v, names, only_global)}
        if len(names) == before:
            return names


def _conditions(tree: ast.AST) -> list[tuple[ast.AST, range, str]]:
    """Each branch of an ``if`` (statement or expression) whose test is about the rank: the node, the lines the
    branch holds, and the test it runs under (an ``else`` branch's is the test negated)."""
    names = rank_names(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.If | ast.IfExp) or not mentions(node.test, names):
            continue
        test = ast.unparse(node.test)
        for part, holds in ((node.body, test), (node.orelse, f"not ({test})")):
            if not part:
                continue
            first, last = (part[0], part[-1]) if isinstance(part, list) else (part, part)
            found.append((node, range(first.lineno, last.end_lineno + 1), holds))
    return found


def rank_condition(source: str, line: int | None) -> tuple[int, str] | None:
    """(the ``if``'s line, the test the line runs under) of the innermost ``if`` around ``line`` whose test depends
    on the rank; None if every rank runs the line (as far as the text shows)."""
    tree = parse(source)
    if tree is None or not line:
        return None
    around = [(node, holds) for node, lines, holds in _conditions(tree) if line in lines]
    if not around:
        return None
    inner, holds = max(around, key=lambda found: (found[0].lineno, found[0].col_offset))
    return inner.lineno, holds


def under_rank(frames) -> tuple[int, int, str] | None:
    """(the line, the ``if``'s line, its test): the innermost rank condition on the way to a call, from its frames,
    innermost first, each (the source, its line); None where every rank runs them all. The one evidence that a call
    runs on some ranks alone, for the script checker and the cell checks alike."""
    for text, line in frames:
        found = rank_condition(text, line)
        if found:
            return line, *found
    return None


def scope(tree: ast.Module, line: int) -> ast.AST:
    """The innermost function around ``line``, else the module."""
    around = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
              and n.lineno <= line <= n.end_lineno]
    return max(around, key=lambda n: n.lineno, default=tree)


def _assigned(node: ast.AST) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def set_under_rank(source: str, line: int | None, name: str) -> tuple[int, str] | None:
    """(the condition's line, its test) when ``name`` gets a value other than None, before ``line`` in the function
    around it, only under a rank condition (``if rank == 0: x = ...``, ``x = f() if rank == 0 else None``); None
    where some rank-free line sets it, or both branches of one rank test do."""
    tree = parse(source)
    if tree is None or not line:
        return None
    found = []
    for node in ast.walk(scope(tree, line)):
        if not isinstance(node, ast.Assign | ast.AnnAssign) or node.lineno >= line or name not in _assigned(node):
            continue
        value = node.value
        if _is_none(value):
            continue  # the other ranks' placeholder
        if isinstance(value, ast.IfExp) and (_is_none(value.body) or _is_none(value.orelse)):
            where = rank_condition(source, (value.orelse if _is_none(value.body) else value.body).lineno)
        else:
            where = rank_condition(source, node.lineno)
        if where is None:
            return None  # set on every rank
        found.append(where)
    if any((at, f"not ({test})") in found for at, test in found):
        return None  # both branches of one test set it: every rank has it
    return found[-1] if found else None


def _is_none(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def unset_on_rank(source: str, line: int | None, error: str, message: str, rank: int | None = None) -> str | None:
    """The setup of a crash at ``line``: a name the line reads that only a rank condition sets, so that it is None
    (or unset) on ``rank``; one line with the fix, else None. ``error``: the exception's type name."""
    if not line or ("NoneType" not in message and error not in ("NameError", "UnboundLocalError")):
        return None
    lines = source.splitlines()
    code = lines[line - 1] if 0 < line <= len(lines) else ""
    attr = re.search(r"has no attribute '(\w+)'", message)
    names = names_read(source, line)  # the one whose attribute failed first, then one the message names
    names.sort(key=lambda n: (not attr or f"{n}.{attr.group(1)}" not in code, f"'{n}'" not in message))
    for name in names:
        found = set_under_rank(source, line, name)
        if found and found != rank_condition(source, line):  # not inside the block that sets it
            state = "is None" if "NoneType" in message else "is not set"
            who = f"rank {rank}" if rank is not None else "the other ranks"
            return (f"{name} {state} on {who}, set only where `{found[1]}` holds (line {found[0]}): run line {line} "
                    f"under the same condition, or create {name} on every rank")
    return None


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


_RECEIVED = {"reduce": (0, "tensor"), "gather": (1, "gather_list")}  # the argument that only dst receives into


def decided_by_received(source: str, line: int | None, call: str) -> tuple[str, int, str] | None:
    """(the name, the test's line, the test) when the value that ``call`` (reduce, gather) at ``line`` delivers to its
    dst alone is read, later in the same function, by an ``if`` or ``while`` test that every rank runs."""
    tree = parse(source)
    if tree is None or not line or call not in _RECEIVED:
        return None
    where, keyword = _RECEIVED[call]
    calls = [n for n in ast.walk(tree) if called(n) == call and n.lineno == line]
    if not calls:
        return None
    args = calls[0].args
    given = args[where] if len(args) > where else next((k.value for k in calls[0].keywords if k.arg == keyword), None)
    while isinstance(given, ast.Subscript | ast.Attribute):
        given = given.value
    if not isinstance(given, ast.Name):
        return None
    for node in sorted(ast.walk(scope(tree, line)), key=lambda n: getattr(n, "lineno", 0)):
        if isinstance(node, ast.If | ast.While | ast.IfExp) and node.lineno > line \
                and any(isinstance(n, ast.Name) and n.id == given.id for n in ast.walk(node.test)) \
                and not mentions(node.test, rank_names(tree) - {given.id}) \
                and rank_condition(source, node.lineno) is None:  # (the value itself, None elsewhere, is no rank test)
            return given.id, node.lineno, ast.unparse(node.test)
    return None
