"""Running a solution notebook to store its outputs, and editing a notebook under a lock while others may."""

from __future__ import annotations

import contextlib
from pathlib import Path


@contextlib.contextmanager
def edit_notebook(path: Path):
    """Read a source notebook under an exclusive lock and write it back when the block succeeds.

    For authors (and tools) changing notebooks while others may run or edit them:
    ``with edit_notebook(p) as nb: nb.cells[3].source = ...``.
    """
    import fcntl

    import nbformat

    path = Path(path)
    with open(path.with_name(f".{path.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        nb = nbformat.read(path, as_version=4)
        yield nb
        tmp = path.with_name(f".{path.name}.tmp")
        nbformat.write(nb, tmp)
        tmp.replace(path)


def execute(path: Path, timeout: int = 600) -> None:
    """Run a solution notebook top to bottom in its own directory and store the outputs.

    The run works on a copy; the outputs are then merged into the file as it is now,
    cell by cell (matched by id), for the cells whose source did not change meanwhile.
    """
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    ran = {cell.get("id"): cell for cell in nb.cells}
    with edit_notebook(path) as current:
        for cell in current.cells:
            done = ran.get(cell.get("id"))
            if cell.cell_type == "code" and done is not None and done.source == cell.source:
                cell.outputs, cell.execution_count = done.outputs, done.execution_count
                if "execution" in done.metadata:  # when it ran: tools/budget.py counts the run time from it
                    cell.metadata["execution"] = done.metadata["execution"]
