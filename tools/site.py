"""The lesson site, built from docs/ in one command (run it from the repository root)::

    python -m tools.site            # docs/_build/html, warnings as errors, offline; prints where it is
    python -m tools.site --open     # the same, then opens the home page in a browser
    python -m tools.site --check    # the same, then checks every link (tools/sitelinks.py)
    python -m tools.site --fresh    # every page read again (done by itself when the episodes changed)
    python -m tools.site --schedule # only the README's schedule rows, from the notebooks (no build)

The pages, and what the extension adds to them (episodes from the notebooks, the schedule, the step diffs):
``docs/_ext/lab_site.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
import webbrowser
from pathlib import Path

from tools import ROOT
from workshop_lib.errors import WorkshopError

DOCS = ROOT / "docs"
EXT = DOCS / "_ext"  # the site's Sphinx extension; docs/conf.py puts it on sys.path the same way
if str(EXT) not in sys.path:
    sys.path.insert(0, str(EXT))

import episodes  # noqa: E402  (docs/_ext/episodes.py)
import lab_site  # noqa: E402  (docs/_ext/lab_site.py)

HTML = DOCS / "_build" / "html"
STAMP = ".lab-pages"  # in the output folder: the generated pages and files of the last build, one a line
# Sphinx's files in the output folder that hold pages of earlier builds (a page gone stays there): a fresh build
# removes them. The copies of the files the pages offer, the pages' sources, the parsed pages, the episodes, the
# search index.
GENERATED = ("_downloads", "_sources", ".doctrees", "episodes", "searchindex.js", STAMP)
# What the build imports from pyproject's "docs" extra, by import name; a learner's "lab" install has none of them.
DOCS_EXTRA = ("sphinx", "myst_nb", "sphinx_lesson", "sphinx_rtd_theme", "yaml")


def missing_docs_extra() -> list[str]:
    """The packages of the docs extra that this Python cannot import (none where it was installed)."""
    import importlib.util

    return [name for name in DOCS_EXTRA if importlib.util.find_spec(name) is None]


def generated_pages() -> list[str]:
    """What the built site holds because a notebook exists: each episode page and the scripts it offers."""
    return sorted({f"episodes/{e.name}" for e in episodes.episodes()}
                  | {f"solutions/{s}.py" for e in episodes.episodes() for s in e.scripts})


def needs_fresh(out: Path, pages: list[str]) -> bool:
    """Whether ``out`` must be built afresh: its last build made other pages (or none is recorded).

    An incremental build reads only the sources that changed, so a page linking to an episode that is gone
    (or to a new one) would keep its old links, and the copies of removed files would stay in ``_downloads``."""
    stamp = out / STAMP
    return not stamp.is_file() or stamp.read_text().splitlines() != pages


def build(out: Path = HTML, fresh: bool = False) -> float:
    """Build the site into ``out`` (warnings are errors, nitpicky, no network); the seconds it took.

    Afresh (every page read again, the files of earlier builds removed) with ``fresh`` or when the episodes
    changed."""
    import shutil

    from sphinx.cmd.build import build_main

    pages = generated_pages()
    args = ["-W", "--keep-going", "-n", "-q", "-b", "html", str(DOCS), str(out)]
    if fresh or needs_fresh(out, pages):
        args.insert(0, "-E")
        for made in GENERATED:  # what Sphinx keeps of earlier builds; it makes them again for the pages there are
            shutil.rmtree(out / made, ignore_errors=True) if (out / made).is_dir() else (out / made).unlink(True)
    start = time.monotonic()
    code = build_main(args)
    if code:
        raise SystemExit(f"error: the site did not build (sphinx-build exit {code}); the warnings above say why")
    (out / STAMP).write_text("\n".join(pages) + "\n")
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.site", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HTML, help="where the HTML goes (default: docs/_build/html)")
    parser.add_argument("--fresh", action="store_true", help="read every page again (no incremental build)")
    parser.add_argument("--open", action="store_true", help="open the home page in a browser afterwards")
    parser.add_argument("--check", action="store_true", help="check every link of the built site afterwards")
    parser.add_argument("--schedule", action="store_true", help="only print the README's schedule rows (no build)")
    args = parser.parse_args(argv)
    if args.schedule:
        print(lab_site.readme_rows())
        return 0
    missing = missing_docs_extra()
    if missing:  # a learner who installed [lab]: one line, not sphinx's ModuleNotFoundError
        raise WorkshopError(f"the site needs the docs extra ({', '.join(missing)} not installed): "
                            f'pip install -e ".[docs]", then run this again')
    seconds = build(args.out, args.fresh)
    home = args.out / "index.html"
    print(f"site built in {seconds:.0f} s: {home}")
    if args.check:
        from tools import sitelinks

        problems = sitelinks.check(args.out)
        if problems:
            print("\n".join(problems), file=sys.stderr)
            return 1
        print("every link resolves")
    if args.open:
        webbrowser.open(home.resolve().as_uri())
    return 0


if __name__ == "__main__":
    from workshop_lib.cli import run_cli

    raise SystemExit(run_cli(main))
