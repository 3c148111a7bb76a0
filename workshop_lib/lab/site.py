"""The lesson site: the Sphinx extension that ``docs/conf.py`` loads, and the one command that builds it.

::

    python -m workshop_lib.site            # docs/_build/html, warnings as errors, offline; prints where it is
    python -m workshop_lib.site --open     # the same, then opens the home page in a browser
    python -m workshop_lib.site --check    # the same, then checks every link (lab/sitelinks.py)
    python -m workshop_lib.site --fresh    # every page read again (done by itself when the episodes changed)

The extension writes the episode pages from the notebooks before Sphinx reads anything
(:mod:`workshop_lib.lab.episodes`), and gives the pages what must agree with the repository:

* ``{lab-schedule}`` (options ``:part: core|optional|all``, ``:sections:``): the schedule, from the notebooks'
  stated times;
* ``{lab-plan}``: the core path in a three-hour session (start times, the break, the buffer), from the same times;
* ``{lab-time}`core``` (or ``optional``, ``all``, a notebook's name): those minutes, as "2 h 10 min";
* ``{step-diff}``: the lines each step script adds to the one before (``solutions/step*.py``).
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import re
import sys
import time
import webbrowser
from pathlib import Path
from typing import ClassVar

from workshop_lib.lab import episodes
from workshop_lib.paths import REPO_ROOT

HTML = episodes.DOCS / "_build" / "html"
QUESTIONS = "episodes.yaml"  # beside conf.py: the questions each episode answers, by notebook name
_UNTIMED = re.compile(r"\s*\((?:about )?\d+ min[^)]*\)\s*$")  # a heading's stated time, shown in its own column


def _pick(eps: list[episodes.Episode], part: str) -> list[episodes.Episode]:
    if part == "core":
        return [e for e in eps if e.core]
    if part == "optional":
        return [e for e in eps if not e.core]
    if part == "all":
        return eps
    return [e for e in eps if e.name.startswith(part)]


def schedule(part: str = "all", sections: bool = False) -> str:
    """The schedule as a MyST table: one row per notebook (and per section with ``sections``), a total."""
    eps = _pick(episodes.episodes(), part)
    rows = ["| episode | time | at the end you have |", "|---|---|---|"]
    for e in eps:
        rows.append(f"| {{doc}}`{e.name} <{'/episodes/' + e.name}>`: {e.title} | {_time(e.stated)} | {e.outcome} |")
        if sections:
            rows += [f"| &nbsp;&nbsp;&nbsp;&nbsp;{_UNTIMED.sub('', title)} | {'' if m is None else f'{m} min'} | |"
                     for title, m in e.sections]
    rows.append(f"| **total**: {len(eps)} notebook(s) | **{episodes.hours(episodes.minutes(eps))}** | |")
    return "\n".join(rows)


SESSION = 180  # minutes of the session the plan fills
WELCOME, BREAK, WRAP_UP, BOARD = 15, 10, 15, 3  # minutes: set-up and intro, the break, check --all and recap, a talk
BREAK_AFTER = "02_"  # the break comes after this notebook


def plan(session: int = SESSION) -> list[tuple[int, int, str]]:
    """The core path in a session of ``session`` minutes: (start, minutes, what), from the notebooks' stated times.

    Each notebook gets a talk at the board, its stated time, and a share of what is left over (the buffer for a
    room that is slower than one newcomer), in proportion to its stated time."""
    core = _pick(episodes.episodes(), "core")
    stated = [e.stated or 0 for e in core]
    buffer = session - WELCOME - BREAK - WRAP_UP - sum(stated) - BOARD * len(core)
    if buffer < 0:
        raise ValueError(f"the core path ({sum(stated)} min stated) does not fit a {session}-minute session")
    shares = [buffer * m // max(sum(stated), 1) for m in stated]
    shares[-1] += buffer - sum(shares)
    rows, start = [], 0

    def add(minutes: int, what: str) -> None:
        nonlocal start
        rows.append((start, minutes, what))
        start += minutes

    add(WELCOME, "welcome; every self-test says `ready` (fix the rest now); the problem: one process, one device")
    for e, m, extra in zip(core, stated, shares, strict=True):
        add(BOARD + m + extra, f"{{doc}}`{e.name} <{'/episodes/' + e.name}>`: {BOARD} min at the board, {m} min as the "
            f"notebook states, {extra} min of buffer")
        if e.name.startswith(BREAK_AFTER):
            add(BREAK, "break")
    add(WRAP_UP, "`python -m workshop_lib.check --all` around the room; the recap of 03; what the optional parts hold")
    return rows


def plan_table(session: int = SESSION) -> str:
    rows = ["| when | minutes | what |", "|---|---|---|"]
    rows += [f"| {start // 60}:{start % 60:02d} | {minutes} | {what} |" for start, minutes, what in plan(session)]
    rows.append(f"| {session // 60}:{session % 60:02d} | | end |")
    return "\n".join(rows)


def _time(minutes: int | None) -> str:
    return "not stated" if minutes is None else f"~{minutes} min"


def readme_rows() -> str:
    """The README's schedule rows, one per notebook: | `name` | title | ~N min | scripts |."""
    return "\n".join(f"| `{e.name}` | {e.title} | {_time(e.stated)} | "
                     f"{', '.join(f'`solutions/{s}.py`' for s in e.scripts) or 'exercises only'} |"
                     for e in episodes.episodes())


def _code(script: Path) -> list[str]:
    """A step script's lines without its generated header and module docstring (they differ in every step)."""
    lines = script.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    if start < len(lines) and lines[start].startswith('"""'):
        closing = lines[start].count('"""') > 1
        start += 1
        while not closing and start < len(lines):
            closing = '"""' in lines[start]
            start += 1
    return lines[start:]


def step_diffs(context: int = 0) -> list[tuple[str, str, str]]:
    """(earlier script, later script, the unified diff of their code) for each pair of consecutive steps."""
    steps = sorted((REPO_ROOT / "solutions").glob("step[0-9]*.py"))
    out = []
    for before, after in itertools.pairwise(steps):
        a, b = _code(before), _code(after)
        diff = difflib.unified_diff(a, b, f"solutions/{before.name}", f"solutions/{after.name}", n=context,
                                    lineterm="")
        out.append((before.name, after.name, "\n".join(diff)))
    return out


# ---- the Sphinx extension ----------------------------------------------------------------------------------------

def _write_episodes(app, config) -> None:
    import yaml
    from sphinx.util import logging

    questions = yaml.safe_load((Path(app.confdir) / QUESTIONS).read_text()) or {}
    for ep in episodes.episodes():
        if not questions.get(ep.name):
            logging.getLogger(__name__).warning(f"docs/{QUESTIONS} has no questions for {ep.name}: add them")
    pages = episodes.write_episodes(questions, Path(app.srcdir) / "episodes")
    for old in (Path(app.outdir) / "episodes").glob("*.html"):  # a notebook that is gone leaves no page behind
        if old.stem not in {p.stem for p in pages}:
            old.unlink()


def setup(app):
    from docutils import nodes
    from docutils.parsers.rst import directives
    from sphinx.util.docutils import SphinxDirective

    class Schedule(SphinxDirective):
        option_spec: ClassVar[dict] = {"part": directives.unchanged, "sections": directives.flag}

        def run(self):
            for ep in episodes.episodes():  # a page with a schedule is read again when a notebook changes
                self.env.note_dependency(str(ep.path))
            text = schedule(self.options.get("part", "all"), "sections" in self.options)
            return self.parse_text_to_nodes(text)

    class Plan(SphinxDirective):
        def run(self):
            for ep in episodes.episodes():
                self.env.note_dependency(str(ep.path))
            return self.parse_text_to_nodes(plan_table())

    class StepDiff(SphinxDirective):
        option_spec: ClassVar[dict] = {"context": directives.nonnegative_int}

        def run(self):
            out = []
            for before, after, diff in step_diffs(self.options.get("context", 0)):
                self.env.note_dependency(str(REPO_ROOT / "solutions" / after))
                self.env.note_dependency(str(REPO_ROOT / "solutions" / before))
                title = nodes.paragraph(text=f"{before} → {after}")
                block = nodes.literal_block(diff, diff, language="diff")
                out += [title, block]
            return out

    def lab_time(name, rawtext, text, lineno, inliner, options=None, content=None):
        eps = _pick(episodes.episodes(), text.strip())
        if not eps:
            msg = inliner.reporter.error(f"lab-time: no notebook matches {text!r}", line=lineno)
            return [inliner.problematic(rawtext, rawtext, msg)], [msg]
        return [nodes.Text(episodes.hours(episodes.minutes(eps)))], []

    app.connect("config-inited", _write_episodes)
    app.add_directive("lab-schedule", Schedule)
    app.add_directive("step-diff", StepDiff)
    app.add_directive("lab-plan", Plan)
    app.add_role("lab-time", lab_time)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# ---- the command -------------------------------------------------------------------------------------------------

STAMP = ".lab-pages"  # in the output folder: the generated pages and files of the last build, one a line
# Sphinx's files in the output folder that hold pages of earlier builds (a page gone stays there): a fresh build
# removes them. The copies of the files the pages offer, the pages' sources, the parsed pages, the episodes, the
# search index.
GENERATED = ("_downloads", "_sources", ".doctrees", "episodes", "searchindex.js", STAMP)


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
    args = ["-W", "--keep-going", "-n", "-q", "-b", "html", str(episodes.DOCS), str(out)]
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
    parser = argparse.ArgumentParser(prog="python -m workshop_lib.site", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HTML, help="where the HTML goes (default: docs/_build/html)")
    parser.add_argument("--fresh", action="store_true", help="read every page again (no incremental build)")
    parser.add_argument("--open", action="store_true", help="open the home page in a browser afterwards")
    parser.add_argument("--check", action="store_true", help="check every link of the built site afterwards")
    parser.add_argument("--schedule", action="store_true", help="only print the README's schedule rows (no build)")
    args = parser.parse_args(argv)
    if args.schedule:
        print(readme_rows())
        return 0
    seconds = build(args.out, args.fresh)
    home = args.out / "index.html"
    print(f"site built in {seconds:.0f} s: {home}")
    if args.check:
        from workshop_lib.lab import sitelinks

        problems = sitelinks.check(args.out)
        if problems:
            print("\n".join(problems), file=sys.stderr)
            return 1
        print("every link resolves")
    if args.open:
        webbrowser.open(home.resolve().as_uri())
    return 0

