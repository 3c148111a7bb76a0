"""Which frames of a stack are the learner's: the one filter, keyed on packages, not on file names.

*Library* frames: Python's standard library, installed packages (torch included), workshop_lib's tool
subpackages and command modules. The rest is the learner's, workshop_lib's core included unless
``core_is_library=True`` (for a line number in the learner's own script).
"""

from __future__ import annotations

import os
import sysconfig
import traceback

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # workshop_lib/
_TOOLS = tuple(os.path.join(_PACKAGE, p) + os.sep for p in sorted(os.listdir(_PACKAGE))  # every subpackage
               if os.path.isfile(os.path.join(_PACKAGE, p, "__init__.py")))
_COMMANDS = tuple(os.path.join(_PACKAGE, f"{m}.py") for m in ("check", "cli", "diagnose", "watch"))
_STDLIB = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})
_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def is_tool(path: str) -> bool:
    """Is ``path`` a file of workshop_lib's tools (its subpackages and command modules)?"""
    path = os.path.abspath(path)
    return path.startswith(_TOOLS) or path in _COMMANDS


def is_library(path: str, core_is_library: bool = False) -> bool:
    """Is ``path`` someone else's code: stdlib, an installed package, workshop_lib's tools (its core too, if asked)?
    Relative paths as py-spy prints them (``torch/nn/...``, ``workshop_lib/...``) count by their first part."""
    if path.startswith("<"):  # "<frozen runpy>", "<string>"
        return not path.startswith("<ipython-input")
    if not os.path.isabs(path) and path.split("/", 1)[0] in ("torch", "threading.py", "runpy.py"):
        return True
    if not os.path.isabs(path) and path.split("/", 1)[0] == "workshop_lib":  # py-spy's short name: from anywhere
        full = os.path.join(os.path.dirname(_PACKAGE), path)
        return is_tool(full) or core_is_library
    full = os.path.abspath(path)
    if any(marker in full for marker in _INSTALLED) or full.startswith(_STDLIB) or is_tool(full):
        return True
    return core_is_library and full.startswith(_PACKAGE + os.sep)


def users(stack: traceback.StackSummary | list[traceback.FrameSummary], core_is_library: bool = False) -> list:
    """The frames of ``stack`` that are the learner's (see :func:`is_library`), outermost first."""
    return [f for f in stack if not is_library(f.filename, core_is_library)]


def since_fork(stack: list[traceback.FrameSummary]) -> list[traceback.FrameSummary]:
    """A forked rank's frames from its entry point (the tools' ``_rank_main``) on, not the kernel's before the fork."""
    starts = [i for i, f in enumerate(stack) if f.name == "_rank_main" and is_tool(f.filename)]
    return stack[starts[-1] + 1:] if starts else stack


def raised_at(err: BaseException) -> traceback.FrameSummary | None:
    """The innermost of the learner's frames in ``err``'s traceback (the core counted as library): the line of theirs
    that led to the raise."""
    mine = users(traceback.extract_tb(err.__traceback__), core_is_library=True)
    return mine[-1] if mine else None


def short(path: str) -> str:
    """``path`` relative to the working directory when it lies below it, else as it is."""
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    return path if rel.startswith("..") else rel
