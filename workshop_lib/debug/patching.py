"""The one way the tools replace a function and put it back: :func:`patched`.

Used for torch's collectives (:mod:`workshop_lib.debug.collectives`), for the
calls the checks record (:mod:`workshop_lib.checks.record`) and for what the
checks fake. It always restores on leaving the block, except where someone
else has replaced the same attribute since: theirs stays, and their own
restore puts back what they found.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

_MISSING = object()


@contextlib.contextmanager
def patched(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[Any]:
    """``owner.name`` (``owner[name]`` for a dict or os.environ) is ``make(original)`` while the block runs.

    Yields the original (None where a mapping had no such key).
    """
    is_dict = isinstance(owner, MutableMapping)
    original = owner.get(name, _MISSING) if is_dict else getattr(owner, name)
    replacement = make(None if original is _MISSING else original)
    if is_dict:
        owner[name] = replacement
    else:
        setattr(owner, name, replacement)
    try:
        yield original
    finally:
        current = owner.get(name) if is_dict else getattr(owner, name, None)
        # Not if someone replaced it again since: theirs stays. (os.environ hands back equal strings, not the same.)
        if current is replacement or (is_dict and isinstance(current, str) and current == replacement):
            if is_dict and original is _MISSING:
                owner.pop(name, None)
            elif is_dict:
                owner[name] = original
            else:
                setattr(owner, name, original)
