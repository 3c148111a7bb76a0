"""The lesson site's Sphinx extension, loaded by ``docs/conf.py``; ``python -m tools.site`` builds the site.

It writes the episode pages from the notebooks before Sphinx reads anything (``episodes.py`` beside it),
and gives the pages what must agree with the repository:

* ``{lab-schedule}`` (options ``:part: core|optional|all``, ``:sections:``): the schedule, from the notebooks'
  stated times;
* ``{lab-plan}``: the core path in a three-hour session (start times, the break, the buffer), from the same times;
* ``{lab-time}`core``` (or ``optional``, ``all``, a notebook's name): those minutes, as "2 h 10 min";
* ``{step-diff}``: the lines each step script adds to the one before (``solutions/step*.py``).

Not installed with the package: it lives beside the pages it serves (``docs/_ext/``, Sphinx's convention).
"""

from __future__ import annotations

import difflib
import itertools
import re
from pathlib import Path
from typing import ClassVar

import episodes  # docs/_ext/episodes.py (docs/conf.py puts this folder on sys.path)

from tools import ROOT

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

    Each notebook gets a talk at the board, its stated time, its sections on the projector (the instructor's
    demonstrations, outside the stated time), and a share of what is left over (the buffer for a room that is
    slower than one newcomer), in proportion to its stated time."""
    core = _pick(episodes.episodes(), "core")
    stated = [e.stated or 0 for e in core]
    buffer = (session - WELCOME - BREAK - WRAP_UP - sum(stated) - sum(e.projector for e in core)
              - BOARD * len(core))
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
        shown = f", {e.projector} min on the projector" if e.projector else ""
        add(BOARD + m + e.projector + extra, f"{{doc}}`{e.name} <{'/episodes/' + e.name}>`: {BOARD} min at the board, "
            f"{m} min as the notebook states{shown}, {extra} min of buffer")
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
    steps = sorted((ROOT / "solutions").glob("step[0-9]*.py"))
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
                self.env.note_dependency(str(ROOT / "solutions" / after))
                self.env.note_dependency(str(ROOT / "solutions" / before))
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
