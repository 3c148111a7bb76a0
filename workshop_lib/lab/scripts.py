"""A step's script, written from the notebook's cells tagged ``script:<name>``: ``write_script`` in the kernel.

The docstring and imports first, then the other cells in notebook order, ``def main``, the ``__main__`` guard;
steps 2 to 4 borrow earlier notebooks' cells (the learner's where filled in, else the solution's). The same text,
from the solution notebooks, is what ``python -m tools.build`` writes to solutions/ and exercises/.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from workshop_lib.errors import WorkshopError
from workshop_lib.lab.spans import TODO_RAISE, exercise_source, solution_source
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


def _kind(source: str) -> int:
    """Where a cell goes in its script: 0 the docstring and imports, 1 the body, 2 ``def main``, 3 the guard."""
    code = [line for line in source.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    while code and code[0].startswith("@"):  # a decorated function is placed by its def
        code.pop(0)
    first = code[0] if code else ""
    if first.startswith("if __name__"):
        return 3
    if first.startswith(('"""', "import ", "from ")):
        return 0
    return 2 if first.startswith("def main(") else 1


def script_text(nb, name: str, source_name: str, exercise: bool, sources: dict[str, str] | None = None,
                others: Sequence[tuple[str, object]] = (), noqa: str = "") -> str:
    """The script ``name`` from the cells tagged ``script:<name>`` of ``nb`` (``sources``: text by cell id).

    ``others``: (name, notebook) pairs that lend it cells, as solutions. ``noqa``: a last header line (exercises).
    """
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
            placed.append(((kind, -home if kind == 0 else 0, order, i), text))
    if not placed:
        raise WorkshopError(f"{source_name} has no cell tagged {SCRIPT_TAG}{name}; tag the script's cells")
    lenders = sorted(n for n, o in others if any(name in script_names(c) for c in o.cells))
    header = [f"# Generated from {source_name} by `{GENERATED_BY}`: do not edit."]
    header += [f"# (and cells of {lender})" for lender in lenders]
    header.append(f"# Edit the cells tagged {SCRIPT_TAG}{name}, then rebuild.")
    if noqa:
        header.append(noqa)
    return "\n".join(header) + "\n" + _join([text for _, text in sorted(placed, key=lambda p: p[0])])


def _lenders(course: Path, home: Path, name: str) -> tuple[list[tuple[str, object]], list[str]]:
    """The notebooks that lend ``name`` cells, and the cells taken from the solutions (``def f`` (notebook)).

    A lent cell comes from the learner's notebook beside ``home`` unless its TODO is still open, else the solution's.
    """
    import copy

    import nbformat

    lent, solved = [], []
    for key, solution in solution_notebooks(course / "notebooks").items():
        mine_path = home.parent / Path(key).name
        if mine_path == home or Path(key).name == home.name:
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


def _record(result) -> None:
    info = result.info
    if getattr(info, "cell_id", None) and result.success:
        _ran[info.cell_id] = info.raw_cell


def track_cells() -> None:
    """Remember what each cell last ran, so write_script sees edits you ran but did not save yet."""
    from IPython import get_ipython

    ip = get_ipython()
    if ip is not None and _record not in ip.events.callbacks["post_run_cell"]:
        ip.events.register("post_run_cell", _record)


def write_script(notebook: str | Path, name: str | None = None, to: Path | None = None) -> Path:
    """Write this notebook's script, as you ran its cells (saved ones else), to runs/mine/<name>.py; return the path.

    A TODO still open raises NotImplementedError when the script reaches it.
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
    text = script_text(nb, name, path.name, exercise=False, sources=_ran, others=others)
    lines = text.split("\n")
    while lines[0].startswith(("# Generated from", "# (and cells of", "# Edit the cells")):
        lines.pop(0)  # without the "generated, do not edit" header: this one is yours
    body = "\n".join(lines)
    text = f"# Your {name}, written from {path.name} by workshop_lib.lab.scripts.write_script.\n"
    if solved:
        text += f"# From the solutions, as yours still raise NotImplementedError: {', '.join(solved)}.\n"
    text += body
    out = Path(to) if to else course / MINE / f"{name}.py"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, text.encode())  # a job may be starting from the last version: never half written
    print(f"wrote {out.relative_to(course) if out.is_relative_to(course) else out} "
          f"({text.count(chr(10))} lines)")
    return out
