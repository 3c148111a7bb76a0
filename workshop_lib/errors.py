"""User-facing errors: a problem the user can fix, with a message that names the fix."""

from __future__ import annotations


class WorkshopError(Exception):
    """A problem the user can fix. The message names the bad value and the fix."""
