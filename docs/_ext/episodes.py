"""The lesson site's episodes: each solution notebook, as a page with its time, objectives, exercises and key points.

The site (``docs/``, built by ``python -m tools.site``) renders the solution notebooks with
their stored outputs and never runs them. Before Sphinx reads its sources, :func:`write_episodes`
writes one page per notebook of ``notebooks/`` into ``docs/episodes/`` (git-ignored): the notebook
itself, with sphinx-lesson's boxes added around what is already there::

    first cell          what follows its time (the episode's lead), then the objectives box: "After this episode
                        learners can", the measurable objectives of docs/episodes.yaml; a card: the time the notebook
                        states (alone) and a room's teaching and exercise minutes (its metadata), the exercise notebook
                        to open in JupyterLab, what it produces; the questions (docs/episodes.yaml); the timing
                        checkpoints (which section the room should have reached at which minute, from the sections'
                        stated room minutes); for instructors, each section's stated times and what to draw on the
                        board (docs/episodes.yaml)
    an exercise cell    an exercise box before it holding the cell's TODO hint; the solution cell is folded
    a debugging lab     (a ### BEGIN BROKEN block) a box saying the exercise holds the broken code; the fix is folded
    a raw cell          shown as Python (the script-only lines: module docstring, the __main__ guard)
    ## Recap            its bullets in a key-points box

Times come from the notebooks (``tools/budget.py``), so the site always agrees with them, the checkpoints included.
This module is part of the site's Sphinx extension (``docs/_ext/``, loaded by ``docs/conf.py``), outside the installed
package.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path

from tools import ROOT, budget, build
from workshop_lib.authoring import spans

CORE = ("00_", "01_", "02_", "03_")  # the core path of the 3-hour lab; the rest are optional parts
DOCS = ROOT / "docs"
EPISODES = DOCS / "episodes"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

_TITLE = re.compile(r"^# (.+)$", re.M)
_SECTION = re.compile(r"^## (.+?)\s*$", re.M)
UNTIMED = re.compile(r"\s*\((?:about )?\d+ min[^)]*\)\s*$")  # a heading's stated time, shown in a column of its own
_NAMED = re.compile(r"^\s*def (\w+)|^\s*(\w+) = ", re.M)  # what an exercise span writes: a function, or a name
# An objective is measurable when it starts with what the learner does, seen from outside (Bloom's action verbs).
ACTION_VERBS = frozenset(("build", "call", "check", "choose", "compare", "compile", "compute", "describe", "diagnose",
                          "estimate", "explain", "find", "fix", "map", "name", "predict", "read", "resume", "run",
                          "save", "shard", "start", "state", "sum", "trace", "use", "wrap", "write"))
_BULLETS = re.compile(r"(?:^[*-] .*\n(?:^(?![*-] ).+\n)*)+", re.M)  # a list: bullets and their continuation lines


@dataclass
class Episode:
    """What the site says about one notebook."""

    path: Path
    title: str  # the notebook's own title, without the number: "A process group, started by torchrun"
    stated: int | None  # minutes, as the first cell states
    sections: list[tuple[str, int | None]] = field(default_factory=list)  # each ## heading and its stated minutes
    exercises: int = 0
    step: str = ""  # notebook metadata lab.step: where it sits in the lab
    outcome: str = ""  # notebook metadata lab.outcome: what the learner has at the end
    scripts: list[str] = field(default_factory=list)  # the solutions/*.py its script: cells make
    projector: int = 0  # minutes its sections "On the projector" state: the instructor's, outside ``stated``
    teaching: int | None = None  # a room's teaching minutes, as the notebook's metadata states (tools/budget.py)
    practice: int | None = None  # a room's exercise minutes, likewise
    room: list[tuple[str, int | None, int | None]] = field(default_factory=list)  # each section's (title, both)
    tasks: list[list[str]] = field(default_factory=list)  # each section's exercises: what their spans write
    boards: list[int] = field(default_factory=list)  # each section's minutes at the board (its heading's lab.board)

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def core(self) -> bool:
        return self.name.startswith(CORE)

    @property
    def exercise_notebook(self) -> str:
        return f"exercises/{self.path.name}"


def episodes() -> list[Episode]:
    """Every notebook of ``notebooks/``, in lab order."""
    return [describe(path) for path in build.source_notebooks()]


def describe(path: Path) -> Episode:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    count = budget.count(path)
    first = nb.cells[0].source if nb.cells else ""
    title = _TITLE.search(first)
    title_text = title.group(1) if title else path.stem
    title_text = re.sub(r"^\d+\w?\s*[—-]\s*", "", title_text)
    lab = nb.metadata.get("lab", {})
    # A script's home is the notebook holding its module docstring (a raw cell); others only lend it cells.
    scripts = sorted({tag.split(":", 1)[1] for cell in nb.cells for tag in cell.metadata.get("tags", [])
                      if tag.startswith("script:") and cell.cell_type == "raw" and cell.source.startswith('"""')})
    projector = sum(p.stated or 0 for p in count.parts if budget.on_the_projector(p.title))
    return Episode(path, title_text, count.stated, [(p.title, p.stated) for p in count.parts], count.exercises,
                   lab.get("step", ""), lab.get("outcome", ""), scripts, projector, *count.stated_room,
                   [(p.title, *p.stated_room) for p in count.parts], _tasks(nb), [p.board for p in count.parts])


def _tasks(nb) -> list[list[str]]:
    """Each ``## `` section's exercises, in order: the function (or the name) each solution span writes."""
    sections: list[list[str]] = []
    for cell in nb.cells:
        if cell.cell_type == "markdown" and _SECTION.search(cell.source):
            sections.append([])
        elif cell.cell_type == "code" and sections and spans.BEGIN in cell.source:
            found = _NAMED.search(cell.source)
            sections[-1].append(next(g for g in found.groups() if g) if found else "the TODO")
    return sections


def minutes(episodes: list[Episode]) -> int:
    return sum(e.stated or 0 for e in episodes)


def room_minutes(episodes: list[Episode]) -> int:
    """A room's minutes, teaching and exercises, as the notebooks' metadata states them."""
    return sum((e.teaching or 0) + (e.practice or 0) for e in episodes)


def hours(total: int) -> str:
    """130 -> '2 h 10 min'."""
    return f"{total // 60} h {total % 60} min" if total >= 60 else f"{total} min"


# ---- the page --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Checkpoint:
    """Where a room should be at a minute of an episode: a section, from its start to its end (a room's minutes)."""

    start: int  # minutes into the episode (its teaching and exercise minutes, as the notebook's metadata states)
    end: int
    title: str  # the section's heading, without its stated time
    teaching: int
    exercises: int
    tasks: tuple[str, ...] = ()  # what the section's exercises write: their checks say ✓ by ``end``
    board: int = 0  # of the teaching minutes, those at the board (a key idea drawn)


def checkpoints(ep: Episode) -> list[Checkpoint]:
    """The episode's timing checkpoints: each section's start and end minute in a room, from the stated room minutes
    of its heading (the minutes before the first heading, the title and the set-up cell, come first). Empty when a
    section states no room minutes: then there is nothing to compute them from."""
    if any(t is None or x is None for _, t, x in ep.room) or ep.teaching is None:
        return []
    sections = sum(t + x for _, t, x in ep.room)
    minute = max(0, (ep.teaching or 0) + (ep.practice or 0) - sections)  # the title and the set-up cell
    tasks = ep.tasks or [[] for _ in ep.room]
    boards = ep.boards or [0 for _ in ep.room]
    found = []
    for (title, t, x), names, board in zip(ep.room, tasks, boards, strict=True):
        found.append(Checkpoint(minute, minute + t + x, UNTIMED.sub("", title), t, x, tuple(names), board))
        minute += t + x
    return found



def checkpoint_table(ep: Episode) -> str:
    """The checkpoints as a MyST table: minutes, the section, its minutes, the checks that say ✓ by its end."""
    rows = ["| minutes | the room works on | teaching + exercises | by the end, ✓ from the check of |",
            "|---|---|---|---|"]
    for c in checkpoints(ep):
        done = ", ".join(f"`{t}`" for t in c.tasks) or "(no exercise)"
        board = f" ({c.board} at the board)" if c.board else ""
        rows.append(f"| {c.start} to {c.end} | {c.title} | {c.teaching}{board} + {c.exercises} | {done} |")
    return "\n".join(rows)


def checkpoint_box(ep: Episode) -> str:
    """The timing checkpoints in a checklist box, for the room and the instructor alike."""
    found = checkpoints(ep)
    if not found:
        return ""
    body = (f"Where a room should be, minute by minute, at the pace of the notebook's stated room minutes "
            f"({minutes_stated(ep.teaching)} teaching, {minutes_stated(ep.practice)} exercises, {found[-1].end} min in "
            f"all, breaks and buffer not included). A room behind by more than a section: see what to drop in the "
            f"[instructor's kit](../kit/routines.md#when-the-room-runs-late).\n\n{checkpoint_table(ep)}")
    return _fence("checklist", body, "Timing checkpoints")


def objectives_box(objectives: list[str]) -> str:
    """The measurable objectives (docs/episodes.yaml) in sphinx-lesson's objectives box."""
    return _fence("objectives", "After this episode learners can:\n\n" + "\n".join(f"- {o}" for o in objectives))


def unmeasurable(objective: str) -> bool:
    """Whether an objective does not start with an action verb (a learner's act an instructor can see)."""
    first = objective.split(maxsplit=1)[0].strip("`*,.:;").lower() if objective.strip() else ""
    return first not in ACTION_VERBS


def minutes_stated(m: int | None) -> str:
    """A stated number of minutes as a page shows it: "12 min", or "not stated"."""
    return "not stated" if m is None else f"{m} min"


def _markdown(source: str, cell_id: str):
    import nbformat

    return nbformat.v4.new_markdown_cell(source, id=cell_id)


def _fence(kind: str, body: str, title: str = "") -> str:
    """A sphinx-lesson box in MyST's colon fence (the body may hold backtick fences)."""
    return f":::{{{kind}}} {title}".rstrip() + f"\n{body.strip()}\n:::\n"


def objectives(first_cell: str, outcome: str = "") -> tuple[str, str]:
    """(the first cell up to its time statement, what follows it: the episode's objectives).

    A cell that says nothing after its time gets the notebook's outcome (metadata ``lab.outcome``)."""
    found = re.search(r"\*\*Time:[^*]*\*\*", first_cell)
    cut = found.end() if found else first_cell.find("\n\n") % (len(first_cell) + 1)
    head, goals = first_cell[:cut].rstrip(), first_cell[cut:].strip()
    if not goals and outcome:
        goals = f"At the end you have {outcome}."
    return head + "\n", goals


def hints(code: str) -> list[str]:
    """Each exercise span's hint: the ``# TODO:`` comment lines above its ``### BEGIN SOLUTION``, as prose."""
    found = []
    for hint in spans.hints(code):
        words = [re.sub(r"^#\s*(TODO:?\s*)?", "", line.strip()) for line in hint]
        text = " ".join(w for w in words if w)
        found.append(text[:1].upper() + text[1:])
    return found


def exercise_box(code: str, ep: Episode) -> str:
    name = re.search(r"^\s*def (\w+)", code, re.M)
    if spans.BROKEN_BEGIN in code:  # a debugging lab: the exercise version holds the bug, with no hint
        title = f"Debugging lab: `{name.group(1)}`" if name else "Debugging lab"
        body = (f"In JupyterLab this cell of `{ep.exercise_notebook}` holds the broken code, with no hint; "
                "the cells below run it and say where the ranks wait. The fix is folded in the cell below.")
        return _fence("exercise", body, title)
    title = f"Exercise: `{name.group(1)}`" if name else "Exercise"
    todo = hints(code)
    what = todo[0] if len(todo) == 1 else "\n".join(f"* {h}" for h in todo) or "Fill in the TODO."
    body = (f"{what}\n\n"
            f"In JupyterLab this cell of `{ep.exercise_notebook}` holds the hint and `raise NotImplementedError`; "
            "write the lines, run the cell, then run the check cell below it. The solution is folded in the cell below.")
    return _fence("exercise", body, title)


def keypoints(recap: str) -> str:
    """A recap cell with its bullet list (else its first paragraph) in a key-points box; the rest stays outside."""
    heading, _, body = recap.partition("\n")
    found = _BULLETS.search(body + "\n")
    if found:
        start, end = found.start(), found.end()
    else:
        start = len(body) - len(body.lstrip())
        end = body.find("\n\n", start) % (len(body) + 1)
    if not body[start:end].strip():
        return recap
    return f"{heading}\n{body[:start]}{_fence('keypoints', body[start:end])}\n{body[end:].lstrip()}"


def _file(path: str) -> str:
    """A link to a file of the repository, from an episode page: the site carries a copy (Sphinx's download)."""
    return f"{{download}}`{path} <../../{path}>`"


def card(ep: Episode, questions: list[str]) -> str:
    """The box under the title: time, where to work, what it produces; the questions; the sections' times."""
    time = f"about {ep.stated} minutes" if ep.stated else "not stated"
    rows = [("Time", f"{time} alone (as the notebook states; {'core path' if ep.core else 'optional part'})"),
            ("In a room", f"{minutes_stated(ep.teaching)} teaching, {minutes_stated(ep.practice)} exercises"),
            ("Exercise notebook", f"open {_file(ep.exercise_notebook)} in JupyterLab"),
            ("Worked version", f"this page: {_file('notebooks/' + ep.path.name)}, with its stored outputs")]
    if ep.outcome:
        rows.append(("At the end you have", ep.outcome))
    if ep.scripts:
        rows.append(("Scripts", ", ".join(_file(f"solutions/{s}.py") for s in ep.scripts
                                          if (ROOT / "solutions" / f"{s}.py").is_file()) or "none"))
    parts = [_fence("admonition", ":class: important\n\n" + "\n".join(f"* **{k}:** {v}" for k, v in rows),
                    "This episode")]
    if questions:
        parts.append(_fence("questions", "\n".join(f"- {q}" for q in questions)))
    sections = "\n".join(f"| {title} | {'' if m is None else f'{m} min'} | {minutes_stated(t)} | {minutes_stated(x)} |"
                          for (title, m), (_, t, x) in zip(ep.sections, ep.room, strict=True))
    parts.append(_fence("instructor-note",
                        f"Each section's time alone, as its heading states, and in a room, as the notebook's metadata "
                        f"states ({ep.exercises} exercise(s); see the [instructor guide](../instructor.md) for the "
                        f"plans and what to cut):\n\n"
                        f"| section | alone | teaching | exercises |\n|---|---|---|---|\n{sections}"))
    return "\n\n".join(parts)


def board_box(board: str) -> str:
    """What to draw on the board (docs/episodes.yaml), in an instructor note: a teaching tip inside the episode."""
    return _fence("instructor-note", board, "At the board") if board.strip() else ""


def episode_notebook(ep: Episode, questions: list[str], goals: list[str] | None = None, board: str = ""):
    """The notebook as the site shows it (a copy: the source is not touched); ``goals``: the measurable objectives
    (docs/episodes.yaml), in the objectives box, the notebook's own lead above it; ``board``: what to draw."""
    import nbformat

    nb = nbformat.read(ep.path, as_version=4)
    cells = []
    for i, cell in enumerate(nb.cells):
        cell = copy.deepcopy(cell)
        cid = cell.get("id") or f"c{i}"
        if i == 0 and cell.cell_type == "markdown":
            rest, lead = objectives(cell.source, ep.outcome)
            cell.source = rest + (f"\n{lead}\n" if goals and lead else "")
            cells.append(cell)
            if goals or lead:
                box = objectives_box(goals) if goals else _fence("objectives", lead)
                cells.append(_markdown(box, f"{cid}-objectives"))
            cells.append(_markdown(card(ep, questions), f"{cid}-card"))
            if checkpoint_box(ep):
                cells.append(_markdown(checkpoint_box(ep), f"{cid}-checkpoints"))
            if board_box(board):
                cells.append(_markdown(board_box(board), f"{cid}-board"))
            continue
        if cell.cell_type == "raw":
            cells.append(_markdown(f"```python\n{cell.source}\n```", cid))
            continue
        if cell.cell_type == "markdown" and re.match(r"## Recap", cell.source):
            cell.source = keypoints(cell.source)
        if cell.cell_type == "code" and spans.PREDICTION_BEGIN in cell.source:  # the instructor's, folded
            cell.source = spans.solution_source(cell.source)
            cell.metadata["tags"] = [*cell.metadata.get("tags", []), "hide-input"]
            cell.metadata["mystnb"] = {"code_prompt_show": "Show a prediction", "code_prompt_hide": "Hide it"}
        elif cell.cell_type == "code" and spans.BEGIN in cell.source:
            cells.append(_markdown(exercise_box(cell.source, ep), f"{cid}-exercise"))
            cell.metadata["tags"] = [*cell.metadata.get("tags", []), "hide-input"]
            cell.metadata["mystnb"] = {"code_prompt_show": "Show the solution", "code_prompt_hide": "Hide the solution"}
        cells.append(cell)
    nb.cells = cells
    nb.metadata.pop("widgets", None)  # the widgets' state: the site shows their text (no widget JS, offline)
    return nb


@dataclass
class About:
    """What docs/episodes.yaml says of one episode: the questions it answers, what learners can do after it."""

    questions: list[str] = field(default_factory=list)
    objectives: list[str] = field(default_factory=list)
    board: str = ""  # what the instructor draws on the board, section by section (markdown)


def read_about(data: dict | None) -> dict[str, About]:
    """docs/episodes.yaml's entries, by notebook name: ``{name: {questions: [...], objectives: [...], board: ...}}``."""
    return {name: About(list((entry or {}).get("questions") or []), list((entry or {}).get("objectives") or []),
                        str((entry or {}).get("board") or "").strip())
            for name, entry in (data or {}).items()}


def problems(about: dict[str, About], eps: list[Episode] | None = None) -> list[str]:
    """What an episode page would lack, one line each: its questions, its measurable objectives, what to draw on the
    board, its checkpoints."""
    found = []
    for ep in episodes() if eps is None else eps:
        entry = about.get(ep.name, About())
        if not entry.questions:
            found.append(f"docs/episodes.yaml has no questions for {ep.name}: add them")
        if not entry.objectives:
            found.append(f"docs/episodes.yaml has no objectives for {ep.name}: add what learners can do after it")
        for goal in entry.objectives:
            if not isinstance(goal, str):  # YAML read "text: more" as a mapping
                found.append(f"docs/episodes.yaml: {ep.name}'s objective {goal!r} is not text: put it in quotes")
            elif unmeasurable(goal):
                found.append(f"docs/episodes.yaml: {ep.name}'s objective {goal!r} does not start with an action verb "
                             f"({', '.join(sorted(ACTION_VERBS)[:6])}, ...): say what the learner does")
        if not entry.board:
            found.append(f"docs/episodes.yaml has no board notes for {ep.name}: say what the instructor draws")
        if not checkpoints(ep):
            found.append(f"{ep.name} has no timing checkpoints: a section states no room minutes (python -m "
                         f"tools.build --times --restate writes them)")
    return found


def write_episodes(about: dict[str, About], dest: Path = EPISODES) -> list[Path]:
    """Write every episode page into ``dest``; remove the pages of notebooks that are gone. Unchanged files are
    not rewritten (Sphinx then skips them)."""
    import nbformat

    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for ep in episodes():
        entry = about.get(ep.name, About())
        text = nbformat.writes(episode_notebook(ep, entry.questions, entry.objectives, entry.board))
        target = dest / ep.path.name
        if not target.is_file() or target.read_text() != text:
            target.write_text(text)
        written.append(target)
    for old in dest.glob("*.ipynb"):
        if old not in written:
            old.unlink()
    return written
