"""The lesson site's episodes: each solution notebook, as a page with its time, objectives, exercises and key points.

The site (``docs/``, built by ``python -m tools.site``) renders the solution notebooks with
their stored outputs and never runs them. Before Sphinx reads its sources, :func:`write_episodes`
writes one page per notebook of ``notebooks/`` into ``docs/episodes/`` (git-ignored): the notebook
itself, with sphinx-lesson's boxes added around what is already there::

    first cell          what follows its time in an objectives box (what the learner will do), then a card: the time the
                        notebook states (alone) and a room's teaching and exercise minutes (its metadata), the exercise
                        notebook to open in JupyterLab, what it produces; the questions (docs/episodes.yaml) and, for
                        instructors, each section's stated times
    an exercise cell    an exercise box before it holding the cell's TODO hint; the solution cell is folded
    a debugging lab     (a ### BEGIN BROKEN block) a box saying the exercise holds the broken code; the fix is folded
    a raw cell          shown as Python (the script-only lines: module docstring, the __main__ guard)
    ## Recap            its bullets in a key-points box

Times come from the notebooks (``tools/budget.py``), so the site always agrees with them. This module is part of
the site's Sphinx extension (``docs/_ext/``, loaded by ``docs/conf.py``), outside the installed package.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path

from tools import ROOT, budget, build
from workshop_lib.lab import spans

CORE = ("00_", "01_", "02_", "03_")  # the core path of the 3-hour lab; the rest are optional parts
DOCS = ROOT / "docs"
EPISODES = DOCS / "episodes"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"

_TITLE = re.compile(r"^# (.+)$", re.M)
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
                   [(p.title, *p.stated_room) for p in count.parts])


def minutes(episodes: list[Episode]) -> int:
    return sum(e.stated or 0 for e in episodes)


def room_minutes(episodes: list[Episode]) -> int:
    """A room's minutes, teaching and exercises, as the notebooks' metadata states them."""
    return sum((e.teaching or 0) + (e.practice or 0) for e in episodes)


def hours(total: int) -> str:
    """130 -> '2 h 10 min'."""
    return f"{total // 60} h {total % 60} min" if total >= 60 else f"{total} min"


# ---- the page --------------------------------------------------------------------------------------------------

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


def episode_notebook(ep: Episode, questions: list[str]):
    """The notebook as the site shows it (a copy: the source is not touched)."""
    import nbformat

    nb = nbformat.read(ep.path, as_version=4)
    cells = []
    for i, cell in enumerate(nb.cells):
        cell = copy.deepcopy(cell)
        cid = cell.get("id") or f"c{i}"
        if i == 0 and cell.cell_type == "markdown":
            rest, goals = objectives(cell.source, ep.outcome)
            cell.source = rest
            cells.append(cell)
            if goals:
                cells.append(_markdown(_fence("objectives", goals), f"{cid}-objectives"))
            cells.append(_markdown(card(ep, questions), f"{cid}-card"))
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


def write_episodes(questions: dict[str, list[str]], dest: Path = EPISODES) -> list[Path]:
    """Write every episode page into ``dest``; remove the pages of notebooks that are gone. Unchanged files are
    not rewritten (Sphinx then skips them)."""
    import nbformat

    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for ep in episodes():
        text = nbformat.writes(episode_notebook(ep, questions.get(ep.name, [])))
        target = dest / ep.path.name
        if not target.is_file() or target.read_text() != text:
            target.write_text(text)
        written.append(target)
    for old in dest.glob("*.ipynb"):
        if old not in written:
            old.unlink()
    return written
