"""Where the workshop's files are, and writing files that are never half there (snapshots, metrics.json).

The package works installed as well as from the clone: the shipped dataset is
package data (:data:`DEFAULT_DATA`: ``dataset/`` in the clone, the package
``workshop_lib.dataset`` installed), and runs go under the current folder
(``--out runs/latest``, relative). The lab's instruments that need the clone
(the notebooks, the solutions, the exercises, a learner's ``runs/mine``) find it
from the current folder with :func:`lab_root`, never from where the package lies.
"""

from __future__ import annotations

import os
import tempfile
from importlib.resources import files
from pathlib import Path

from workshop_lib.errors import WorkshopError


def _shipped(name: str) -> Path:
    """The package data ``name``: dataset/ of the clone (the editable install maps workshop_lib.dataset there),
    workshop_lib/dataset/ in site-packages (pyproject.toml's package-dir)."""
    try:
        folder = files("workshop_lib.dataset")
    except ModuleNotFoundError:  # an editable install made before pyproject.toml mapped dataset/ (its finder is fixed)
        raise WorkshopError("workshop_lib.dataset (the shipped table, dataset/) is not installed: in your clone of "
                            "the workshop, run `pip install --no-deps -e .` again") from None
    return Path(folder / name)


PACKAGE = Path(__file__).resolve().parent  # workshop_lib/, in the clone or in site-packages
DEFAULT_DATA = _shipped("b3db_classification.csv")  # B3DB, shipped in the wheel (package data)
CLONE_MARKS = ("notebooks", "solutions")  # the folders that make a folder the workshop's clone


def _is_clone(folder: Path) -> bool:
    return all((folder / mark).is_dir() for mark in CLONE_MARKS)


def lab_root(start: str | os.PathLike | None = None) -> Path:
    """The workshop's clone, found from the current folder (or ``start``): the clone's files and ``runs/`` live here.

    The first of the folder and its parents that holds notebooks/ and solutions/;
    else the folder itself (an installed package, started elsewhere: runs go there).
    """
    here = Path(start if start is not None else Path.cwd()).resolve()
    return next((folder for folder in (here, *here.parents) if _is_clone(folder)), here)


def clone_root(what: str, start: str | os.PathLike | None = None) -> Path:
    """:func:`lab_root`, for ``what`` that needs the clone itself; else a one-line WorkshopError saying so."""
    root = lab_root(start)
    if not _is_clone(root):
        raise WorkshopError(f"{what} needs the workshop's clone (a folder with notebooks/ and solutions/), and "
                            f"{root} is not in one: cd into your clone of the workshop and run it again")
    return root


def shown(text: str | os.PathLike) -> str:
    """``text`` without the package's folder and the clone's (else the current folder's) absolute path: a printed line
    reads the same on every machine (the shipped dataset ``dataset/...`` in the clone, ``workshop_lib/dataset/...``
    installed; a run's folder ``runs/...``)."""
    text = str(text)
    for folder in (PACKAGE.parent, lab_root()):
        text = text.replace(f"{folder}{os.sep}", "")
    return text


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same directory, then rename: never half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
