"""Measured seconds per test file, so that pytest-xdist starts the longest files first.

    pytest --junitxml=/tmp/suite.xml && python -m tools.durations /tmp/suite.xml

Reads a JUnit XML report of a whole run and writes tests/durations.json: {file: seconds},
the sum of its tests' times. tests/conftest.py orders the files by it, longest first
(pytest-split stores durations for the same reason): each file runs on one worker
(``--dist loadfile``), and a long file handed out last would leave the other worker idle.
A file missing from it (a new one) runs after the measured ones; run this again.
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DURATIONS = ROOT / "tests" / "durations.json"


def file_of(classname: str) -> str:
    """The file a JUnit classname names: tests.unit.core.test_data -> tests/unit/core/test_data.py;
    notebooks.03_ddp.ipynb -> notebooks/03_ddp.ipynb."""
    if classname.endswith(".ipynb"):
        folder, name = classname[: -len(".ipynb")].rsplit(".", 1)
        return f"{folder.replace('.', '/')}/{name}.ipynb"
    parts = classname.split(".")
    while parts and not parts[-1].startswith("test_"):  # a class inside the module
        parts.pop()
    return "/".join(parts) + ".py"


def per_file(report: Path) -> dict[str, float]:
    seconds: Counter[str] = Counter()
    for case in ET.parse(report).iter("testcase"):
        seconds[file_of(case.get("classname", ""))] += float(case.get("time") or 0)
    return {name: round(s, 1) for name, s in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tools.durations", description=__doc__.splitlines()[0])
    p.add_argument("report", type=Path, help="the JUnit XML of a whole run (pytest --junitxml=FILE)")
    opts = p.parse_args(argv)
    if not opts.report.is_file():
        p.error(f"no report {opts.report}; run pytest --junitxml={opts.report} first")
    durations = per_file(opts.report)
    missing = [name for name in durations if not (ROOT / name).is_file()]
    if missing:
        p.error(f"the report names files that are not here ({', '.join(missing[:3])}); is it this repository's?")
    DURATIONS.write_text(json.dumps(durations, indent=1) + "\n")
    print(f"wrote {DURATIONS.relative_to(ROOT)}: {len(durations)} files, {sum(durations.values()):.0f} s in all")


if __name__ == "__main__":
    main()
