"""Solution spans: what the learner writes, as the solution and the exercise versions of a cell show it.

A solution span (nbgrader-style) has its hint just above; the solution drops the TODO and the markers, the
exercise keeps the TODO and raises NotImplementedError in place of the code::

    # TODO: give each rank its own shard
    ### BEGIN SOLUTION
    sampler = DistributedSampler(...)
    ### END SOLUTION

A debugging lab's span has, instead of a TODO, a BROKEN block just above it, the bug commented out; the solution
drops the block, the exercise keeps its lines uncommented and drops the span::

    ### BEGIN BROKEN
    # spread = replica_spread(model) if rank == 0 else None
    ### END BROKEN
    ### BEGIN SOLUTION
    spread = replica_spread(model)
    ### END SOLUTION

A prediction block follows the line the learner fills in; the solution keeps the instructor's value (dropping the
markers), the exercise drops the block::

    predicted_spread = None  # your prediction, a number
    ### BEGIN PREDICTION
    predicted_spread = 1e-2
    ### END PREDICTION
"""

from __future__ import annotations

import re

from workshop_lib.errors import WorkshopError

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
BROKEN_BEGIN, BROKEN_END = "### BEGIN BROKEN", "### END BROKEN"  # a debugging lab's bug, just above its span
PREDICTION_BEGIN, PREDICTION_END = "### BEGIN PREDICTION", "### END PREDICTION"  # the instructor's, solution only
TODO_RAISE = 'raise NotImplementedError("fill in the TODO above")'  # where the learner's code goes
_TODO = re.compile(r"^\s*# TODO\b")


def _hint_start(lines: list[str], begin: int) -> int | None:
    """The first line of the hint above line ``begin``: a ``# TODO`` line, then any comment lines under it."""
    i = begin - 1
    while i >= 0 and lines[i].lstrip().startswith("#") and not _TODO.match(lines[i]):
        i -= 1
    return i if i >= 0 and _TODO.match(lines[i]) else None


def _broken_start(lines: list[str], begin: int, where: str) -> int | None:
    """The ``### BEGIN BROKEN`` line of the block that ends just above line ``begin``, if there is one."""
    if begin == 0 or lines[begin - 1].strip() != BROKEN_END:
        return None
    i = begin - 2
    while i >= 0 and lines[i].strip() != BROKEN_BEGIN:
        if not lines[i].lstrip().startswith("#"):
            raise WorkshopError(f"{where}: line {i + 1} of a '{BROKEN_BEGIN}' block is not commented out; "
                                f"comment out the bug (the solution notebook must not run it)")
        i -= 1
    if i < 0:
        raise WorkshopError(f"{where}: '{BROKEN_END}' on line {begin} has no '{BROKEN_BEGIN}' before it")
    return i


def _uncommented(line: str) -> str:
    """A line of a BROKEN block as the exercise shows it: its first ``#`` (and one space after it) removed."""
    code = line.lstrip()
    indent = line[: len(line) - len(code)]
    return (indent + code[1:].removeprefix(" ")).rstrip()


def _spans(source: str, where: str) -> list[tuple[int, int, int]]:
    """(hint, begin, end) line numbers of each solution span; a broken span is an error naming its cell.

    ``hint`` is the span's TODO line, or the ``### BEGIN BROKEN`` line of a debugging lab's block.
    """
    lines, spans, begin, hint = source.splitlines(), [], None, None
    for i, line in enumerate(lines):
        marker = line.strip()
        if marker == BEGIN:
            if begin is not None:
                raise WorkshopError(f"{where}: '{BEGIN}' on line {i + 1} inside another span; close it with '{END}'")
            hint = _broken_start(lines, i, where)
            hint = _hint_start(lines, i) if hint is None else hint
            if hint is None:
                raise WorkshopError(f"{where}: '{BEGIN}' on line {i + 1} needs a '# TODO: ...' hint just above "
                                    f"(or, in a debugging lab, the bug in a '{BROKEN_BEGIN}' block)")
            begin = i
        elif marker == END:
            if begin is None:
                raise WorkshopError(f"{where}: '{END}' on line {i + 1} has no '{BEGIN}' before it")
            spans.append((hint, begin, i))
            begin = None
    if begin is not None:
        raise WorkshopError(f"{where}: '{BEGIN}' on line {begin + 1} is never closed with '{END}'")
    return spans


def hints(source: str, where: str = "cell") -> list[list[str]]:
    """The hint of each span that has one: its ``# TODO`` line and the comment lines under it."""
    lines = source.splitlines()
    return [lines[hint:begin] for hint, begin, _ in _spans(source, where) if _TODO.match(lines[hint])]


def _predictions(source: str, keep: bool) -> str:
    """``source`` with each prediction block's markers dropped (``keep``), or the whole block."""
    out, inside = [], False
    for line in source.splitlines():
        marker = line.strip()
        if marker in (PREDICTION_BEGIN, PREDICTION_END):
            inside = marker == PREDICTION_BEGIN
        elif keep or not inside:
            out.append(line)
    return "\n".join(out)


def solution_source(source: str, where: str = "cell") -> str:
    """The code as it runs in the solution: hint lines and markers dropped."""
    source = _predictions(source, keep=True)
    lines = source.splitlines()
    drop = set()
    for hint, begin, end in _spans(source, where):
        drop |= set(range(hint, begin + 1)) | {end}
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def exercise_source(source: str, where: str = "cell") -> str:
    """The learner's version: each span becomes ``raise NotImplementedError`` under its TODO.

    A span under a BROKEN block becomes the block's code instead (the bug, to be found). A prediction block goes.
    """
    source = _predictions(source, keep=False)
    lines = source.splitlines()
    out, pos = [], 0
    for hint, begin, end in _spans(source, where):
        if lines[hint].strip() == BROKEN_BEGIN:
            out += lines[pos:hint] + [_uncommented(line) for line in lines[hint + 1:begin - 1]]
        else:
            indent = lines[begin][: len(lines[begin]) - len(lines[begin].lstrip())]
            out += [*lines[pos:begin], indent + TODO_RAISE]
        pos = end + 1
    out += lines[pos:]
    return "\n".join(out)


def has_spans(source: str) -> bool:
    return any(line.strip() in (BEGIN, PREDICTION_BEGIN) for line in source.splitlines())
