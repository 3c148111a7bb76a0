"""Generate the scripts and the exercise notebooks from the solution notebooks.

The solution notebooks in notebooks/ (the ones nbval runs, with stored
outputs) are the source. From each this writes

* solutions/<name>.py: the cells tagged ``script:<name>``, in order;
* exercises/<name>.py: the same with every solution span replaced by a TODO;
* exercises/NN_<topic>.ipynb: the notebook with outputs cleared and the
  solution spans replaced, the check cells kept.

Solution spans (``### BEGIN SOLUTION``) and a debugging lab's broken blocks: lab/spans.py.

    python -m workshop_lib.build            # rewrite every generated file
    python -m workshop_lib.build --check    # exit 1 and name each stale file
    python -m workshop_lib.build --execute 02_distributed_sampler.ipynb   # re-run, store outputs
    python -m workshop_lib.build --times    # each section's stated time against the count
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from workshop_lib.errors import WorkshopError
from workshop_lib.lab import budget
from workshop_lib.lab.execute import execute
from workshop_lib.lab.spans import BROKEN_BEGIN, exercise_source, has_spans, solution_source
from workshop_lib.paths import REPO_ROOT, write_atomic

NOTEBOOKS = REPO_ROOT / "notebooks"
SOLUTIONS = REPO_ROOT / "solutions"
EXERCISES = REPO_ROOT / "exercises"
MINE = REPO_ROOT / "runs" / "mine"  # where a learner's write_script puts their version (git-ignored)
SCRIPT_TAG = "script:"
# The exercise versions leave names for the learner to define: no linting of what is left.
EXERCISE_NOQA = "# ruff: noqa (exercise version: the TODOs leave names for you to define)"
_STARTS_BLOCK = re.compile(r"^(def |class |@|async def |if __name__)")


# ------------------------------------------------------------------------------ scripts


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
                others: Sequence[tuple[str, object]] = ()) -> str:
    """The script ``name`` from the cells tagged ``script:<name>`` (``sources``: replacement text by cell id).

    ``nb`` (``source_name``) is the script's home notebook; ``others`` are (name, notebook) pairs of the
    notebooks that lend it cells (steps 2 to 4 share step 1's ``main``), taken as solutions. In the
    script: the home's docstring and imports, then every other cell in notebook order, ``def main``, the
    ``__main__`` guard.
    """
    placed = []
    for order, (where_nb, nb_name, home) in enumerate(
            sorted([(nb, source_name, True)] + [(o, n, False) for n, o in others], key=lambda t: t[1])):
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
    header = [f"# Generated from {source_name} by `python -m workshop_lib.build`: do not edit."]
    header += [f"# (and cells of {lender})" for lender in lenders]
    header.append(f"# Edit the cells tagged {SCRIPT_TAG}{name}, then rebuild.")
    if exercise:
        header.append(EXERCISE_NOQA)
    return "\n".join(header) + "\n" + _join([text for _, text in sorted(placed, key=lambda p: p[0])])


def script_homes(notebooks: dict[str, object]) -> dict[str, str]:
    """Each script's home notebook: the one holding its ``__main__`` guard (else the one with most of its cells)."""
    scores: dict[str, dict[str, int]] = {}
    for nb_name, nb in notebooks.items():
        for i, cell in enumerate(nb.cells):
            for name in script_names(cell):
                guard = _kind(solution_source(cell.source, f"{nb_name} cell {i}")) == 3
                scores.setdefault(name, {}).setdefault(nb_name, 0)
                scores[name][nb_name] += 1000 if guard else 1
    return {name: max(by_nb, key=lambda n: (by_nb[n], n)) for name, by_nb in scores.items()}


# ---------------------------------------------------------------------------- notebooks


_BUGS = " Some cells hold a bug instead of a TODO: run them as they are, read what the run says, then fix them."


def exercise_notebook(nb, source_name: str):
    """Outputs cleared, solution spans replaced, a header cell pointing to the solution notebook."""
    import nbformat

    ex = copy.deepcopy(nb)
    ex.metadata.pop("widgets", None)
    todos = any(c.cell_type == "code" and has_spans(c.source) for c in nb.cells)
    bugs = any(c.cell_type == "code" and BROKEN_BEGIN in c.source for c in nb.cells)
    for i, cell in enumerate(ex.cells):
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
            cell.source = exercise_source(cell.source, f"{source_name} cell {i}")
    first_code = next((c for c in ex.cells if c.cell_type == "code"), None)
    if first_code is not None:
        first_code.source = EXERCISE_NOQA + "\n" + first_code.source
    link = f"../{source_name}"
    where = nb.metadata.get("lab", {})  # {"step": "...", "outcome": "..."}: what this notebook is in the lab
    stated = budget.stated_minutes(nb.cells[0].source) if nb.cells else None
    header = nbformat.v4.new_markdown_cell(
        f"**Where you are:** {where.get('step', Path(source_name).stem)}. "
        f"**Time:** {f'about {stated} minutes' if stated else 'as you like'}. "
        f"**At the end you have:** {where.get('outcome', 'run every cell')}.\n\n"
        + (f"Fill in each `# TODO` (its cell raises `NotImplementedError` until you do), run the cell, then run "
           f"the check cell below it.{_BUGS if bugs else ''} Stuck? The worked solution is in [{source_name}]({link})."
           if todos else
           f"This notebook has nothing to fill in: run the cells in order. The executed version, with its outputs, "
           f"is [{source_name}]({link}).")
        + "\n\n*Exercise version, generated by `python -m workshop_lib.build` from the solution notebook: "
          "do not edit (maintainers: change the solution notebook and rebuild).*")
    header.id = "exercise-header"
    ex.cells.insert(0, header)
    return ex


def source_notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb"))  # 00_baseline ... 04a_patterns ...


def _read_sources() -> dict[str, object]:
    import nbformat

    return {p.relative_to(REPO_ROOT).as_posix(): nbformat.read(p, as_version=4) for p in source_notebooks()}


def outputs() -> dict[Path, str]:
    """Every generated file and the text it should hold."""
    import nbformat

    notebooks = _read_sources()
    files: dict[Path, str] = {}
    for name, home in script_homes(notebooks).items():
        others = [(n, nb) for n, nb in notebooks.items() if n != home]
        files[SOLUTIONS / f"{name}.py"] = script_text(notebooks[home], name, home, exercise=False, others=others)
        files[EXERCISES / f"{name}.py"] = script_text(notebooks[home], name, home, exercise=True, others=others)
    for source_name, nb in notebooks.items():
        files[EXERCISES / Path(source_name).name] = nbformat.writes(exercise_notebook(nb, source_name)) + "\n"
    return files


def stale(files: dict[Path, str]) -> list[Path]:
    return [p for p, text in files.items() if not p.is_file() or p.read_text() != text]


def build(check: bool = False) -> list[Path]:
    files = outputs()
    changed = stale(files)
    if not check:
        for path in changed:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(files[path])
    return changed


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
    """Write this notebook's script, as you ran its cells, to runs/mine/<name>.py; return the path.

    ``notebook`` is the notebook's file (relative to the kernel's directory, which
    is the notebook's). Cells you ran since track_cells() count as run; the
    others as saved. The result is your version: a TODO still open raises
    NotImplementedError when the script reaches it.
    """
    import nbformat

    path = Path(notebook).resolve()
    if not path.is_file():
        raise WorkshopError(f"notebook {notebook} not found from {Path.cwd()}; pass its file name")
    nb = nbformat.read(path, as_version=4)
    names = list(dict.fromkeys(n for cell in nb.cells for n in script_names(cell)))
    if name is None:
        if len(names) != 1:
            raise WorkshopError(f"{path.name} has scripts {names}; say which with name=")
        name = names[0]
    others = [(n, o) for n, o in _read_sources().items() if Path(n).name != path.name]  # lent cells, as solved
    text = script_text(nb, name, path.name, exercise=False, sources=_ran, others=others)
    lines = text.split("\n")
    while lines[0].startswith(("# Generated from", "# (and cells of", "# Edit the cells")):
        lines.pop(0)  # without the "generated, do not edit" header: this one is yours
    body = "\n".join(lines)
    text = f"# Your {name}, written from {path.name} by workshop_lib.lab.build.write_script.\n" + body
    out = Path(to) if to else MINE / f"{name}.py"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, text.encode())  # a job may be starting from the last version: never half written
    print(f"wrote {out.relative_to(REPO_ROOT) if out.is_relative_to(REPO_ROOT) else out} "
          f"({text.count(chr(10))} lines)")
    return out


# --------------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m workshop_lib.build", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a generated file is stale")
    p.add_argument("--execute", nargs="*", metavar="NOTEBOOK",
                   help="first re-run these solution notebooks (in notebooks/) and store their outputs")
    p.add_argument("--times", action="store_true",
                   help="print each notebook's and section's stated time against the count (lab/budget.py)")
    args = p.parse_args(argv)
    if args.times:
        print(budget.table([budget.count(path) for path in source_notebooks()]))
        return
    for name in args.execute or ():
        path = NOTEBOOKS / Path(name).name
        print(f"executing {path.relative_to(REPO_ROOT)}", flush=True)
        execute(path)
    changed = build(check=args.check)
    for path in changed:
        rel = path.relative_to(REPO_ROOT)
        print(f"stale: {rel}" if args.check else f"wrote {rel}")
    if args.check and changed:
        print("generated files are out of date: run python -m workshop_lib.build", file=sys.stderr)
        raise SystemExit(1)
    if not changed:
        print("generated files are up to date")
