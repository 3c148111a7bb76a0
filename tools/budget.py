"""How long a notebook takes a newcomer: the count every stated time comes from.

A newcomer reads technical prose at about 150 words a minute and code at about
15 lines a minute, and spends about 8 minutes on an exercise: its hint, the one
entry of the torch docs the hint names, writing, running the check, one retry.
A room also spends a minute on each figure a cell draws (reading it, and the
questions it raises), and a minute on each shell command a learner types (a
``!torchrun ...`` line, as at a terminal, or a command a markdown cell gives to type in
one: typing it, reading what it prints).
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
* commands: the shell lines of the code cells (``!...``), as the learner types them, and the terminal steps a
  markdown cell gives to type (a line of a ``bash`` block, fenced or indented, that starts a command: ``torchrun``,
  ``python``, ``kill``, ...), at the same rate.

A section headed ``## N. On the projector: ...`` is the instructor's: a demonstration the room watches once
(a comparison of several jobs, say) while nobody types. It states and counts its minutes as any section, but
they are the instructor's talk time, not the learners': the notebook's own count and stated time leave them out,
and the instructor guide's plan carries them.

A notebook is cut into sections at its ``## `` headings; what comes before the
first one (the title, the set-up cell) belongs to the notebook only. A section
states its time at the end of its heading, ``## 2. Backends (4 min)``; the
notebook states its total in its first cell, ``**Time: about 25 minutes.**``.

**A room's pace.** That count is one newcomer alone (a learner doing 00 as pre-work, say). A room of 20 moves at
its slower quarter, and the schedule an instructor keeps is written as lessons publish theirs (The Carpentries'
"teaching" and "exercises" minutes per episode), from the same count at :data:`ROOM`'s pace::

    teaching  = 1.5 x (the count without its exercises)      the room follows the prose, the code and the runs
              + 1.0 x (a section on the projector's count)   nobody types: the instructor's own pace
              + the section's minutes at the board            a key idea drawn, as its heading cell's metadata states
    exercises = 1.0 x 8 min per exercise                     the count's 8 minutes hold one retry; helpers unblock

The pace is calibrated on what rooms took for 00 to 03 as they stood at commit 7d280d4 (00 12-15 min, 01 60-70,
02 40-45, 03 40-45: tests/integration/test_times.py holds it there). The stated room minutes live in the notebooks'
metadata, the one source the README, the site and the instructor's plans read: ``metadata.lab.teaching`` and
``metadata.lab.exercises`` for the notebook, and the same keys (and ``board``) in each ``## `` heading cell's
``metadata.lab`` for its section. :data:`PLANS` are the two sessions an instructor can run, filled from them: a
plan is a sequence of blocks, notebooks (or parts of one, between two sections) and fixed blocks, some of them rests
(a break, lunch); what the session leaves over is buffer. A room keeps a plan that leaves :data:`MIN_BUFFER` minutes
of buffer and never works more than :data:`MAX_STRETCH` minutes without a rest, its buffer's share included
(:func:`plan_faults`).

    python -m tools.build --times            # the table: stated against counted, per notebook and section; the plans
    python -m tools.build --times --restate  # write the counted room minutes into the notebooks' metadata
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from tools import ROOT
from workshop_lib.authoring.spans import BEGIN, exercise_source

WORDS_PER_MIN, LINES_PER_MIN, MIN_PER_EXERCISE, MIN_PER_FIGURE, MIN_PER_COMMAND = 150, 15, 8, 1, 1
_READING = re.compile(r"Read \((\d+) min\)")
_SECTION = re.compile(r"^## (?P<title>.+?)\s*$", re.M)
_PROJECTOR = re.compile(r"^(?:\d+\. )?On the projector\b")
_STATED_SECTION = re.compile(r"\((?:about )?(\d+) min\)\s*$")
_STATED_NOTEBOOK = re.compile(r"\*\*Time: about (\d+) min(?:utes)?\b")
# A markdown cell's code block: fenced (no language, or a shell's) or indented by 4 spaces.
_FENCED = re.compile(r"^```(?P<lang>\w*)[ \t]*\n(?P<body>.*?)^```", re.M | re.S)
_SHELLS = ("", "bash", "sh", "shell", "console")
_INDENTED = re.compile(r"(?:^|\n\n)(?P<body>(?: {4}.*(?:\n|$))+)")
# A line of such a block that a learner types at a terminal: a command, after a prompt and variables it sets.
_TYPED = re.compile(r"^\s*(?:\$\s+)?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:torchrun|python3?|pip|ps|kill|srun|sbatch|salloc|"
                    r"bash|jupyter|nvidia-smi|py-spy)\b")


@dataclass(frozen=True)
class Pace:
    """How much longer than one newcomer's count a room takes: a factor per kind of minute."""

    reading: float  # the prose, the code, the runs, the figures and the commands of a section the room works through
    projector: float  # a section on the projector: the room watches, nobody types
    exercise: float  # the count's 8 minutes an exercise


# A room's pace: the one place it is stated (calibrated on 00 to 03 at 7d280d4; tests/integration/test_times.py).
ROOM = Pace(reading=1.5, projector=1.0, exercise=1.0)


@dataclass
class Count:
    """One section (or a whole notebook): what a newcomer reads, writes and waits for, and a room's minutes."""

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
    teaching: float = 0.0  # a room's teaching minutes (ROOM's pace, the board included)
    practice: float = 0.0  # a room's exercise minutes (ROOM's pace)
    board: int = 0  # minutes at the board the section's heading cell states (metadata lab.board)
    stated_room: tuple[int | None, int | None] = (None, None)  # (teaching, exercises), as the metadata states

    @property
    def minutes(self) -> float:
        return (self.words / WORDS_PER_MIN + self.code_lines / LINES_PER_MIN
                + MIN_PER_EXERCISE * self.exercises + self.reading + self.run_s / 60
                + MIN_PER_FIGURE * self.figures + MIN_PER_COMMAND * self.commands)

    def add(self, other: Count, newcomer: bool = True) -> None:
        """Add ``other``'s room minutes, and (``newcomer``) what it holds to the newcomer's count."""
        self.teaching += other.teaching
        self.practice += other.practice
        if not newcomer:
            return
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
        return _off(self.title, "", self.stated, self.minutes, at_least=1)

    def room_off(self) -> list[str]:
        """Why the metadata's teaching or exercise minutes disagree with a room's count (as :meth:`off` judges)."""
        wrong = []
        for what, stated, counted, least in (("teaching", self.stated_room[0], self.teaching, 1),
                                             ("exercises", self.stated_room[1], self.practice, 0)):
            if stated is None:
                wrong.append(f"{self.title!r} states no {what} minutes (metadata lab.{what}); the count says "
                             f"{counted:.0f} min")
            else:
                wrong.append(_off(self.title, f" of {what}", stated, counted, least))
        return [w for w in wrong if w]


def _off(title: str, what: str, stated: int, counted: float, at_least: int) -> str | None:
    if stated == max(at_least, round(counted)):  # a section states at least a minute of teaching
        return None
    if abs(stated - counted) > counted / 3 + 0.5:
        return f"{title!r} states {stated} min{what}; the count says {counted:.0f} min"
    return None


def on_the_projector(title: str) -> bool:
    """Whether a section (its heading's title) is the instructor's demonstration, outside the learners' count."""
    return bool(_PROJECTOR.match(title))


def stated_minutes(first_cell: str) -> int | None:
    """The notebook's stated time, from its first cell's ``**Time: about N minutes.**``; None if it states none."""
    found = _STATED_NOTEBOOK.search(first_cell)
    return int(found.group(1)) if found else None


def stated_room(metadata) -> tuple[int | None, int | None]:
    """(teaching, exercises) minutes a room takes, as a notebook's or a heading cell's ``metadata.lab`` states."""
    lab = metadata.get("lab", {})
    return lab.get("teaching"), lab.get("exercises")


def _run_seconds(cell) -> float:
    timing = cell.get("metadata", {}).get("execution", {})
    try:
        start, end = timing["iopub.execute_input"], timing["shell.execute_reply"]
    except KeyError:
        return 0.0
    return max(0.0, (_when(end) - _when(start)).total_seconds())


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def cell_count(cell, pace: float = ROOM.reading) -> Count:
    """What one cell adds: raw cells (the script-only lines) are not shown to the learner as such.

    Its room minutes at ``pace`` (the factor of the section it is in) for everything but its exercises."""
    source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
    c = Count("")
    if cell.cell_type in ("markdown", "code"):
        c.reading = sum(int(m) for m in _READING.findall(source))
    if cell.cell_type == "markdown":
        c.words = len(source.split())
        c.commands = terminal_steps(source)
    elif cell.cell_type == "code":
        c.code_lines = sum(1 for line in exercise_source(source).splitlines() if line.strip())
        c.exercises = sum(1 for line in source.splitlines() if line.strip() == BEGIN)
        c.run_s = _run_seconds(cell)
        c.figures = sum(1 for out in cell.get("outputs", []) if "image/png" in out.get("data", {}))
        c.commands = sum(1 for line in source.splitlines() if line.lstrip().startswith("!"))
    c.teaching, c.practice = room_minutes(c, pace)
    return c


def terminal_steps(markdown: str) -> int:
    """The commands a markdown cell gives the learner to type at a terminal: the lines of its shell blocks (fenced, or
    indented by 4 spaces) that start a command."""
    fenced = [m.group("body") for m in _FENCED.finditer(markdown) if m.group("lang") in _SHELLS]
    rest = _FENCED.sub("", markdown)
    blocks = fenced + [m.group("body") for m in _INDENTED.finditer(rest)]
    return sum(1 for block in blocks for line in block.splitlines() if _TYPED.match(line))


def room_minutes(c: Count, pace: float = ROOM.reading) -> tuple[float, float]:
    """(teaching, exercises): a room's minutes for what ``c`` counts, its non-exercise minutes at ``pace``."""
    return pace * (c.minutes - MIN_PER_EXERCISE * c.exercises), ROOM.exercise * MIN_PER_EXERCISE * c.exercises


def _headings(nb):
    """(cell, title) of each ``## `` heading cell of ``nb``, in order."""
    for cell in nb.cells:
        heading = _SECTION.search(cell.source) if cell.cell_type == "markdown" else None
        if heading:
            yield cell, heading.group("title")


def count(path: Path) -> Count:
    """The notebook's count, with one part per ``## `` section."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0].source if nb.cells else ""
    total = Count(Path(path).stem, stated_minutes(first), stated_room=stated_room(nb.metadata))
    section: Count | None = None
    titles = {id(cell): title for cell, title in _headings(nb)}
    for cell in nb.cells:
        title = titles.get(id(cell))
        if title is not None:
            minutes = _STATED_SECTION.search(title)
            board = int(cell.metadata.get("lab", {}).get("board", 0))
            section = Count(title, int(minutes.group(1)) if minutes else None, teaching=board, board=board,
                            stated_room=stated_room(cell.metadata))
            total.parts.append(section)
            total.teaching += board
        shown = section is not None and on_the_projector(section.title)
        c = cell_count(cell, ROOM.projector if shown else ROOM.reading)
        total.add(c, newcomer=not shown)
        if section is not None:
            section.add(c)
    total.projector = sum(p.minutes for p in total.parts if on_the_projector(p.title))
    return total


def restate(path: Path) -> bool:
    """Write the counted room minutes into the notebook's metadata (and its heading cells'); whether it changed."""
    import nbformat

    c = count(path)
    nb = nbformat.read(path, as_version=4)
    headings = [cell for cell, _ in _headings(nb)]
    changed = False
    for meta, part in [(nb.metadata, c), *((cell.metadata, p) for cell, p in zip(headings, c.parts, strict=True))]:
        lab = meta.setdefault("lab", {})
        room = {"teaching": max(1 if part is not c else 0, round(part.teaching)), "exercises": round(part.practice)}
        if {k: lab.get(k) for k in room} != room:
            lab.update(room)
            changed = True
    if changed:
        nbformat.write(nb, path)
    return changed


# ---- the plans: the sessions an instructor can run, filled from the stated room minutes ---------------------------

REST = ("break", "lunch")  # a fixed block whose text starts with one of these is a rest: the room stops working
MAX_STRETCH = 60  # minutes a room works, at most, between two rests (the session's start and end count as rests)
MIN_BUFFER = 20  # minutes a plan keeps over, at least: a room runs late
_OPEN = 10**6  # the last section of a part that runs to the notebook's end
_PART = re.compile(r"^(?P<prefix>\S+?)(?: §(?P<first>\d+)-(?P<last>\d*))?$")


@dataclass(frozen=True)
class Plan:
    """A session: the notebooks taught in it, in order, with the fixed blocks between them; what is left is buffer.

    A block is a notebook's name prefix ("01_"), a part of one by its sections' numbers ("04a_ §1-4", "04a_ §5-": to
    the end; the first part holds what comes before §1, the last the recap), or (minutes, what) of a fixed block: a
    rest when ``what`` starts with "break" or "lunch" (:data:`REST`), else welcome, wrap-up and the like."""

    name: str
    minutes: int  # the session's length
    blocks: tuple[str | tuple[int, str], ...]
    before: tuple[str, ...] = ()  # the notebooks done before the session (pre-work)
    start: str = "0:00"  # the clock time the session starts at
    # (a notebook's prefix, a section: its number "5.", or words of its title "the speed-up") the session leaves out
    cut: tuple[tuple[str, str], ...] = ()

    def notebooks(self) -> list[str]:
        """The notebooks' prefixes, in order, each once (a notebook taught in parts is one notebook)."""
        prefixes = [_PART.match(b).group("prefix") for b in self.blocks if isinstance(b, str)]
        return list(dict.fromkeys(prefixes))

    def cuts(self, name: str | None = None) -> list[str]:
        """The sections the plan leaves out (of notebook ``name`` alone, if given): ["01 §6", "03 §5"]."""
        return [f"{n.rstrip('_')} §{number}" for n, numbers in _cut_numbers(self).items()
                for number in numbers if name is None or name.startswith(n)]


def is_rest(block: str | tuple[int, str]) -> bool:
    return not isinstance(block, str) and block[1].lower().startswith(REST)


def _sections(name: str) -> list[tuple[int | None, tuple[int, int]]]:
    """(number, (teaching, exercises)) of each ``## `` section of notebooks/``name``, as its heading cell states;
    None for a section without a number (the recap)."""
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    out = []
    for cell, title in _headings(nb):
        number = re.match(r"(\d+)\.", title)
        out.append((int(number.group(1)) if number else None, tuple(m or 0 for m in stated_room(cell.metadata))))
    return out


def _section_number(name: str, which: str) -> int | None:
    """The number of notebooks/``name``'s section ``which``: its number ("5."), or words of its title; None if none."""
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    for _, title in _headings(nb):
        number = re.match(r"(\d+)\.", title)
        if number and (f"{number.group(1)}." == which or (not re.fullmatch(r"\d+\.", which) and which in title)):
            return int(number.group(1))
    return None


def _cut_numbers(plan: Plan) -> dict[str, list[int]]:
    """{notebook prefix: the numbers of the sections ``plan`` cuts}; a ValueError names a cut notebooks/ lacks."""
    names = {p.name[:-len(".ipynb")] for p in (ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")}
    out: dict[str, list[int]] = {}
    for prefix, which in plan.cut:
        name = next((n for n in sorted(names) if n.startswith(prefix)), None)
        number = _section_number(name, which) if name else None
        if number is None:
            raise ValueError(f"the {plan.name} cuts section {which} of {prefix}, which notebooks/ does not hold")
        out.setdefault(prefix, []).append(number)
    return out


@dataclass
class _Block:
    """One block of a laid-out plan: a notebook (or a part of one) with its room minutes, or a fixed block."""

    what: str
    minutes: int  # teaching + exercises of a notebook's block; the fixed block's minutes
    name: str | None = None  # the notebook's name, for a notebook's block
    sections: str = ""  # " §1-4", " from §5", for a part
    room: tuple[int, int] = (0, 0)
    rest: bool = False
    span: tuple[int, int] = (0, 0)  # the first and last section numbers of a notebook's block (_OPEN: to the end)


def _layout(plan: Plan, room: dict[str, tuple[int, int]]) -> tuple[list[_Block], int]:
    """The plan's blocks, each notebook's (or part's) taught minutes (``room`` less the sections the plan cuts), and
    the buffer the session leaves over (negative: they do not fit)."""
    names = {p: next((n for n in room if n.startswith(p)), None) for p in plan.notebooks()}
    missing = [p for p, n in names.items() if n is None]
    if missing:
        raise ValueError(f"the {plan.name} names notebooks {missing} that are not in notebooks/")
    cut = {next(n for n in room if n.startswith(prefix)): set(numbers) for prefix, numbers in _cut_numbers(plan).items()}
    blocks: list[_Block] = []
    for block in plan.blocks:
        if not isinstance(block, str):
            blocks.append(_Block(block[1], block[0], rest=is_rest(block)))
            continue
        part = _PART.match(block)
        name = names[part.group("prefix")]
        if part.group("first"):
            first, last = int(part.group("first")), int(part.group("last") or _OPEN)
            sections = (f" §{first}" if str(first) == part.group("last") else f" §{first}-{part.group('last')}"
                        if part.group("last") else f" from §{first}")
        else:
            first, last, sections = 0, _OPEN, ""
        blocks.append(_Block("", 0, name, sections, span=(first, last)))  # its minutes: below
    for name in dict.fromkeys(b.name for b in blocks if b.name):
        parts = [b for b in blocks if b.name == name]
        left_out = cut.get(name, set())
        numbered = _sections(name) if left_out or len(parts) > 1 else []
        dropped = [r for n, r in numbered if n in left_out]
        sums = [tuple(room[name][i] - sum(r[i] for r in dropped) for i in (0, 1))]  # the notebook, less its cuts
        for b in parts[1:]:
            first, last = b.span
            held = [r for n, r in numbered if n not in left_out and
                    (first <= n <= last if n is not None else last == _OPEN)]
            sums.append(tuple(sum(r[i] for r in held) for i in (0, 1)))
        # the first part holds the rest: what comes before its first section, and the rounding of the sections' sums
        sums[0] = tuple(sums[0][i] - sum(s[i] for s in sums[1:]) for i in (0, 1))
        for b, s in zip(parts, sums, strict=True):
            b.room, b.minutes = s, sum(s)
    return blocks, plan.minutes - sum(b.minutes for b in blocks)


THREE_HOURS = Plan("3-hour session", 180, (
    (8, "welcome (the pre-work's lines came in the week before); the problem: one process, one device; on the "
        "projector, 01 §1's two figures from its stored outputs (what torchrun starts; RANK and LOCAL_RANK on two "
        "machines) and §2 in two sentences (NCCL on GPUs, Gloo here)"),
    "01_", (10, "break"), "02_", (5, "break"), "03_",
    (5, "`python -m workshop_lib.check --all` around the room; what 03's speed-up measured (its stored table); what the "
         "optional parts hold")),
    before=("00_",),
    # 01 §1-2 shown in the welcome, 01 §5 (step 1 run again, with torchrun: the checker ran it) and the projector's
    # two demonstrations: the full day keeps them
    cut=(("01_", "1."), ("01_", "2."), ("01_", "5."), ("01_", "6."), ("03_", "the speed-up")))
FULL_DAY = Plan("full day", 510, (
    (10, "welcome; every self-test line says `DDP-WORKSHOP READY` (fix the rest now); the problem: one process, one "
         "device"),
    "00_", "01_ §1-3", (10, "break"), "01_ §4-", "02_ §1-2", (10, "break"), "02_ §3-", "03_ §1-2", (45, "lunch"),
    "03_ §3-", (10, "break"), "04a_ §1-3", (10, "break"), "04a_ §4-4", (10, "break"), "04a_ §5-", "05_ §1-2",
    (10, "break"), "05_ §3-",
    (5, "`python -m workshop_lib.check --all` around the room; the day's recap; what 04b, 04c and 06 hold")),
    start="9:00", cut=(("05_", "5."), ("05_", "6.")))  # 05's fourth and fifth labs: homework, after three in the room
PLANS = (THREE_HOURS, FULL_DAY)


def plan_rows(plan: Plan, room: dict[str, tuple[int, int]], label=str) -> list[tuple[int, int, str]]:
    """(start, minutes, what) of each block of ``plan``; ``room``: each notebook's (teaching, exercises) minutes.

    A notebook's block is its teaching and exercise minutes and its share of the buffer (what the session leaves
    over, shared in proportion to the blocks' minutes); the block's ``what`` names the notebook (as ``label``
    writes its name: the site's, a link), the part of it and the sections left out, and says so."""
    blocks, buffer = _layout(plan, room)
    taught = [b for b in blocks if b.name]
    if buffer < 0:
        raise ValueError(f"the {plan.name}'s notebooks ({sum(b.minutes for b in taught)} min) do not fit its "
                         f"{plan.minutes} minutes")
    shares = _shares(blocks, buffer)
    rows, start, i = [], 0, 0
    for b in blocks:
        if b.name:
            first, last = b.span
            cut = [c.split()[-1] for c in plan.cuts(b.name) if first <= int(c.split("§")[-1]) <= last]
            left = f" (without {', '.join(cut)})" if cut else ""
            what = (f"{label(b.name)}{b.sections}{left}: {b.room[0]} min teaching, {b.room[1]} min exercises, "
                    f"{shares[i]} min of buffer")
            rows.append((start, b.minutes + shares[i], what))
            i += 1
        else:
            rows.append((start, b.minutes, b.what))
        start += rows[-1][1]
    return rows


def _shares(blocks: list[_Block], buffer: int) -> list[int]:
    """The buffer's share of each notebook's block: in proportion to the blocks' minutes, then moved out of a stretch
    that would run over :data:`MAX_STRETCH` minutes without a rest into the first stretches that have room (a room
    late by its whole buffer still gets its break within the hour, where the plan allows it)."""
    taught = [i for i, b in enumerate(blocks) if b.name]
    lab = sum(blocks[i].minutes for i in taught)
    share = {i: buffer * blocks[i].minutes // max(lab, 1) for i in taught}
    if taught:
        share[taught[-1]] += buffer - sum(share.values())
    stretches, current = [], []
    for i, b in enumerate(blocks):
        if b.rest:
            stretches.append(current)
            current = []
        else:
            current.append(i)
    stretches.append(current)

    def length(stretch: list[int]) -> int:
        return sum(blocks[i].minutes + share.get(i, 0) for i in stretch)

    pool = 0
    for stretch in stretches:
        for i in reversed([i for i in stretch if i in share]):
            take = min(share[i], max(0, length(stretch) - MAX_STRETCH))
            share[i] -= take
            pool += take
    for stretch in stretches:
        room_left = [i for i in stretch if i in share]
        if room_left and pool:
            give = min(pool, max(0, MAX_STRETCH - length(stretch)))
            share[room_left[-1]] += give
            pool -= give
    if taught:
        share[taught[-1]] += pool  # nowhere within the hour: the plan's faults say so
    return [share[i] for i in taught]


def plan_sums(plan: Plan, room: dict[str, tuple[int, int]]) -> tuple[int, int, int]:
    """(teaching, exercises, buffer) minutes of ``plan``: its notebooks' sums, and what the session leaves over."""
    blocks, buffer = _layout(plan, room)
    return sum(b.room[0] for b in blocks if b.name), sum(b.room[1] for b in blocks if b.name), buffer


def stretches(plan: Plan, room: dict[str, tuple[int, int]]) -> list[tuple[int, int]]:
    """(start, minutes) of each stretch the room works between two rests, the buffer's shares included."""
    blocks, _ = _layout(plan, room)
    out, start, length = [], 0, 0
    for (at, minutes, _), b in zip(plan_rows(plan, room), blocks, strict=True):
        if b.rest:
            out.append((start, length))
            start, length = at + minutes, 0
        else:
            length += minutes
    return [*out, (start, length)]


def plan_faults(plan: Plan, room: dict[str, tuple[int, int]]) -> list[str]:
    """Why a room cannot keep ``plan``: a stretch over :data:`MAX_STRETCH` minutes without a rest, less than
    :data:`MIN_BUFFER` minutes of buffer; [] when it can."""
    faults = []
    buffer = plan_sums(plan, room)[2]
    if buffer < MIN_BUFFER:
        faults.append(f"the {plan.name} keeps {buffer} min of buffer, fewer than {MIN_BUFFER}: cut a section")
    for start, minutes in stretches(plan, room):
        if minutes > MAX_STRETCH:
            faults.append(f"the {plan.name} works {minutes} min from {clock(plan, start)} without a break, more "
                          f"than {MAX_STRETCH}: put a break in (a notebook splits at a section: \"04a_ §1-3\")")
    return faults


def clock(plan: Plan, offset: int) -> str:
    """The clock time ``offset`` minutes into ``plan``: "10:45"."""
    hours, minutes = (int(x) for x in plan.start.split(":"))
    t = hours * 60 + minutes + offset
    return f"{t // 60}:{t % 60:02d}"


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


def _stated(value: int | None) -> str:
    return "-" if value is None else str(value)


def room_table(counts: list[Count]) -> str:
    """A room's schedule: teaching and exercise minutes per notebook and section, stated against counted."""
    rows = [f"A room's pace (tools/budget.py ROOM): teaching {ROOM.reading} x the count, {ROOM.projector} x on the "
            f"projector, + the board; exercises {ROOM.exercise} x {MIN_PER_EXERCISE} min each",
            f"{'':54} {'teaching':>8} {'count':>6} {'board':>5} {'exercises':>9} {'count':>6}"]
    for nb in counts:
        for c, indent in [(nb, "")] + [(p, "  ") for p in nb.parts]:
            rows.append(f"{(indent + c.title)[:54]:54} {_stated(c.stated_room[0]):>8} {c.teaching:6.1f} "
                        f"{c.board or '':>5} {_stated(c.stated_room[1]):>9} {c.practice:6.1f}")
    return "\n".join(rows)


def stated_rooms(counts: list[Count]) -> dict[str, tuple[int, int]]:
    """Each notebook's (teaching, exercises) minutes as its metadata states them: what the plans are filled from."""
    return {c.title: (c.stated_room[0] or 0, c.stated_room[1] or 0) for c in counts}


def strict(counts: list[Count]) -> float:
    """The floor of a room's minutes: words/150 + code lines/15 + 8 min per exercise + 1 min per figure, summed."""
    return sum(c.words / WORDS_PER_MIN + c.code_lines / LINES_PER_MIN + MIN_PER_EXERCISE * c.exercises
               + MIN_PER_FIGURE * c.figures for c in counts)


def plans_table(counts: list[Count]) -> str:
    """Each plan's sums (from the stated room minutes), its blocks by the clock, its breaks and the buffer it keeps."""
    room = stated_rooms(counts)
    rows = []
    for plan in PLANS:
        teaching, exercises, buffer = plan_sums(plan, room)
        before = f"; {', '.join(p.rstrip('_') for p in plan.before)} before it, as pre-work" if plan.before else ""
        before += f"; without {', '.join(plan.cuts())}" if plan.cut else ""
        rows.append(f"{plan.name} ({plan.minutes} min: {', '.join(p.rstrip('_') for p in plan.notebooks())}{before}): "
                    f"{teaching} min teaching + {exercises} min exercises + "
                    f"{plan.minutes - teaching - exercises - buffer} min of welcome, breaks and wrap-up; "
                    f"{buffer} min of buffer")
        rows += [f"  {clock(plan, at):>5}  {m:3d} min  {what}" for at, m, what in plan_rows(plan, room)]
        rows.append(f"  {clock(plan, plan.minutes):>5}           end")
        longest = max(m for _, m in stretches(plan, room))
        faults = plan_faults(plan, room)
        rows.append(f"  longest stretch without a break: {longest} min (at most {MAX_STRETCH}); buffer {buffer} min "
                    f"(at least {MIN_BUFFER}): " + ("; ".join(faults) if faults else "a room can keep it"))
        taught = [c for c in counts if any(c.title.startswith(p) for p in plan.notebooks())]
        rows.append(f"  strict count of {', '.join(p.rstrip('_') for p in plan.notebooks())} (words/150 + code "
                    f"lines/15 + 8 min per exercise + 1 min per figure, the learners' sections): "
                    f"{strict(taught):.1f} min; with the runs and the terminal steps: "
                    f"{sum(c.minutes for c in taught):.1f} min")
        rows.append("")
    return "\n".join(rows).rstrip()
