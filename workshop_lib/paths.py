"""Where the project's files are, and writing files that are never half there (snapshots, metrics.json)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent  # the clone: dataset/, notebooks/, runs/
DEFAULT_DATA = REPO_ROOT / "dataset" / "b3db_classification.csv"


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
