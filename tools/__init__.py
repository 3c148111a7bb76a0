"""The course's own tooling, run from the repository root and never installed with the package.

    python -m tools.build      # solutions/ and exercises/ from the solution notebooks (--check, --execute, --times)
    python -m tools.site       # the lesson site, from docs/ (--open, --check, --schedule)
    python -m tools.selftest   # is this machine ready for the lab? one line
    python -m tools.jupyter_settings   # the lab's JupyterLab settings, into this environment

What a learner's kernel calls stays in the package (``workshop_lib.authoring.scripts``: ``write_script``); the
site's Sphinx extension lives beside the pages it serves, in ``docs/_ext/``. These modules import the package,
never the other way round (``lint-imports``).
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the clone: notebooks/, solutions/, exercises/, docs/
