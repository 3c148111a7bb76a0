"""The one way the tools replace a function and put it back: :func:`patched`.

It restores on leaving the block, unless someone replaced the same attribute since: theirs stays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

_MISSING = object()


@contextlib.contextmanager
def patched(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[Any]:
    """``owner.name`` (``owner[name]`` for a dict or os.environ) is ``make(original)`` while the block runs; yields
    the original (None where a mapping had no such key)."""
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
