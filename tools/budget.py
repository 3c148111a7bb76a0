"""How long a notebook takes a newcomer: the count every stated time comes from.

A newcomer reads technical prose at about 150 words a minute and code at about
15 lines a minute, and spends about 8 minutes on an exercise: its hint, the one
entry of the torch docs the hint names, writing, running the check, one retry.
A room also spends a minute on each figure a cell draws (reading it, and the
questions it raises), and a minute on each shell command a learner types (a
``!torchrun ...`` line, as at a terminal: typing it, reading what it prints).
Longer reading that a hint or a cell sends the learner to says its own minutes,
``Read (N min):``, and they count on top. The cells' own run time, measured when
the notebook was last executed, comes on top too::

    minutes = (words / 150 + code lines / 15 + 8 * exercises + reading minutes + run seconds / 60
               + 1 * figures + 1 * commands)

* words: the words of the markdown cells;
* code lines: the non-blank lines of the code cells as the learner gets them (the exercise version: a span's hint
  and its ``raise NotImplementedError``, not the solution they write), comments included (a learner reads them);
* exercises: the solution spans (``### BEGIN SOLUTION``), one per thing the learner writes;
* reading: every ``Read (N min)`` in a markdown cell or a code cell's comments;
* run time: each code cell's ``metadata.execution`` (nbclient records it), from input to reply;
* figures: the images among the code cells' stored outputs;
* commands: the shell lines of the code cells (``!...``), as the learner types them.

A section headed ``## N. On the projector: ...`` is the instructor's: a demonstration the room watches once
(a comparison of several jobs, say) while nobody types. It states and counts its minutes as any section, but
they are the instructor's talk time, not the learners': the notebook's own count and stated time leave them out,
and the instructor guide's plan carries them.

A notebook is cut into sections at its ``## `` headings; what comes before the
first one (the title, the set-up cell) belongs to the notebook only. A section
states its time at the end of its heading, ``## 2. Backends (4 min)``; the
notebook states its total in its first cell, ``**Time: about 25 minutes.**``.

    python -m tools.build --times     # the table: stated against counted, per notebook and section
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from workshop_lib.lab.spans import BEGIN, exercise_source

WORDS_PER_MIN, LINES_PER_MIN, MIN_PER_EXERCISE, MIN_PER_FIGURE, MIN_PER_COMMAND = 150, 15, 8, 1, 1
_READING = re.compile(r"Read \((\d+) min\)")
_SECTION = re.compile(r"^## (?P<title>.+?)\s*$", re.M)
_PROJECTOR = re.compile(r"^(?:\d+\. )?On the projector\b")
_STATED_SECTION = re.compile(r"\((?:about )?(\d+) min\)\s*$")
_STATED_NOTEBOOK = re.compile(r"\*\*Time: about (\d+) min(?:utes)?\b")


@dataclass
class Count:
    """One section (or a whole notebook): what a newcomer reads, writes and waits for."""

    title: str
    stated: int | None = None  # minutes, as the heading or the first cell says
    words: int = 0
    code_lines: int = 0
    exercises: int = 0
    reading: int = 0  # minutes of reading the notebook sends the learner to ("Read (N min):")
    run_s: float = 0.0
    figures: int = 0  # images drawn by the cells (their stored outputs)
    commands: int = 0  # shell lines the learner types (``!torchrun ...``)
    parts: list[Count] = field(default_factory=list)
    projector: float = 0.0  # minutes of the notebook's sections on the projector (the instructor's, not counted above)

    @property
    def minutes(self) -> float:
        return (self.words / WORDS_PER_MIN + self.code_lines / LINES_PER_MIN
                + MIN_PER_EXERCISE * self.exercises + self.reading + self.run_s / 60
                + MIN_PER_FIGURE * self.figures + MIN_PER_COMMAND * self.commands)

    def add(self, other: Count) -> None:
        self.words += other.words
        self.code_lines += other.code_lines
        self.exercises += other.exercises
        self.reading += other.reading
        self.run_s += other.run_s
        self.figures += other.figures
        self.commands += other.commands

    def off(self) -> str | None:
        """Why the stated time disagrees with the count (by more than a third, after rounding; 1 min at least), or None."""
        if self.stated is None:
            return f"{self.title!r} states no time; the count says {self.minutes:.0f} min"
        if self.stated == max(1, round(self.minutes)):  # a section states at least a minute
            return None
        if abs(self.stated - self.minutes) > self.minutes / 3 + 0.5:
            return f"{self.title!r} states {self.stated} min; the count says {self.minutes:.0f} min"
        return None


def on_the_projector(title: str) -> bool:
    """Whether a section (its heading's title) is the instructor's demonstration, outside the learners' count."""
    return bool(_PROJECTOR.match(title))


def stated_minutes(first_cell: str) -> int | None:
    """The notebook's stated time, from its first cell's ``**Time: about N minutes.**``; None if it states none."""
    found = _STATED_NOTEBOOK.search(first_cell)
    return int(found.group(1)) if found else None


def _run_seconds(cell) -> float:
    timing = cell.get("metadata", {}).get("execution", {})
    try:
        start, end = timing["iopub.execute_input"], timing["shell.execute_reply"]
    except KeyError:
        return 0.0
    return max(0.0, (_when(end) - _when(start)).total_seconds())


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def cell_count(cell) -> Count:
    """What one cell adds: raw cells (the script-only lines) are not shown to the learner as such."""
    source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
    c = Count("")
    if cell.cell_type in ("markdown", "code"):
        c.reading = sum(int(m) for m in _READING.findall(source))
    if cell.cell_type == "markdown":
        c.words = len(source.split())
    elif cell.cell_type == "code":
        c.code_lines = sum(1 for line in exercise_source(source).splitlines() if line.strip())
        c.exercises = sum(1 for line in source.splitlines() if line.strip() == BEGIN)
        c.run_s = _run_seconds(cell)
        c.figures = sum(1 for out in cell.get("outputs", []) if "image/png" in out.get("data", {}))
        c.commands = sum(1 for line in source.splitlines() if line.lstrip().startswith("!"))
    return c


def count(path: Path) -> Count:
    """The notebook's count, with one part per ``## `` section."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0].source if nb.cells else ""
    total = Count(Path(path).stem, stated_minutes(first))
    section: Count | None = None
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            heading = _SECTION.search(cell.source)
            if heading:
                title = heading.group("title")
                minutes = _STATED_SECTION.search(title)
                section = Count(title, int(minutes.group(1)) if minutes else None)
                total.parts.append(section)
        c = cell_count(cell)
        if section is None or not on_the_projector(section.title):
            total.add(c)
        if section is not None:
            section.add(c)
    total.projector = sum(p.minutes for p in total.parts if on_the_projector(p.title))
    return total


def table(counts: list[Count]) -> str:
    """The stated times against the counted ones, one row per notebook and section."""
    rows = [f"{'':54} {'stated':>6} {'count':>6} {'words':>6} {'code':>5} {'ex':>3} {'read':>4} {'run s':>6} "
            f"{'fig':>3} {'cmd':>3}"]
    for nb in counts:
        for c, indent in [(nb, "")] + [(p, "  ") for p in nb.parts]:
            stated = "-" if c.stated is None else str(c.stated)
            rows.append(f"{(indent + c.title)[:54]:54} {stated:>6} {c.minutes:6.1f} {c.words:6d} "
                        f"{c.code_lines:5d} {c.exercises:3d} {c.reading:4d} {c.run_s:6.0f} {c.figures:3d} {c.commands:3d}")
        if nb.projector:
            rows.append(f"  (the sections on the projector, the instructor's and not in {nb.title}'s count: "
                        f"{nb.projector:.1f} min)")
    return "\n".join(rows)
