"""The lab's JupyterLab settings: it opens clean (no "get notified about Jupyter news?" prompt), and code cells
show line numbers (the hang watch names lines of the learner's cells, notebook 05).

JupyterLab reads default settings from ``labconfig/default_setting_overrides.json`` in each
Jupyter config directory; a learner's own settings still win. An editable install
(``pip install -e .``) cannot put files outside the package, so the set-up runs::

    python -m tools.jupyter_settings     # into <sys.prefix>/etc/jupyter/labconfig/

which merges the repository's ``jupyter-config/labconfig/default_setting_overrides.json`` into
the environment's file (other keys there are kept).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tools import ROOT
from workshop_lib.paths import write_atomic

SHIPPED = ROOT / "jupyter-config" / "labconfig" / "default_setting_overrides.json"


def install(config_dir: Path | None = None) -> Path:
    """Merge the lab's settings into ``config_dir/labconfig`` (default: this environment's); return the file."""
    target = Path(config_dir or Path(sys.prefix) / "etc" / "jupyter") / "labconfig" / SHIPPED.name
    merged = json.loads(target.read_text()) if target.is_file() else {}
    for plugin, settings in json.loads(SHIPPED.read_text()).items():
        merged.setdefault(plugin, {}).update(settings)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, (json.dumps(merged, indent=2) + "\n").encode())
    return target


if __name__ == "__main__":
    print(f"JupyterLab settings for the lab: {install()}")
