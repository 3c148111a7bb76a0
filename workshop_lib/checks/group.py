"""The checks of notebook 01: the learner's ``check_all_reduce`` on 2 ranks, its prediction, and ``setup``
(:mod:`made_up_rank`'s ``process_group``)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable

import torch

from workshop_lib.debug import collectives
from workshop_lib.engine import rules
from workshop_lib.engine.common import HANG_AFTER, first, judge_prediction, run_forked, said, still_todo, verdict
from workshop_lib.engine.recorder import Recorder, _of


def _recorded(fn: Callable, device: torch.device) -> tuple[str, list[dict]]:
    """``fn(device)`` with its calls recorded: how it ended ("ok", "todo", else the learner's line, torch's words and
    the cause) and the record."""
    rec = Recorder()
    try:
        with collectives.calls(rec.keep):
            fn(device)
        return "ok", rec.events
    except NotImplementedError:
        return "todo", rec.events
    except Exception as err:  # said here, where the error is
        return said(err, fn.__name__), rec.events


def _record_all_reduce(env, fn: Callable) -> dict:
    """On one rank: ``fn(device)`` recorded (each collective with what it held before and after); then ``fn`` given
    ``meta``, a GPU's stand-in on which a collective moves nothing: where its first collective's tensor is on another
    device (NCCL, on a GPU node, takes no CPU tensor), that call, else None."""
    outcome, events = _recorded(fn, env.device)
    off = None
    if outcome != "todo":  # every rank, as in the run above: a CPU tensor's collective there is real
        with contextlib.redirect_stdout(io.StringIO()):
            first = next(iter(_of(_recorded(fn, torch.device("meta"))[1], "collective", phase="enter")), None)
        off = first if first is not None and first["device"] != "meta" else None
    return {"rank": env.rank, "outcome": outcome, "events": events, "off": off}


def all_reduce(fn: Callable, nprocs: int = 2, timeout: float = 30) -> None:
    """``fn(device)`` (the learner's check_all_reduce) on ``nprocs`` ranks, judged from each rank's record by the
    script checker's judge of check_all_reduce (:func:`~workshop_lib.engine.rules.all_reduced`): all_reduce(rank + 1)
    with SUM, 1 + ... + N; then the tensor it reduces is on ``device`` (NCCL, on a GPU node, takes no CPU tensor)."""
    ranks = run_forked(_record_all_reduce, nprocs, fn, timeout=timeout, hang_after=min(HANG_AFTER, timeout / 2),
                       fix="every rank must call dist.all_reduce")
    silent = [r["rank"] for r in ranks if not _of(r["events"], "collective", name="all_reduce")]
    wrong = rules.all_reduced({r["rank"]: r["events"] for r in ranks})
    failed = next((f"rank {r['rank']}: {r['outcome']}" for r in ranks if r["outcome"] != "ok"), None)
    off = ranks[0]["off"]
    verdict(first(
        (any(r["outcome"] == "todo" for r in ranks), still_todo(fn.__name__)),
        (len(silent) == nprocs, "no rank called dist.all_reduce: call it on a tensor holding dist.get_rank() + 1"),
        (silent, lambda: f"rank {silent[0]} never called dist.all_reduce while other ranks did: every rank must "
                         f"call every collective, or the others wait for it (and fail when it leaves)"),
        (wrong, wrong), (failed, failed),
        (off, lambda: f"{fn.__name__} (line {off['line']}) calls dist.{off['name']} on a tensor on the "
                      f"{off['device'].upper()}, not on `device`: on a GPU node setup joins with nccl, which takes GPU "
                      f"tensors only (torch raises RuntimeError: No backend type associated with device type "
                      f"{off['device']}); create the tensor on the rank's device, torch.tensor(..., device=device)")),
        f"{fn.__name__}: each of {nprocs} ranks contributed rank + 1, all_reduce(SUM) left {nprocs * (nprocs + 1) // 2} "
        f"on every rank")


def collectives_prediction(predicted: dict, results: list[dict], rank: int = 1) -> None:
    """The learner's prediction of ``rank``'s results (a list per collective) against the ranks': a tick or a cross
    per collective, never raised."""
    for name, guess in predicted.items():
        got = [round(v, 6) for v in results[rank][name].tolist()]
        flat = _numbers(guess)
        nested = flat is not None and isinstance(guess, list | tuple) and any(isinstance(v, list | tuple) for v in guess)
        why = ("read as one list, rank 0's values first: the cell returns the gathered tensors concatenated" if nested
               else "not a list of numbers" if guess is not None and flat is None else "")
        judge_prediction(name, guess, f"{got} on rank {rank}", flat is not None and [round(v, 6) for v in flat] == got,
                         why)


def _numbers(guess) -> list[float] | None:
    """A prediction as a flat list of numbers (a list of lists, one per rank, is read in rank order); None if not."""
    if guess is None:
        return None
    if isinstance(guess, int | float):
        return [float(guess)]
    if not isinstance(guess, list | tuple):
        return None
    flat: list[float] = []
    for value in guess:
        inner = _numbers(value)
        if inner is None:
            return None
        flat += inner
    return flat
