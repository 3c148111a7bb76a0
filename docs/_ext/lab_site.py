"""The lesson site's Sphinx extension, loaded by ``docs/conf.py``; ``python -m tools.site`` builds the site.

It writes the episode pages from the notebooks before Sphinx reads anything (``episodes.py`` beside it),
and gives the pages what must agree with the repository:

* ``{lab-schedule}`` (options ``:part: core|optional|all``, ``:sections:``): the schedule, a room's teaching and
  exercise minutes (the notebooks' metadata) and the time alone (their first cells);
* ``{lab-plan}`` (option ``:plan: 3h|day``): a plan of ``tools/budget.py``, a three-hour session or a full day
  (start times, the breaks, the buffer), from the same room minutes;
* ``{lab-time}`core``` (or ``optional``, ``all``, a notebook's name): a room's minutes, as "2 h 10 min";
* ``{step-diff}``: the lines each step script adds to the one before (``solutions/step*.py``);
* ``{lab-objectives}`` (option ``:episode: NAME``): an episode's measurable objectives (docs/episodes.yaml), as its
  page shows them; ``{lab-checkpoints}`` (the same option): its timing checkpoints, from the sections' room minutes;
  ``{lab-board}`` (the same option): what to draw on the board (docs/episodes.yaml), as its page shows it too;
* ``{verdict}`...```: a line the checker prints, quoted (shown as code; ``tests/integration/test_content.py``
  holds every quote to a line ``workshop_lib`` can print, "..." where the line varies).

Not installed with the package: it lives beside the pages it serves (``docs/_ext/``, Sphinx's convention).
"""

from __future__ import annotations

import difflib
import itertools
from pathlib import Path
from typing import ClassVar

import episodes  # docs/_ext/episodes.py (docs/conf.py puts this folder on sys.path)

from tools import ROOT, budget

QUESTIONS = "episodes.yaml"  # beside conf.py: each episode's questions and measurable objectives, by notebook name


def _pick(eps: list[episodes.Episode], part: str) -> list[episodes.Episode]:
    if part == "core":
        return [e for e in eps if e.core]
    if part == "optional":
        return [e for e in eps if not e.core]
    if part == "all":
        return eps
    return [e for e in eps if e.name.startswith(part)]


def schedule(part: str = "all", sections: bool = False) -> str:
    """The schedule as a MyST table: one row per notebook (and per section with ``sections``), a total.

    A room's teaching and exercise minutes (the notebooks' metadata), then the time alone (their first cells)."""
    eps = _pick(episodes.episodes(), part)
    rows = ["| episode | teaching | exercises | alone | at the end you have |", "|---|---|---|---|---|"]
    for e in eps:
        rows.append(f"| {{doc}}`{e.name} <{'/episodes/' + e.name}>`: {e.title} | {_room(e.teaching)} | "
                    f"{_room(e.practice)} | {_time(e.stated)} | {e.outcome} |")
        if sections:
            rows += [f"| &nbsp;&nbsp;&nbsp;&nbsp;{episodes.UNTIMED.sub('', title)} | {_room(t)} | {_room(x)} | "
                     f"{'' if m is None else f'{m} min'} | |"
                     for (title, m), (_, t, x) in zip(e.sections, e.room, strict=True)]
    teaching, practice = sum(e.teaching or 0 for e in eps), sum(e.practice or 0 for e in eps)
    rows.append(f"| **total**: {len(eps)} notebook(s) | **{episodes.hours(teaching)}** | "
                f"**{episodes.hours(practice)}** | **{episodes.hours(episodes.minutes(eps))}** | |")
    return "\n".join(rows)


_room = episodes.minutes_stated  # "12 min", or "not stated"


PLANS = {"3h": budget.THREE_HOURS, "day": budget.FULL_DAY}  # the {lab-plan} directive's :plan: option


def plan(which: budget.Plan = budget.THREE_HOURS) -> list[tuple[int, int, str]]:
    """The plan's blocks, (start, minutes, what), from the room minutes the notebooks' metadata states."""
    eps = episodes.episodes()
    return budget.plan_rows(which, {e.name: (e.teaching or 0, e.practice or 0) for e in eps},
                            label=lambda name: f"{{doc}}`{name} <{'/episodes/' + name}>`")


def plan_table(which: budget.Plan = budget.THREE_HOURS) -> str:
    hours, minutes = (int(x) for x in which.start.split(":"))

    def clock(offset: int) -> str:
        t = hours * 60 + minutes + offset
        return f"{t // 60}:{t % 60:02d}"

    rows = ["| when | minutes | what |", "|---|---|---|"]
    rows += [f"| {clock(start)} | {m} | {what} |" for start, m, what in plan(which)]
    rows.append(f"| {clock(which.minutes)} | | end |")
    return "\n".join(rows)


def _time(minutes: int | None) -> str:
    return "not stated" if minutes is None else f"~{minutes} min"


def readme_rows() -> str:
    """The README's schedule rows, one per notebook: | `name` | title | teaching | exercises | ~alone | scripts |."""
    return "\n".join(f"| `{e.name}` | {e.title} | {_room(e.teaching)} | {_room(e.practice)} | {_time(e.stated)} | "
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

def about(confdir: Path) -> dict[str, episodes.About]:
    """docs/episodes.yaml, read."""
    import yaml

    return episodes.read_about(yaml.safe_load((Path(confdir) / QUESTIONS).read_text()))


def _one(name: str) -> episodes.Episode:
    found = [e for e in episodes.episodes() if e.name.startswith(name)]
    if len(found) != 1:
        raise ValueError(f"{len(found)} notebooks match {name!r}: name one episode (01_process_group, or 01_)")
    return found[0]


def _write_episodes(app, config) -> None:
    from sphinx.util import logging

    said = about(app.confdir)
    for problem in episodes.problems(said):  # a warning fails the build (-W): every page has what it must show
        logging.getLogger(__name__).warning(problem)
    pages = episodes.write_episodes(said, Path(app.srcdir) / "episodes")
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
        option_spec: ClassVar[dict] = {"plan": lambda arg: directives.choice(arg, tuple(PLANS))}

        def run(self):
            for ep in episodes.episodes():
                self.env.note_dependency(str(ep.path))
            return self.parse_text_to_nodes(plan_table(PLANS[self.options.get("plan", "3h")]))

    class Objectives(SphinxDirective):
        option_spec: ClassVar[dict] = {"episode": directives.unchanged_required}

        def run(self):
            self.env.note_dependency(str(Path(self.env.app.confdir) / QUESTIONS))
            ep = _one(self.options["episode"])
            goals = about(self.env.app.confdir).get(ep.name, episodes.About()).objectives
            return self.parse_text_to_nodes(episodes.objectives_box(goals))

    class Board(SphinxDirective):
        option_spec: ClassVar[dict] = {"episode": directives.unchanged_required}

        def run(self):
            self.env.note_dependency(str(Path(self.env.app.confdir) / QUESTIONS))
            board = about(self.env.app.confdir).get(_one(self.options["episode"]).name, episodes.About()).board
            return self.parse_text_to_nodes(board)

    class Checkpoints(SphinxDirective):
        option_spec: ClassVar[dict] = {"episode": directives.unchanged_required}

        def run(self):
            ep = _one(self.options["episode"])
            self.env.note_dependency(str(ep.path))
            return self.parse_text_to_nodes(episodes.checkpoint_table(ep))

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
        return [nodes.Text(episodes.hours(episodes.room_minutes(eps)))], []

    def verdict(name, rawtext, text, lineno, inliner, options=None, content=None):
        return [nodes.literal(rawtext, " ".join(text.split()), classes=["verdict"])], []

    app.connect("config-inited", _write_episodes)
    app.add_directive("lab-schedule", Schedule)
    app.add_directive("step-diff", StepDiff)
    app.add_directive("lab-plan", Plan)
    app.add_directive("lab-objectives", Objectives)
    app.add_directive("lab-checkpoints", Checkpoints)
    app.add_directive("lab-board", Board)
    app.add_role("lab-time", lab_time)
    app.add_role("verdict", verdict)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
