"""User-facing errors, and the one way to shorten any error to a line."""

from __future__ import annotations

import re


class WorkshopError(Exception):
    """A problem the user can fix. The message names the bad value and the fix."""


def first_line(err: BaseException | str, limit: int = 200) -> str:
    """The first line of an error's message (of ``err`` itself for a string), else the error's type name."""
    text = (str(err).strip().splitlines() or [""])[0][:limit]
    return text or (type(err).__name__ if isinstance(err, BaseException) else "")


def first_sentence(err: BaseException | str, limit: int = 160) -> str:
    """torch's error without its C++ source location (``[../gloo/...] ``), up to its first full stop."""
    text = re.sub(r"^\[[^\]]*\] ", "", first_line(err, 10_000))
    return text.split(". ")[0][:limit]
