"""User-facing errors, and the one way to shorten any error to a line."""

from __future__ import annotations

import re


class InputError(SystemExit):
    """Bad input to a script (a flag, the data, a snapshot): the message names the bad value and the fix.

    A ``SystemExit``, as argparse's own errors are: uncaught, Python prints the
    one line ``error: ...`` to stderr and exits with status 1, with no traceback,
    so a step script needs no wrapper around its ``main``. ``except Exception``
    does not catch it; catch ``InputError`` (or ``SystemExit``) where that is meant.
    """

    def __init__(self, message: str):
        super().__init__(f"error: {message}")

    @property
    def message(self) -> str:
        return str(self.code).removeprefix("error: ")


class WorkshopError(Exception):
    """A problem with the lab's tools (a launch, a check, the build) that the user can fix, in one line."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of the lab's own frames
        return [f"{type(self).__name__}: {self}"]


def first_line(err: BaseException | str, limit: int = 200) -> str:
    """The first line of an error's message (of ``err`` itself for a string), else the error's type name."""
    text = (str(err).strip().splitlines() or [""])[0][:limit]
    return text or (type(err).__name__ if isinstance(err, BaseException) else "")


def first_sentence(err: BaseException | str, limit: int = 160) -> str:
    """torch's error without its C++ source location (``[../gloo/...] ``), up to its first full stop."""
    text = re.sub(r"^\[[^\]]*\] ", "", first_line(err, 10_000))
    return text.split(". ")[0][:limit]
