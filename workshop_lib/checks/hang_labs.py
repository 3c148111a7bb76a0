"""The hang lab of notebooks/05_when_it_hangs.ipynb: the broken runs, the learner's reading of them, the fixes.

Each lab is a small step 3 (the cells tagged ``script:hangN_...``) whose ``train()`` cell holds one classic
bug: as it is in the exercise notebook, in a BROKEN block above the fix in the solution notebook
(:mod:`workshop_lib.lab.build`). The lab's cells, as the learner last ran them, run in a fresh namespace
(under the names ``shared-cell`` and ``train-cell``, so that line numbers are the cells' own) and
``train()`` runs on two forked ranks, with the hang watch installed by the fork launcher
(:func:`workshop_lib.lab.forklaunch.notebook_launch`'s ``hang_after``): the lab's code holds no line of it.
In a terminal the same scripts run as ``torchrun --nproc_per_node=2 -m workshop_lib.watch exercises/hangN_....py``.

* :func:`run_broken` runs the cells' exercise form and prints what the watch says (or each rank's error);
* :func:`check_prediction` and :func:`check_reading` compare the learner's answer (the line of ``train()``
  where each rank waits, and why) with the watch's saved record of that run;
* :func:`check_fix` runs the learner's fix and passes when it trains correctly: every rank ran the same
  number of optimizer steps, and the replicas' weights are equal at the end (measured here, not by the lab).
"""

from __future__ import annotations

import linecache
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib.checks.common import CheckFailed, _missed, _passed
from workshop_lib.config import TrainConfig
from workshop_lib.debug import hangreport
from workshop_lib.errors import WorkshopError, first_sentence
from workshop_lib.lab import build, sequences
from workshop_lib.paths import REPO_ROOT

NOTEBOOK = "05_when_it_hangs.ipynb"
# Seconds a collective may wait before the watch explains it: a broken run's steps take milliseconds, and a wait
# that turns out not to be a deadlock is run again with a longer threshold; a fix's run must not be cut short.
HANG_AFTER, FIX_HANG_AFTER = 1.5, 8.0
TIMEOUT = 60.0  # seconds before a lab run is stopped whatever happens (and its process group's timeout)
# Each lab's batch size: 16 makes 6 and 5 batches of lab 2's uneven shards (81 and 80 molecules); BatchNorm needs
# no batch of 1 (lab 4: shards of 161).
BATCH = {"hang1_rank0_only": 32, "hang2_uneven": 16, "hang3_shapes": 32, "hang4_batchnorm_eval": 48,
         "hang5_unused": 32}
TRAIN_CELL, SHARED_CELL = "train-cell", "shared-cell"  # the names the lab's cells run under
WHY = {
    "skipped": "one rank calls a collective that the other rank skips",
    "batches": "one rank has a batch more: its backward() all-reduces gradients that the other rank never sends",
    "shapes": "the ranks call the same collective with tensors of different shapes",
}


@dataclass
class Run:
    """How one lab run ended: finished (each rank's measures), hung (the watch's record), or failed (errors)."""

    name: str
    results: list[dict] | None = None  # per rank: {"steps", "spread", "wrapper"} when every rank finished
    record: list[dict] = field(default_factory=list)  # the hang watch's saved blocks, when the ranks hung
    errors: dict[int, str] = field(default_factory=dict)  # rank -> the error that ended it
    timed_out: bool = False


def _lab(name: str) -> str:
    if name not in BATCH:
        raise WorkshopError(f"no hang lab named {name!r}; pick one of {', '.join(BATCH)}")
    return name


def _cells(name: str, notebook: str | Path) -> list[tuple[str, str]]:
    """(name to run it under, source as last run, else as saved) of each code cell of lab ``name``."""
    import nbformat

    path = Path(notebook) if Path(notebook).is_file() else build.NOTEBOOKS / NOTEBOOK
    cells = [c for c in nbformat.read(path, as_version=4).cells
             if c.cell_type == "code" and name in build.script_names(c)]
    if not cells:
        raise WorkshopError(f"{path.name} has no code cell tagged {build.SCRIPT_TAG}{name}")
    return [(TRAIN_CELL if "def train(" in c.source else SHARED_CELL, build._ran.get(c.get("id"), c.source))
            for c in cells]


def load(name: str, broken: bool, notebook: str | Path = NOTEBOOK, edit: Callable[[str], str] | None = None) -> dict:
    """Lab ``name``'s cells run into a fresh namespace: their exercise form (``broken``, the bug) or solution form.

    ``edit`` changes the train() cell's text first (tests use it to try a learner's fix).
    """
    namespace: dict = {"__name__": f"lab_{name}"}
    for label, source in _cells(_lab(name), notebook):
        text = build.exercise_source(source, label) if broken else build.solution_source(source, label)
        text = edit(text) if edit and label == TRAIN_CELL else text
        linecache.cache[label] = (len(text), None, text.splitlines(keepends=True), label)  # the watch shows lines
        exec(compile(text, label, "exec"), namespace)
    if not callable(namespace.get("train")):
        raise WorkshopError(f"lab {name}'s cells define no train(); run its cell as it was given")
    return namespace


def _rank(env, train: Callable, cfg: TrainConfig) -> dict:
    """In each forked rank: the lab's train(), then what the check measures itself (optimizer steps, replicas)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook

    steps, params, wrapper = 0, [], []

    def count(optimizer, args, kwargs):
        nonlocal steps
        steps += 1
        params[:] = [p for group in optimizer.param_groups for p in group["params"]]

    os.chdir(REPO_ROOT)  # file names in the watch's report relative to the repository, as in a terminal
    evaluate = train.__globals__.get("evaluate")
    if callable(evaluate):  # this rank's copy of the lab's namespace: which model does evaluate() get?
        def spy(model, *args, **kwargs):
            wrapper.append(isinstance(model, DistributedDataParallel))
            return evaluate(model, *args, **kwargs)
        train.__globals__["evaluate"] = spy
    hook = register_optimizer_step_post_hook(count)
    try:
        train(cfg, env.rank, env.world_size, env.device)
    finally:
        hook.remove()
    mine = torch.nn.utils.parameters_to_vector(params).detach() if params else torch.zeros(0)  # (P,)
    sizes: list = [None] * env.world_size
    dist.all_gather_object(sizes, mine.numel())
    spread = None
    if len(set(sizes)) == 1 and sizes[0]:
        everyone = [torch.empty_like(mine) for _ in range(env.world_size)]
        dist.all_gather(everyone, mine)
        spread = max((w - everyone[0]).abs().max().item() for w in everyone)
    return {"steps": steps, "spread": spread, "wrapper": any(wrapper)}


def deadlocked(record: list[dict]) -> bool:
    """Does the watch's record show a deadlock: every rank in a call, and not all in the same one?

    Otherwise a rank was only slow to come (a busy machine): the wait would have ended.
    """
    now = [a.get("current") for a in sequences.answers(record).values()]
    calls = {(c["op"], c["seq"], c["tensors"]) for c in now if c}
    return all(now) and len(calls) > 1


def _launch(name: str, broken: bool, notebook: str | Path = NOTEBOOK, edit: Callable[[str], str] | None = None) -> Run:
    import torch._dynamo  # noqa: F401 (DDP imports it on first use: once here, not in every forked rank)

    from workshop_lib.lab.forklaunch import HangError, LaunchTimeout, notebook_launch
    from workshop_lib.lab.launch import LaunchError

    train = load(name, broken, notebook, edit)["train"]
    cfg = TrainConfig(limit=447, epochs=1, batch_size=BATCH[name], timeout=TIMEOUT, tensorboard=False)
    for hang_after in (HANG_AFTER, 2 * HANG_AFTER, 4 * HANG_AFTER) if broken else (FIX_HANG_AFTER,):
        try:
            return Run(name, results=notebook_launch(_rank, 2, train, cfg, timeout=TIMEOUT, hang_after=hang_after))
        except HangError as err:
            run = Run(name, record=hangreport.load(err.record))
            if not broken or deadlocked(run.record):
                return run
        except LaunchTimeout:
            return Run(name, timed_out=True)
        except LaunchError as err:
            return Run(name, errors=_errors(str(err)))
    return run


def _errors(message: str) -> dict[int, str]:
    """{rank: its error, first sentence} from notebook_launch's failure lines ('rank 0 raised X: ... (File ...)')."""
    found = {}
    for line in message.splitlines():
        if line.startswith("rank ") and " raised " in line:
            rank, error = line[5:].split(" raised ", 1)
            found[int(rank)] = first_sentence(error.split(" (File ")[0], 200)
        elif line.startswith("rank ") and " failed with " in line:
            found[int(line.split()[1])] = line.split(" failed with ", 1)[1]
    return found


def run_broken(name: str, notebook: str | Path = NOTEBOOK) -> Run:
    """Run lab ``name``'s train() as its cell gives it on 2 forked ranks; print what the watch (or each error) says."""
    run = _launch(_lab(name), broken=True, notebook=notebook)
    if run.record:
        print("the job hangs; the ranks were stopped once the hang watch had printed:")
        print("\n".join(f"  {line}" for line in run.record[0]["block"]))
    elif run.errors:
        by_error = {e: [r for r, x in sorted(run.errors.items()) if x == e] for e in run.errors.values()}
        print("the job failed:\n" + "\n".join(f"  {e} (rank {', '.join(map(str, rs))})" for e, rs in by_error.items()))
    elif run.timed_out:
        print(f"the job did not end within {TIMEOUT:g} s, and the hang watch said nothing")
    else:
        print("the job ran to the end: this train() has no bug (did you fix it already?)")
    return run


# ----------------------------------------------------------------------- the learner's reading of the diagnosis


def waiting_lines(run: Run) -> dict[int, tuple[int, str]]:
    """{rank: (line, code)}: the line of the train() cell where each rank waits, from the watch's record."""
    found = {}
    for rank, answer in sequences.answers(run.record).items():
        mine = [f for f in answer["frames"] if f[0] == TRAIN_CELL]
        if mine:
            found[rank] = (mine[-1][1], mine[-1][3].split("  # ")[0])
    return found


def why(run: Run) -> str:
    """The key of :data:`WHY` that the record shows: the collective each rank is in, compared."""
    now = [a.get("current") or {} for a in sequences.answers(run.record).values()]
    ops = {c.get("op") for c in now}
    if len(ops) == 1 and len({c.get("seq") for c in now}) == 1 and len({c.get("tensors") for c in now}) > 1:
        return "shapes"
    return "batches" if "backward" in ops and len(ops) > 1 else "skipped"


def _matches(given: object, line: int, code: str) -> bool:
    """A line number of the train() cell, or a piece of that line's code (4 characters at least)."""
    if isinstance(given, int) and not isinstance(given, bool):
        return given == line
    return isinstance(given, str) and len(given.strip()) >= 4 and given.strip() in code


def _compare(run: Run, waits: dict[int, object], reason: str) -> list[tuple[bool, str]]:
    """(right, what to say) for each rank's line and for the reason."""
    if not run.record:
        raise CheckFailed("this run did not hang, so there is no diagnosis to compare with: run the broken cell first")
    said = []
    for rank, (line, code) in sorted(waiting_lines(run).items()):
        given = waits.get(rank)
        if _matches(given, line, code):
            said.append((True, f"rank {rank} waits at line {line} of train(): {code}"))
        elif given is None:
            said.append((False, f"rank {rank} waits too, at line {line} of train(): {code} (a rank that skips a "
                                f"collective runs on to its next one, and waits there)"))
        else:
            said.append((False, f"rank {rank} waits at line {line} of train() ({code}), not at {given!r}"))
    truth = why(run)
    if reason == truth:
        said.append((True, f"{truth!r}: {WHY[truth]}"))
    else:
        said.append((False, f"why: the record shows {truth!r} ({WHY[truth]}), not {reason!r}"))
    return said


def check_prediction(run: Run, waits: dict[int, object], reason: str) -> None:
    """Your prediction (made before the run) against the watch's record: what was right, what was not."""
    for right, text in _compare(run, waits, reason):
        (_passed if right else _missed)(text)


def check_reading(run: Run, waits: dict[int, object], reason: str) -> None:
    """Your reading of the diagnosis (the line where each rank waits, and why) against the watch's record."""
    said = _compare(run, waits, reason)
    wrong = next((text for right, text in said if not right), None)
    if wrong:
        raise CheckFailed(f"{wrong}: read the diagnosis again ('where each rank is', and the collective each is in)")
    for _, text in said:
        _passed(text)


# --------------------------------------------------------------------------------------------- the fix


def verdict(run: Run) -> tuple[bool, str]:
    """(trains correctly, the one line that says so or names what is wrong) for a run of a fix."""
    if run.record:
        return False, f"it still hangs: {run.record[0]['line']}"
    if run.timed_out:
        return False, f"it did not end within {TIMEOUT:g} s: a rank waits for one that never comes"
    if run.errors:
        rank, error = min(run.errors.items())
        return False, f"it still fails: rank {rank} raised {error}"
    steps = [r["steps"] for r in run.results or []]
    spreads = [r["spread"] for r in run.results or []]
    each = ", ".join(f"rank {r}: {s}" for r, s in enumerate(steps))
    if len(set(steps)) > 1:
        return False, (f"it ends, but the ranks ran different numbers of optimizer steps ({each}): the replicas "
                       f"stepped apart; every rank must train on the same number of batches")
    if not steps or steps[0] == 0:
        return False, "it ends, but no rank ran an optimizer step: train() must train"
    if spreads[0] is None:
        return False, "it ends, but the ranks' models do not even have the same number of weights"
    if spreads[0] > 0:
        return False, (f"it ends, but the replicas differ by {spreads[0]:.3g} after training: the ranks' gradients "
                       f"were not averaged in every step (each rank trained its own model)")
    if any(r["wrapper"] for r in run.results):
        return False, ("it trains, but evaluate() still gets the DDP wrapper, whose forward may start a collective "
                       "on the one rank that evaluates: evaluate the model inside it")
    return True, f"both ranks ran {steps[0]} optimizer steps, and their replicas are equal (spread 0): it trains correctly"


def check_fix(name: str, notebook: str | Path = NOTEBOOK, edit: Callable[[str], str] | None = None) -> None:
    """Run your train() of lab ``name`` (its cells as you ran them) on 2 ranks; ✓ when it trains correctly."""
    ok, said = verdict(_launch(_lab(name), broken=False, notebook=notebook, edit=edit))
    if not ok:
        raise CheckFailed(said)
    _passed(said)
