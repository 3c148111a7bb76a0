"""Sphinx configuration of the lesson site. Build it with ``python -m tools.site`` (see docs/index.md).

The episodes are the solution notebooks of notebooks/, rendered with their stored outputs and never
executed (nbval already replays them); the site's own extension, ``_ext/lab_site.py``, writes them into
episodes/ (git-ignored) before Sphinx reads anything. Nothing here reaches the network.
"""

import sys
from pathlib import Path

# The extension (_ext/, Sphinx's convention for a project's own extensions) and the repository root: the
# extension reads the notebooks' times with tools/budget.py. Neither is installed with the package.
HERE = Path(__file__).resolve().parent
for folder in (HERE / "_ext", HERE.parent):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

project = "Data-parallel training with PyTorch DDP"
author = "the workshop's authors"
copyright = "the workshop's authors; code MIT, data CC0 1.0"

# Where learners get the lesson: the ONE place to fill in before publishing the site (the pages say "{{ repo_url }}").
# A git URL (``git clone URL``) or the address of an archive; until it is filled in, the pages say who sends it.
repo_url = "the address your instructor sends you"

extensions = ["sphinx_lesson", "sphinx.ext.githubpages", "lab_site"]

# MyST: ::: fences (sphinx-lesson's boxes around text that holds ``` code), $math$, heading anchors for links.
myst_enable_extensions = ["colon_fence", "dollarmath", "deflist", "substitution"]
myst_substitutions = {"repo_url": repo_url}
myst_heading_anchors = 3

# myst-nb: show the stored outputs, never run a notebook; widgets as their text (no widget JavaScript from a CDN).
nb_execution_mode = "off"
nb_merge_streams = True
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None),
                              ("html", "application/vnd.jupyter.widget-state+json", None)]

exclude_patterns = ["_build", "jupyter_execute", "Thumbs.db", ".DS_Store"]
suppress_warnings = []

html_theme = "sphinx_rtd_theme"
html_title = "PyTorch DDP workshop"
html_static_path = ["_static"]
html_css_files = ["lesson.css"]
html_show_sourcelink = False
html_theme_options = {"navigation_depth": 2}
