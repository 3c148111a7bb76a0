"""Check a DDP script: run it on 2 ranks, judge what the run did, name the first mistake in one line.

    python -m workshop_lib.check runs/mine/step2_sampler.py    # a workshop step (its step from its name, or --step N)
    python -m workshop_lib.check --step 3                      # runs/mine/step3_*.py, else exercises/step3_*_todo.py
    python -m workshop_lib.check --all                         # a table: every step, done / wrong / not started
    python -m workshop_lib.check --all --dir solutions         # the same for the scripts of another folder
    python -m workshop_lib.check train.py 4 2 --batch_size 32  # any DDP script, its own arguments after it

Each script runs on two single-process "nodes" (Gloo; :mod:`runner`) as ``python script.py`` would run it, judged by
invariants over what the run recorded (:mod:`rules`, one table). A workshop step runs with 200 molecules and 2
epochs and is judged by every rule of its step: step 4 also resumes (:mod:`resume`), and ``setup`` runs as rank 3
of 4 on a node with 2 GPUs (:mod:`made_up_rank`). Any other script runs with its own arguments, in this folder, and
is judged by the rules that hold for any DDP script. A ✓ line and exit code 0 when everything measured holds, else
✗ and 1; a file that is not a Python script, one line and 2.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from workshop_lib.authoring import scripts
from workshop_lib.debug import scriptfile
from workshop_lib.engine import rules, runner
from workshop_lib.engine.common import verdict
from workshop_lib.engine.recorder import passes
from workshop_lib.errors import WorkshopError
from workshop_lib.paths import lab_root

STEPS = {1: "step1_process_group", 2: "step2_sampler", 3: "step3_ddp", 4: "step4_snapshots"}
TODO_LINE = 'raise NotImplementedError("fill in the TODO above")'
TICK, CROSS = "\N{CHECK MARK}", "\N{BALLOT X}"
EPOCHS = 2
ARGS = ["--limit", "200", "--no-tensorboard", "--timeout", "15"]
MINE = lab_root() / scripts.MINE  # the learner's versions (scripts.write_script), in the clone
EXERCISES = lab_root() / "exercises"


def step_of(path: Path, step: int | None = None) -> int | None:
    """The workshop step: ``step`` as given, else from a name stepN_*.py (after a prefix_ too); None for any other
    script."""
    if step is not None:
        if step not in STEPS:
            raise WorkshopError(f"--step {step} has no script check; use one of {sorted(STEPS)}")
        return step
    m = re.search(r"(?:^|_)step(\d)_\w*\.py$", Path(path).name)  # step2_sampler.py, mine_step2_sampler.py
    return int(m.group(1)) if m and int(m.group(1)) in STEPS else None


def default_script(step: int, folder: Path | None = None) -> Path:
    """``folder``'s script of the step; else the learner's version if write_script made one, else the exercise."""
    if folder is not None:
        return Path(folder) / f"{STEPS[step]}.py"
    mine = MINE / f"{STEPS[step]}.py"
    return mine if mine.is_file() else EXERCISES / scripts.exercise_file(STEPS[step])


def not_started(path: Path, step: int) -> bool:
    """Every TODO of the exercise still raises NotImplementedError."""
    exercise = EXERCISES / scripts.exercise_file(STEPS[step])
    todos = exercise.read_text().count(TODO_LINE) if exercise.is_file() else 0
    return todos > 0 and path.read_text().count(TODO_LINE) >= todos


def _item(path: Path, step: int | None, work: Path, name: str, argv: Sequence[str], **kw) -> runner.Item:
    """A run of a workshop step (its arguments the checker's, ``--out WORK/name``) or of any script (``argv``, in this
    folder), recorded under WORK/name.*."""
    if step is None:
        return runner.Item(path, list(argv), work / name, cwd=Path.cwd(), **kw)
    return runner.Item(path, [*ARGS, "--epochs", str(kw.pop("epochs", EPOCHS)), "--out", str(work / name)], work / name,
                       **kw)


def judge(path: Path, step: int | None, work: Path, argv: Sequence[str] = ()) -> tuple[str, str]:
    """('done' | 'wrong', one line): the script's run judged by every rule of :data:`rules.RULES` that applies to it
    (those that judge other runs start them: the data at other world sizes, step 4's resume; a workshop step's
    ``setup`` runs on a made-up GPU node). A script that is not a workshop step (``step`` None) runs with ``argv`` in
    this folder."""
    work.mkdir(parents=True)
    run = runner.run(_item(path, step, work, "out", argv))
    if not any(run.ranks.values()):
        tail = [line for line in run.output.splitlines() if line.strip()][-1:] or ["no output"]
        return "wrong", f"{path.name}: the ranks did not start ({tail[0][:200]})"
    epochs = EPOCHS if step is not None else max((len(passes(ev, "train")) for ev in run.ranks.values()), default=0)
    case = rules.Case(run, step, epochs, path.read_text(), path.name, rules.read_metrics(work / "out"),
                      again=lambda name, **item: runner.run(_item(path, step, work, name, argv, **item)),
                      out=work / "out")
    message = rules.first_mistake(case)
    if message is not None:
        return "wrong", f"{path.name}: {message}"
    line = rules.passed(case)
    if any(e.get("find_unused") for ev in run.ranks.values() for e in ev if e["kind"] == "ddp"):
        line += ("; note: find_unused_parameters=True makes DDP search the graph after every forward, and this model "
                 "uses every parameter: leave it out")
    return "done", f"{path.name}: {line}"


def check_scripts(paths: Sequence[Path], steps: Sequence[int | None] | None = None,
                  argv: Sequence[str] = ()) -> list[tuple[str, str]]:
    """('done' | 'wrong' | 'not started' | 'refused', one line) for each script; ``argv``: the arguments of a script
    that is not a workshop step."""
    with tempfile.TemporaryDirectory(prefix="ddp-check-") as tmp:
        return [_status(Path(path), step_of(Path(path), step), Path(tmp) / f"script{i}", argv)
                for i, (path, step) in enumerate(zip(paths, steps or [None] * len(paths), strict=True))]


def _status(path: Path, step: int | None, work: Path, argv: Sequence[str]) -> tuple[str, str]:
    if why := scriptfile.refused(path):  # the watch's refusal, word for word: a syntax error is the learner's to fix
        return ("wrong" if why[1] == scriptfile.SYNTAX else "refused"), why[0]
    if step is not None and not_started(path, step):
        return "not started", f"{path.name}: not started (its TODOs still raise NotImplementedError)"
    return judge(path, step, work, argv)


def check(path: str | Path, step: int | None = None) -> None:
    """For a notebook: check the step script the learner wrote (``scripts.write_script``); a ✓ line, or CheckFailed."""
    status, line = check_scripts([Path(path)], [step])[0]
    verdict(scripts.in_cells(path, line) if status != "done" else None, line)  # a script's line from cells: the cell's


def table(paths: Sequence[Path], results: Sequence[tuple[str, str]]) -> list[str]:
    """``--all``'s table: a row per step, its script, its status and, where wrong, the mistake."""
    root = lab_root()
    rows = [(f"step {step}", str(p.resolve().relative_to(root) if p.resolve().is_relative_to(root) else p), status,
             "" if status != "wrong" else line.split(": ", 1)[1])
            for step, p, (status, line) in zip(STEPS, paths, results, strict=True)]
    width = max(len(r[1]) for r in rows)
    return [f"{'step':<7} {'script':<{width}}  {'status':<11} mistake",
            *(f"{step:<7} {shown:<{width}}  {status:<11} {why}".rstrip() for step, shown, status, why in rows)]


def not_a_step(path: Path) -> str:
    """What the check of a script that is not a workshop step judges, and what it leaves to one (:func:`rules.judged`)."""
    judged, left = rules.judged(rules.Case(runner.Run({}), None))
    resume = [why for why in left if why.startswith("step 4's")]  # one phrase: a learner reads a line, not a table
    left = [why for why in left if why not in resume] + [f"step 4's snapshot and resume ({len(resume)} rules)"] * bool(
        resume)
    return (f"{path.name} is not a workshop step (no --step, its name is not stepN_*.py), judged by the rules for any "
            f"DDP script: {'; '.join(judged)}. Left to a workshop step (--step N): {'; '.join(left)}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workshop_lib.check", description=__doc__.splitlines()[0],
                                usage="%(prog)s [--step N | --all [--dir DIR]] [SCRIPT [ARGS ...]]")
    p.add_argument("script", nargs="?", type=Path, help="the script (default: runs/mine/stepN_*.py)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments, passed to it unchanged")
    p.add_argument("--step", type=int, help="the step the script is (default: from its name)")
    p.add_argument("--all", action="store_true", help="check every step's script; print a table")
    p.add_argument("--dir", type=Path, help="with --all or --step: the folder of the scripts (default: runs/mine, "
                                            "else exercises)")
    args = p.parse_args(argv)
    if args.all:
        paths = [default_script(step, args.dir) for step in STEPS]
        results = check_scripts(paths, list(STEPS))
        print("\n".join(table(paths, results)))
        return 0 if all(status == "done" for status, _ in results) else 1
    if args.script is None and args.step is None:
        raise WorkshopError("nothing to check; pass your script's path, --step N, or --all")
    path = args.script or default_script(step_of(Path("."), args.step), args.dir)
    if args.args and step_of(path, args.step) is not None:
        raise WorkshopError(f"a workshop step runs with the checker's own arguments; leave out {' '.join(args.args)}")
    if step_of(path, args.step) is None and not scriptfile.refused(path):
        print(not_a_step(path), flush=True)
    status, line = check_scripts([path], [args.step], args.args)[0]
    print(f"{TICK if status == 'done' else CROSS} {line}", flush=True)
    return {"done": 0, "refused": 2}.get(status, 1)


def _exit_with_verdict(argv: Sequence[str] | None = None) -> None:
    raise SystemExit(main(argv))  # 0 done, 1 a mistake; run_cli makes a usage error exit code 2
