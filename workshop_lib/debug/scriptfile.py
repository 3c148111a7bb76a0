"""Whether a path is a Python script that ``python`` can run, in one line where it is not: the watch and the checker
refuse the same files with the same words (a missing file, binary data, a notebook, a shell script, a syntax error)."""

from __future__ import annotations

from pathlib import Path

NOT_RUNNABLE, SYNTAX = 2, 1  # exit statuses: python's own for a missing file (2) and a SyntaxError (1)


def refused(path: str | Path) -> tuple[str, int] | None:
    """(the one line, the exit status) for a ``path`` that ``python path`` cannot run; None when it compiles."""
    path = Path(path)
    if not path.is_file():
        return f"{path}: no such file; pass the path of the Python script that trains", NOT_RUNNABLE
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return f"{path.name} is not a Python script (binary data, not text): pass the .py file that trains", NOT_RUNNABLE
    if path.suffix == ".ipynb":
        return (f"{path.name} is a notebook, not a Python script: write its script cells out first "
                f"(scripts.write_script, or jupyter nbconvert --to script) and pass that file"), NOT_RUNNABLE
    first = text.splitlines()[0] if text else ""
    if first.startswith("#!") and "python" not in first:
        return (f"{path.name} is not a Python script (its first line, {first}, runs another program): pass the .py "
                f"file it starts, with its arguments"), NOT_RUNNABLE
    try:
        compile(raw, str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as err:  # ValueError: null bytes, in older Pythons
        where = f":{err.lineno}" if getattr(err, "lineno", None) else ""
        kind = "" if path.suffix == ".py" else " (is it a Python script?)"
        return f"{path.name}{where}: {type(err).__name__}: {getattr(err, 'msg', None) or err}{kind}; fix it", SYNTAX
    return None
