"""A step's script, written from the notebook's cells tagged ``script:<name>``: ``write_script`` in the kernel.

The docstring and imports first, then the other cells in notebook order, ``def main``, the ``__main__`` guard;
steps 2 to 4 borrow earlier notebooks' cells (the learner's where filled in, else the solution's). The same text,
from the solution notebooks, is what ``python -m tools.build`` writes to solutions/ and exercises/.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from workshop_lib.authoring.spans import TODO_RAISE, exercise_source, solution_source
from workshop_lib.errors import WorkshopError
from workshop_lib.paths import write_atomic

SCRIPT_TAG = "script:"
MINE = Path("runs", "mine")  # under the course folder: the learner's versions of the scripts (git-ignored)
GENERATED_BY = "python -m tools.build"  # what writes solutions/ and exercises/ (named in their first line)
_STARTS_BLOCK = re.compile(r"^(def |class |@|async def |if __name__)")


def exercise_file(name: str) -> str:
    """Script ``name`` with its TODOs open: ``_todo``, never to be taken for the learner's ``runs/mine/<name>.py``."""
    return f"{name}_todo.py"


def script_names(cell) -> list[str]:
    return [t[len(SCRIPT_TAG):] for t in cell.get("metadata", {}).get("tags", []) if t.startswith(SCRIPT_TAG)]


def _join(pieces: Sequence[str]) -> str:
    """One blank line between pieces, two before a top-level def/class/guard (PEP 8)."""
    text = ""
    for piece in pieces:
        piece = piece.strip("\n")
        if text:
            text += "\n\n\n" if _STARTS_BLOCK.match(piece) else "\n\n"
        text += piece
    return text + "\n"


def _first_code(source: str) -> str:
    """The first line that is not blank, a comment or a decorator (a decorated function is placed by its def)."""
    return next((line for line in source.splitlines() if line.strip() and not line.lstrip().startswith(("#", "@"))), "")


def _kind(source: str) -> int:
    """Where a cell goes in its script: 0 the docstring and imports, 1 the body, 2 ``def main``, 3 the guard."""
    first = _first_code(source)
    if first.startswith("if __name__"):
        return 3
    if first.startswith(('"""', "import ", "from ")):
        return 0
    return 2 if first.startswith("def main(") else 1


def cell_label(text: str) -> str:
    """How a learner finds a script's cell: "cell `def save_snapshot`", "the imports cell", "the __main__ cell"."""
    first = _first_code(text)
    if first.startswith(("def ", "async def ", "class ")):
        return f"cell `{first.split('(')[0].rstrip(':')}`"
    return {0: "the imports cell", 3: "the __main__ cell"}.get(_kind(text), f"cell `{first[:40]}`")


def script_text(nb, name: str, source_name: str, exercise: bool, others: Sequence[tuple[str, object]] = (),
                noqa: str = "") -> str:
    """The script ``name`` from the cells tagged ``script:<name>`` of ``nb``.

    ``others``: (name, notebook) pairs that lend it cells, as solutions. ``noqa``: a last header line (exercises).
    """
    return _script(nb, name, source_name, exercise, others=others, noqa=noqa)[0]


def _script(nb, name: str, source_name: str, exercise: bool, sources: dict[str, str] | None = None,
            others: Sequence[tuple[str, object]] = (), noqa: str = "",
            header: list[str] | None = None) -> tuple[str, list[tuple[str, str, str, str]]]:
    """:func:`script_text` (``sources``: the cells' text by id; ``header``, if given, in place of "generated: do not
    edit"), and its cells in order: (their text in the script, the notebook's name, the label, the cell's source)."""
    placed = []
    notebooks = sorted([(nb, source_name, True)] + [(o, n, False) for n, o in others], key=lambda t: Path(t[1]).name)
    for order, (where_nb, nb_name, home) in enumerate(notebooks):
        for i, cell in enumerate(where_nb.cells):
            if name not in script_names(cell):
                continue
            src = (sources or {}).get(cell.get("id"), cell.source) if home else cell.source
            where = f"{nb_name} cell {i}"
            text = exercise_source(src, where) if exercise and home else solution_source(src, where)
            kind = _kind(text)
            placed.append(((kind, -home if kind == 0 else 0, order, i), text, Path(nb_name).name, src))
    if not placed:
        raise WorkshopError(f"{source_name} has no cell tagged {SCRIPT_TAG}{name}; tag the script's cells")
    placed.sort(key=lambda p: p[0])
    if header is None:
        lenders = sorted(n for n, o in others if any(name in script_names(c) for c in o.cells))
        header = [f"# Generated from {source_name} by `{GENERATED_BY}`: do not edit.",
                  *(f"# (and cells of {lender})" for lender in lenders),
                  f"# Edit the cells tagged {SCRIPT_TAG}{name}, then rebuild.", *([noqa] if noqa else [])]
    cells = [(text, where, cell_label(text), src) for _, text, where, src in placed]
    return "\n".join(header) + "\n" + _join([text for text, _, _, _ in cells]), cells


def _lenders(course: Path, home: Path, name: str) -> tuple[list[tuple[str, object]], list[str]]:
    """The notebooks that lend ``name`` cells, and the cells taken from the solutions (``def f`` (notebook)).

    A lent cell comes from the learner's notebook beside ``home`` unless its TODO is still open, else the solution's.
    """
    import copy

    import nbformat

    lent, solved = [], []
    for key, solution in solution_notebooks(course / "notebooks").items():
        mine_path = home.parent / Path(key).name
        if mine_path.name == home.name:
            continue
        if home.parent == course / "notebooks" or not mine_path.is_file():
            lent.append((key, solution))
            continue
        mine, merged = nbformat.read(mine_path, as_version=4), copy.deepcopy(solution)
        by_id = {cell.get("id"): cell for cell in mine.cells}
        for i, cell in enumerate(merged.cells):
            theirs = by_id.get(cell.get("id"))
            if name not in script_names(cell) or theirs is None:
                continue
            if TODO_RAISE in theirs.source:
                first = next((line for line in cell.source.splitlines() if line.startswith("def ")), f"cell {i}")
                solved.append(f"{first.split('(')[0]} ({Path(key).name})")
            else:
                merged.cells[i] = theirs
        lent.append((key, merged))
    return lent, solved


def solution_notebooks(folder: Path) -> dict[str, object]:
    """The solution notebooks of ``folder`` (00_baseline ... 05_...), read, by their path under its parent."""
    import nbformat

    return {f"{folder.name}/{p.name}": nbformat.read(p, as_version=4)
            for p in sorted(Path(folder).glob("[0-9][0-9]*_*.ipynb"))}


# ------------------------------------------------------------- in the learner's kernel

_ran: dict[str, str] = {}  # cell id -> the source this kernel last ran successfully
# A script write_script wrote, by its path: the call that wrote it again, the ids of its cells, and each line's cell.
_written: dict[str, dict] = {}


def _record(result) -> None:
    info = result.info
    if getattr(info, "cell_id", None) and result.success:
        _ran[info.cell_id] = info.raw_cell
        for path, written in list(_written.items()):
            if info.cell_id in written["cells"] and Path(path).is_file():  # the terminal runs what you last ran
                try:
                    write_script(*written["call"], quiet=True)
                    print(f"(rewrote {written['shown']} from this cell, as the terminal will run it)")
                except WorkshopError as err:
                    print(f"{written['shown']} not rewritten: {err}")


def where_in_cells(path: str | Path, line: int) -> str | None:
    """Line ``line`` of a script :func:`write_script` wrote, as the cell it came from and the line there: "cell
    `def save_snapshot` line 4" (a cell lent by another notebook: "03_ddp.ipynb's cell ..."); None where unknown
    (another file, or one changed since)."""
    written = _written.get(str(Path(path).resolve()))
    if written is None or not Path(path).is_file() or Path(path).read_text() != written["text"]:
        return None
    for first, in_cell, where, label in written["lines"]:
        if first <= line < first + len(in_cell):
            of = "" if where == written["home"] else f"{where}'s "
            return f"{of}{label} line {in_cell[line - first]}"
    return None


def in_cells(path: str | Path, message: str) -> str:
    """``message`` about the script at ``path``, each "line N" of it pointed at its cell (:func:`where_in_cells`)."""
    return re.sub(r"\bline (\d+)\b", lambda m: where_in_cells(path, int(m[1])) or m[0], message)


def _lines(text: str, cells: list[tuple[str, str, str, str]]) -> list[tuple[int, list[int], str, str]]:
    """Where each cell's text starts in the script ``text`` (1-based), and for each of its lines, the line of the cell
    it is (1-based; the cell has hints and markers the script drops)."""
    found, at = [], 0
    for piece, where, label, source in cells:
        piece = piece.strip("\n")
        start = text.find(piece, at)
        if start < 0:
            continue
        found.append((text.count("\n", 0, start) + 1, _cell_lines(piece.split("\n"), source.split("\n")), where,
                      label))
        at = start + len(piece)
    return found


def _cell_lines(script: list[str], cell: list[str]) -> list[int]:
    """For each of a cell's lines in the script, its line in the cell (the script's are the cell's, in order, less
    the lines it drops); where they are not, the same number."""
    out, j = [], 0
    for line in script:
        while j < len(cell) and cell[j] != line:
            j += 1
        if j == len(cell):
            return list(range(1, len(script) + 1))
        out.append(j + 1)
        j += 1
    return out


def track_cells() -> None:
    """Remember what each cell last ran, so write_script sees edits you ran but did not save yet."""
    from IPython import get_ipython

    ip = get_ipython()
    if ip is not None and _record not in ip.events.callbacks["post_run_cell"]:
        ip.events.register("post_run_cell", _record)


def write_script(notebook: str | Path, name: str | None = None, to: Path | None = None, quiet: bool = False) -> Path:
    """Write this notebook's script, as you ran its cells (saved ones else), to runs/mine/<name>.py; return the path.

    A TODO still open raises NotImplementedError when the script reaches it. Once written, running one of its cells
    again (:func:`track_cells`) writes it again, so the terminal runs what you last ran; :func:`in_cells` points a
    line of it at its cell.
    """
    import nbformat

    path = Path(notebook).resolve()
    if not path.is_file():
        raise WorkshopError(f"notebook {notebook} not found from {Path.cwd()}; pass its file name")
    course = path.parent.parent
    if not (course / "notebooks").is_dir():  # else step 2's script would lack step 1's setup(), a NameError later
        raise WorkshopError(f"write_script reads the cells that steps 2 to 4 borrow from {course / 'notebooks'}, "
                            f"which is not there: open {path.name} from the course's notebooks/ or exercises/")
    nb = nbformat.read(path, as_version=4)
    names = list(dict.fromkeys(n for cell in nb.cells for n in script_names(cell)))
    if name is None:
        if len(names) != 1:
            raise WorkshopError(f"{path.name} has scripts {names}; say which with name=")
        name = names[0]
    others, solved = _lenders(course, path, name)
    header = [f"# Your {name}, written from {path.name} by workshop_lib.authoring.scripts.write_script.",
              *([f"# From the solutions, as yours still raise NotImplementedError: {', '.join(solved)}."] if solved else [])]
    text, cells = _script(nb, name, path.name, exercise=False, sources=_ran, others=others, header=header)
    out = Path(to) if to else course / MINE / f"{name}.py"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, text.encode())  # a job may be starting from the last version: never half written
    shown = out.relative_to(course) if out.is_relative_to(course) else out
    _written[str(out.resolve())] = {
        "call": (path, name, out), "text": text, "shown": str(shown),
        "home": path.name, "lines": _lines(text, cells),
        "cells": {cell.get("id") for cell in nb.cells if name in script_names(cell)}}
    if not quiet:
        print(f"wrote {shown} ({text.count(chr(10))} lines)")
    return out
