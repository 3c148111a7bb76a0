"""The rows of gradient accumulation and of gradients all-reduced by hand, on records made by hand and on real runs.

The same judges serve 04a's and 04b's cell checks (tests/unit/checks/test_patterns.py and test_by_hand.py run them
on the learner's function in forked ranks) and the script checker: a script that accumulates gradients without
no_sync is right, its weights are those of no_sync's, so the table says it in a note after the ✓, with its lines;
handles of gradient all-reduces still pending at the step are a ✗ in any script.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tests.conftest import REPO
from workshop_lib.engine import rules, script
from workshop_lib.engine.rules import Case
from workshop_lib.engine.runner import Run

BACKWARD, STEP, HOOK = 12, 14, 7  # the lines of the learner's code the hand-made records name


def ev(kind: str, where: int | None = None, **data) -> dict:
    return {"kind": kind, "line": where, "t": 0.0, **data}


def accumulating(reduced_in: set[int], steps: int = 2, accum: int = 4, hooked: bool = True,
                 ddp: bool = True) -> list[dict]:
    """One rank's record of ``steps`` optimizer steps of ``accum`` backward() calls each; DDP's all-reduce in the
    backward() calls numbered ``reduced_in``: recorded where ``hooked`` (a notebook's comm hook), else known from the
    forwards that synced (a script's record: ``ddp_syncs``, each step's forwards outside no_sync)."""
    events, n = [ev("comm_hook", None, hook="allreduce_hook")] if hooked else [ev("ddp", 3)] if ddp else [], 0
    for step in range(steps):
        syncs = len({n + i for i in range(1, accum + 1)} & reduced_in)
        for _ in range(accum):
            n += 1
            events.append(ev("backward", BACKWARD, phase="enter", n=n))
            if hooked and n in reduced_in:
                events.append(ev("collective", BACKWARD, name="all_reduce", phase="enter", seq=n, async_op=True,
                                 backward=n))
            events.append(ev("backward", None, phase="exit", ok=True))
        events.append(ev("step", STEP, n=step, backwards=accum, losses=[], ddp_forwards=accum if ddp else 0,
                         ddp_syncs=syncs if ddp else 0))
    return events


def case(events: list[dict], spread: float = 0.0, source: str = "", step: int | None = None) -> Case:
    params = {r: [np.array([r * spread], dtype=np.float32)] for r in range(2)}
    return Case(Run({0: events, 1: events}, params), step, source=source)


def test_one_allreduce_per_step_passes_and_one_per_backward_is_named_with_its_lines():
    assert rules.accumulation(case(accumulating({4, 8}))) is None
    assert rules.accumulation(case(accumulating(set(range(1, 9))))) == (
        f"the gradients were all-reduced in all 8 backward() calls (line {BACKWARD}), 4 per optimizer step (line {STEP}): "
        "DDP all-reduces in every backward() whose forward ran outside no_sync(), where one per step suffices (the same "
        "weights, to rounding); run the forward and backward of all but the last micro-batch of each step inside `with "
        "model.no_sync():` (the forward too)")
    assert rules.accumulation(case(accumulating({3, 4, 7, 8}))) == (
        "DDP all-reduced the gradients in 4 backward() calls for 2 optimizer steps: exactly one backward per step, the "
        "last before optimizer.step(), must run outside model.no_sync()")


def test_replicas_that_drift_under_no_sync_are_named_by_the_all_reduces_they_missed():
    assert rules.accumulation(case(accumulating(set()), spread=0.3)).startswith(
        "the replicas drifted apart with 0 all-reduces: the last micro-batch of each step must run its forward and "
        "backward outside model.no_sync()")
    assert rules.accumulation(case(accumulating({1, 5}), spread=0.3)).startswith(
        "the replicas drifted apart: a step used gradients that were not all-reduced")


def test_a_script_that_accumulates_without_no_sync_gets_a_note_not_a_cross():
    row = next(r for r in rules.RULES if r.holds.startswith("gradient accumulation"))
    script_case = case(accumulating(set(range(1, 9)), hooked=False))  # every forward synced: no no_sync
    assert row.judge(script_case) is None and row.applies(script_case)
    assert row.claim(script_case).startswith(f"note: the gradients were all-reduced in all 8 backward() calls (line "
                                             f"{BACKWARD}), 4 per optimizer step (line {STEP})")
    assert row.claim(case(accumulating({4, 8}, hooked=False))) is None  # no_sync around all but the last
    assert row.claim(case(accumulating(set(range(1, 9)), accum=1, steps=8, hooked=False))) is None  # no accumulation
    assert row.claim(case(accumulating(set(), hooked=False, ddp=False))) is None  # no DDP: no note


def by_hand(async_op: bool = True, waited: bool = True, ddp: bool = False) -> list[dict]:
    """One rank's record of 2 steps, each a backward() whose 3 gradient hooks all-reduce their gradient."""
    events, seq = [ev("ddp", 3)] if ddp else [], 0
    for step in range(2):
        events.append(ev("backward", BACKWARD, phase="enter", n=step + 1))
        for _ in range(3):
            seq += 1
            events += [ev("collective", HOOK, name="all_reduce", phase="enter", seq=seq, async_op=async_op,
                          backward=step + 1), ev("collective", None, name="all_reduce", phase="exit", seq=seq)]
        events.append(ev("backward", None, phase="exit", ok=True))
        events += [ev("wait", BACKWARD + 1, name="all_reduce", seq=s, ok=True) for s in range(seq - 2, seq + 1)
                   if waited and async_op]
        events.append(ev("step", STEP, n=step, backwards=1, ddp_forwards=0, losses=[]))
    return events


def test_gradients_all_reduced_by_hand_are_started_async_and_waited_before_the_step():
    assert rules.blocked(case(by_hand())) is None and rules.unwaited(case(by_hand())) is None
    assert rules.unwaited(case(by_hand(waited=False))) == (
        f"6 all-reduces were still unwaited at optimizer.step() (line {STEP}): the step may read a gradient before its "
        f"all-reduce (line {HOOK}) ends; wait() on every handle after backward(), then clear them")
    assert rules.blocked(case(by_hand(async_op=False))) == (
        f"6 all-reduces blocked backward: dist.all_reduce (line {HOOK}) waited for every rank before backward went on "
        "(async_op=False); start them with async_op=True, keep the handles, and wait for them after backward()")
    assert rules.unwaited(case(by_hand(waited=False, ddp=True))) is None  # DDP's own, through a comm hook
    row = next(r for r in rules.RULES if r.judge is rules.unwaited)
    assert row.applies(case(by_hand(), step=None)) and row.applies(case(by_hand(), step=3))  # any script: a ✗
    blocking = next(r for r in rules.RULES if r.holds.startswith("gradients all-reduced by hand start"))
    assert blocking.claim(case(by_hand(async_op=False))).startswith("note: 6 all-reduces blocked backward")


# ----------------------------------------------------------------------------- a script written elsewhere, accumulating

ELSEWHERE = REPO / "tests" / "workers" / "elsewhere"
ONE_BATCH = """        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
"""
TWO_MICRO_BATCHES = """        for k, (part, goal) in enumerate(zip(source.chunk(2), targets.chunk(2))):  # 2 micro-batches
            with {}:
                loss = F.mse_loss(self.model(part), goal) / 2
                loss.backward()
"""


def _accumulating_script(folder, sync_off: str):
    folder.mkdir()
    shutil.copy(ELSEWHERE / "datautils.py", folder)
    text = (ELSEWHERE / "train.py").read_text()
    assert text.count(ONE_BATCH) == 1, "train.py's _run_batch changed: update the edit"
    path = folder / "accumulate.py"
    path.write_text(text.replace("import os\n", "import contextlib\nimport os\n", 1).replace(
        ONE_BATCH, TWO_MICRO_BATCHES.format(sync_off)))
    lines = path.read_text().splitlines()
    return path, *(next(i for i, code in enumerate(lines, 1) if code.strip() == s)
                   for s in ("loss.backward()", "self.optimizer.step()"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_script_accumulating_without_no_sync_passes_with_a_note_naming_its_lines(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plain, backward, step = _accumulating_script(tmp_path / "plain", "contextlib.nullcontext()")
    synced, *_ = _accumulating_script(tmp_path / "synced",
                                      "self.model.no_sync() if k == 0 else contextlib.nullcontext()")
    for path, note in ((plain, True), (synced, False)):
        [(status, line)] = script.check_scripts([path], argv=["2", "1", "--snapshot_path", str(path.parent / "snap.pt")])
        assert status == "done", line
        assert line.startswith("accumulate.py: 2 ranks, 2 epoch(s): each read its own 256 of 512 training items"), line
        assert ("; note: the gradients were all-reduced in all 32 backward() calls (line "
                f"{backward}), 2 per optimizer step (line {step}): DDP all-reduces in every backward() whose forward "
                "ran outside no_sync(), where one per step suffices (the same weights, to rounding); run the forward "
                "and backward of all but the last micro-batch of each step inside `with model.no_sync():` (the forward "
                "too)" in line) is note, line


# ----------------------------------------------------------------------------- a script written elsewhere, by hand

WRAP = "        self.model = DDP(self.model, device_ids=[self.local_rank] if torch.cuda.is_available() else None)\n"
HOOKS = """        self.handles = []  # each gradient all-reduced by hand as backward() makes it, in place of DDP
        for p in self.model.parameters():
            p.register_post_accumulate_grad_hook(lambda p: self.handles.append(dist.all_reduce(p.grad, async_op=True)))
"""


def _by_hand_script(folder, waited: bool):
    folder.mkdir()
    shutil.copy(ELSEWHERE / "datautils.py", folder)
    text = (ELSEWHERE / "train.py").read_text()
    assert text.count(WRAP) == text.count(ONE_BATCH) == 1, "train.py changed: update the edit"
    wait = "        for handle in self.handles:\n            handle.wait()\n" if waited else ""
    path = folder / "by_hand.py"
    path.write_text(text.replace(WRAP, HOOKS).replace(ONE_BATCH, ONE_BATCH + wait + "        self.handles.clear()\n")
                    .replace("self.model.module.state_dict()", "self.model.state_dict()"))
    lines = path.read_text().splitlines()
    return path, *(next(i for i, code in enumerate(lines, 1) if s in code)
                   for s in ("self.optimizer.step()", "dist.all_reduce(p.grad"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_script_all_reducing_by_hand_is_named_by_its_unwaited_handles_not_by_a_missing_ddp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for waited in (False, True):
        path, step, hook = _by_hand_script(tmp_path / f"waited{waited}", waited)
        [(status, line)] = script.check_scripts([path], argv=["2", "1", "--snapshot_path", str(path.parent / "s.pt")])
        if waited:
            assert status == "done" and line.startswith("by_hand.py: 2 ranks, 2 epoch(s)"), line
        else:
            assert status != "done" and line.endswith(
                f"all-reduces were still unwaited at optimizer.step() (line {step}): the step may read a gradient "
                f"before its all-reduce (line {hook}) ends; wait() on every handle after backward(), then clear them"), line
