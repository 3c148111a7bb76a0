"""Fork or spawn (:func:`start_method`), and what a spawned rank gets by value: the cell's function (:func:`pack`).

A spawned rank is a fresh Python that cannot import a function defined in a cell: cloudpickle sends it the
function, its arguments and the cells' source lines (so tracebacks and the hang watch show them).
"""

from __future__ import annotations

import collections
import functools
import io
import linecache
import os
import pickle
import sys
import types
from collections.abc import Callable
from typing import ClassVar

from workshop_lib.errors import WorkshopError

START_METHOD = "WORKSHOP_START_METHOD"  # fork | spawn: how notebook_launch starts its ranks (default: fork on Linux)


def start_method() -> str:
    """``WORKSHOP_START_METHOD`` if set, else fork on Linux (the fastest) and spawn elsewhere.

    Fork is unsafe on macOS (system frameworks may hold locks across it), and Windows has none.
    """
    asked = os.environ.get(START_METHOD, "").strip().lower()
    if not asked:
        return "fork" if sys.platform.startswith("linux") else "spawn"
    if asked not in ("fork", "spawn"):
        raise WorkshopError(f"{START_METHOD}={asked!r}: use fork (Linux) or spawn (any system), or unset it")
    if asked == "fork" and sys.platform == "win32":
        raise WorkshopError(f"{START_METHOD}=fork, and Windows has no fork: unset it (spawn is used there)")
    return asked


@functools.cache
def _pickler() -> type:
    """cloudpickle's Pickler, keeping each function's file name (3.1 writes ``<dynamic-code>``): tracebacks name the cell."""
    import cloudpickle
    from cloudpickle import cloudpickle as implementation

    code_reduce = getattr(implementation, "_code_reduce", None)
    if code_reduce is None:  # another cloudpickle: its own way
        return cloudpickle.Pickler

    def code_with_its_file(code: types.CodeType):
        make, args = code_reduce(code)
        return make, tuple(code.co_filename if isinstance(a, str) and a == "<dynamic-code>" else a for a in args)

    class Pickler(cloudpickle.Pickler):
        dispatch_table: ClassVar = collections.ChainMap({types.CodeType: code_with_its_file},
                                                        cloudpickle.Pickler.dispatch_table)

    return Pickler


def pack(fn: Callable, args: tuple, name: str) -> bytes:
    """``fn`` and ``args`` by value, with the source lines of code that has no file (the cells); a one-line error."""
    lines = {path: entry for path, entry in linecache.cache.items() if len(entry) == 4 and entry[1] is None}
    pickler = _pickler()
    try:
        with io.BytesIO() as buffer:
            pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump((fn, args, lines))
            return buffer.getvalue()
    except Exception as err:  # cloudpickle raises what the object's own pickling raises (TypeError, PicklingError...)
        raise WorkshopError(f"notebook_launch starts its ranks with spawn here, which sends {name} and its arguments "
                            f"to them by value, and one of them cannot be sent ({type(err).__name__}: "
                            f"{str(err).splitlines()[0] if str(err) else '?'}): pass plain data (tensors, numbers, "
                            "lists) and create the rest inside the function") from None


def unpack(packed: bytes) -> tuple[Callable, tuple]:
    """In the spawned rank: the function and its arguments; the cells' lines go into linecache."""
    fn, args, lines = pickle.loads(packed)
    linecache.cache.update(lines)
    return fn, args
