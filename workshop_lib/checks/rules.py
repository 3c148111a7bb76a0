"""From what every rank did to one line: first how the run ended (:data:`ENDINGS`), then the step's rules.

No rule after the endings is asked about a run where a rank raised, left early, waited or was stopped, so no ✓
comes from such a run. Each names the rank, where (file:line), and what the others waited in."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workshop_lib import metrics as core_metrics
from workshop_lib.checks import source, torch_errors
from workshop_lib.checks.recorder import _and, _at, _of, call_name, end, how, steps, waiting_in
from workshop_lib.checks.runner import Run


@dataclass
class Case:
    """One run to judge: the records, the step, the script's text, and rank 0's metrics.json if it wrote one."""

    run: Run
    step: int
    epochs: int = 2
    source: str = ""
    name: str = "script.py"
    metrics: dict | None = None
    out: Path | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ranks(self) -> dict[int, list[dict]]:
        return self.run.ranks

    def code(self, line: int | None) -> str:
        lines = self.source.splitlines()
        return lines[line - 1].strip() if line and 0 < line <= len(lines) else ""


def read_metrics(out: Path) -> dict | None:
    """What rank 0 wrote to OUT/metrics.json (the core's reader); None if nothing readable."""
    try:
        return core_metrics.read_metrics(out)
    except (OSError, ValueError):
        return None


def _shorten(text: str, case: Case) -> str:
    """The hang watch's line with the script's path as its name."""
    return re.sub(r"\S*/" + re.escape(case.name), case.name, text)


def open_todo(case: Case) -> str | None:
    for events in case.ranks.values():
        e = end(events)
        if e and e.get("error") == "NotImplementedError":
            return f"a TODO is still open{_at(e, 'at')}: fill it in (its line raises NotImplementedError)"
    return None


def stopped_on_input(case: Case) -> str | None:
    for rank, events in sorted(case.ranks.items()):
        e = end(events)
        if how(events) == "exit":
            return f"rank {rank} stopped with exit code {e['code']}{_at(e, 'at')}: {e['message']}"
    return None


def joining(case: Case) -> str | None:
    """How each rank joined: at all, before using the group, as its own rank, with a backend for its device."""
    for rank, events in sorted(case.ranks.items()):
        inits, e = _of(events, "init", phase="enter"), end(events) or {}
        message = e.get("message") or ""
        if not inits and "not been initialized" in message:
            if "DistributedSampler" in case.code(e.get("at")):
                return (f"the DistributedSampler{_at(e, 'at')} was built before the process group existed (torch: "
                        f"Default process group has not been initialized): build it after init_process_group")
            return (f"rank {rank} used the process group before joining it (torch: Default process group has not "
                    f"been initialized){_at(e, 'at')}: call dist.init_process_group first (in setup)")
        if not inits and e.get("how") == "ok":
            return (f"rank {rank} never called dist.init_process_group: the processes never formed a group; join it "
                    f"in setup, before training")
        if inits and inits[0]["backend"] not in ("gloo", "None") and how(events) == "error":
            return (f"rank {rank} joined with backend {inits[0]['backend']}{_at(inits[0])} on a machine without GPUs: "
                    f"use gloo for CPU tensors (nccl needs GPUs)")
    given = {r: _of(ev, "init", phase="enter")[0].get("given_rank") for r, ev in case.ranks.items()
             if _of(ev, "init", phase="enter")}
    same: dict = {}
    for rank, value in sorted(given.items()):
        if value is not None:
            same.setdefault(value, []).append(rank)
    for value, who in same.items():
        if len(who) > 1:
            call = _of(case.ranks[who[0]], "init", phase="enter")[0]
            return (f"ranks {_and(who)} all joined as rank {value} (init_process_group{_at(call)} got rank={value}, "
                    f"the local rank): leave rank= out under torchrun (env:// reads RANK), or pass the global rank")
    return None


def _barrier_cause(case: Case, rank: int, e: dict) -> str | None:
    """A file this rank loaded (and failed on: not there yet, or half written) that another rank saved in this run."""
    loads = _of(case.ranks[rank], "load")
    loaded = loads[-1].get("path") if loads else None
    for saver, events in sorted(case.ranks.items()):
        for save in _of(events, "save"):
            path = save.get("path") or ""
            if saver != rank and path and (path == loaded or Path(path).name in (e.get("message") or "")):
                return (f"rank {rank} loaded {Path(path).name}{_at(e, 'at')} before rank {saver} had saved it (line "
                        f"{save['line']}; {e['error']}): put dist.barrier() after the save, before any rank loads the "
                        f"file")
    return None


def crashed(case: Case) -> str | None:
    """A rank that raised (not a peer that lost contact with it): the error, where, and a cause where one is known."""
    for rank, events in sorted(case.ranks.items()):
        if how(events) != "error":
            continue
        e = end(events)
        barrier = _barrier_cause(case, rank, e)
        if barrier:
            return barrier
        line = f"rank {rank} raised {e['error']}{_at(e, 'at')}: {e['message']}"
        ids = re.search(r"device_ids (\[[^]]*\])", e["message"])
        if ids:
            return (f"rank {rank} raised {e['error']}{_at(e, 'at')}: DDP got device_ids={ids.group(1)} for a model on "
                    f"the CPU; device_ids names a GPU: give none on CPU, [device.index] on a GPU")
        if "set_epoch" in e["message"]:
            return line + "; the loader's sampler must be the DistributedSampler: DataLoader(..., sampler=sampler)"
        why = torch_errors.explain(e.get("detail") or e["message"])
        kept = _kept_the_wrapper(case, e)
        if kept:
            return (f"{line.rstrip(':')} (its keys start with module.): the best weights were kept from DDP's wrapper, "
                    f"line {kept} ({case.code(kept)}); keep the plain model's, model.module, and line {e.get('at')} "
                    f"loads them as it is")
        return f"{line.rstrip(':')}; {why}" if why else line
    return None


def _kept_the_wrapper(case: Case, e: dict) -> int | None:
    """The line that handed the wrapper to best.update, when a load of the best weights met module. keys."""
    if "module." not in (e.get("detail") or "") or "restore" not in case.code(e.get("at")):
        return None
    found = re.search(r"^.*best\.update\([^)]*\bmodel\)", case.source, re.M)
    return case.source[:found.start()].count("\n") + 1 if found else None


def _left_where(case: Case, events: list[dict]) -> str:
    n = len(steps(events))
    passes = len(_of(events, "pass", split="train"))
    destroy = _of(events, "destroy")
    gone = f"; it left the group{_at(destroy[-1])}" if destroy else ""
    return f"after {passes} epoch(s) of {case.epochs} and {n} optimizer step(s){gone}"


def _waited(case: Case, rank: int) -> str:
    """What ``rank`` waited in, and how that ended."""
    events = case.ranks[rank]
    call = waiting_in(events) or next((c for c in reversed(events) if c["kind"] in ("collective", "backward")
                                       and c.get("phase") == "enter"), None)
    e = end(events) or {}
    where = f"{call_name(call)}{_at(call)}" if call else f"line {e['at']}" if e.get("at") else "its script"
    then = {"lost": " until its connection to the others closed", "timed out": " until the group's timeout",
            "stopped": " until the checker stopped it"}.get(how(events), "")
    return f"rank {rank} waited in {where}{then}"


def _decision(case: Case, ranks_left: list[int]) -> str:
    """Why some ranks took another way: a value only rank 0 got (reduce), or a break under a rank test."""
    for events in case.ranks.values():
        for c in _of(events, "collective", name="reduce", phase="enter"):
            afters = {r: next((x.get("after") for x in _of(ev, "collective", name="reduce", phase="exit")
                               if x.get("seq") == c.get("seq")), None) for r, ev in case.ranks.items()}
            if len({str(v) for v in afters.values()}) > 1:
                kept = ", ".join(f"rank {r} [{', '.join(f'{x:.4g}' for x in v or [])}]" for r, v in sorted(afters.items()))
                return (f"dist.reduce{_at(c)} delivers the result to one rank only ({kept}), yet every rank decided "
                        f"from it: use dist.all_reduce where every rank uses the value")
    stop = source.rank_decision(case.source)
    if stop is not None:
        kind, at, test, where = stop
        return (f"the {kind} at line {at} runs under `if {test}:` (line {where}), on rank {_and(ranks_left)} alone: "
                f"a decision that ends the loop must be taken on every rank (share it first, with dist.broadcast or "
                f"an all_reduce)")
    return "a decision taken on some ranks alone ended their loop: every rank must run every epoch and every step"


def left_early(case: Case) -> str | None:
    """A rank that finished while another still waited for it: it skipped a collective, or left the loop early."""
    left = [r for r, ev in sorted(case.ranks.items()) if how(ev) == "ok"]
    waiting = [r for r, ev in sorted(case.ranks.items()) if how(ev) in ("lost", "timed out", "stopped")]
    if not left or not waiting:
        return None
    leaver = case.ranks[left[0]]
    hang = next((b["line"] for b in case.run.hang if b.get("missing")), None)
    waited = _shorten(hang, case) if hang else "; ".join(_waited(case, r) for r in waiting)
    finished = len(_of(leaver, "pass", split="train")) >= case.epochs and \
        all(len(steps(leaver)) >= len(steps(case.ranks[r])) for r in waiting)
    call = waiting_in(case.ranks[waiting[0]])
    if finished and call is not None and call["kind"] == "collective":
        return (f"rank {_and(left)} skipped the {call['name']} that rank {waiting[0]} called at line {call['line']} "
                f"and finished, while {waited}: every rank must call every collective, or the others wait for it")
    return (f"rank {_and(left)} left early ({_left_where(case, leaver)}), while {waited}: "
            f"{_decision(case, left)}")


def hung(case: Case) -> str | None:
    """Ranks stopped while waiting for each other (nobody left): the hang watch's line, else where each waited."""
    if not case.run.stopped or any(how(ev) == "ok" for ev in case.ranks.values()):
        return None
    line = next((b["line"] for b in case.run.hang if b.get("waiting_for")), None) or \
        next((b["line"] for b in case.run.hang), None)
    fix = "every rank must call every collective, in the same order, or the others wait for it"
    epochs = {r: len(_of(ev, "pass", split="train")) for r, ev in case.ranks.items()}
    behind = [r for r, n in sorted(epochs.items()) if n < max(epochs.values())]
    if line and behind:  # some ranks left the loop and wait after it, while the others still train
        return (f"rank {_and(behind)} left the training loop early ({_left_where(case, case.ranks[behind[0]])}) and "
                f"waits after it: {_shorten(line, case)}: {_decision(case, behind)}")
    if line:
        return f"{_shorten(line, case)}: {fix}"
    skipped = skipped_collective(case)
    if skipped:
        return skipped
    waits = "; ".join(_waited(case, r) for r, ev in sorted(case.ranks.items()) if how(ev) != "ok")
    return f"the ranks stopped making progress ({waits}): {fix}"


def skipped_collective(case: Case) -> str | None:
    """The first collective one rank called and another did not."""
    seqs = {r: _of(ev, "collective", phase="enter") for r, ev in case.ranks.items()}
    longest = max(seqs.values(), key=len, default=[])
    for i, call in enumerate(longest):
        for rank, seq in sorted(seqs.items()):
            if len(seq) <= i or seq[i]["name"] != call["name"]:
                caller = next(r for r, s in sorted(seqs.items()) if s is longest)
                did = f" (it called {seq[i]['name']}{_at(seq[i])} instead)" if len(seq) > i else ""
                return (f"rank {rank} skipped the {call['name']} that rank {caller} called at line {call['line']}"
                        f"{did}: every rank must call every collective, or the others wait for it")
    return None


def lost_every_rank(case: Case) -> str | None:
    """Every rank failed waiting: nobody to blame, so where each waited."""
    if all(how(ev) in ("lost", "timed out", "stopped") for ev in case.ranks.values()):
        waits = "; ".join(_waited(case, r) for r in sorted(case.ranks))
        return f"no rank finished ({waits}): {skipped_collective(case) or 'look for a collective not every rank reaches'}"
    return None


def summing(case: Case) -> str | None:
    """check_all_reduce's all_reduce: each rank contributes rank + 1, and every rank gets the sum."""
    world = len(case.ranks)
    for rank, events in sorted(case.ranks.items()):
        calls = [c for c in _of(events, "collective", name="all_reduce", phase="enter")
                 if source.function_at(case.source, c.get("line")) == "check_all_reduce"]
        if not calls:
            continue
        call = calls[0]
        if call.get("op") not in (None, "SUM"):
            return f"rank {rank} used op={call['op']}{_at(call)}: summing needs op=dist.ReduceOp.SUM"
        if call.get("before") != [rank + 1.0]:
            return (f"rank {rank} contributed {call.get('before')}{_at(call)}, expected [{rank + 1.0}]: each rank "
                    f"contributes its rank + 1 (dist.get_rank() + 1)")
        after = next((x.get("after") for x in _of(events, "collective", name="all_reduce", phase="exit")
                      if x.get("seq") == call.get("seq")), None)
        if after is not None and after != [world * (world + 1) / 2]:
            return f"rank {rank} got {after} from the all_reduce{_at(call)}, expected [{world * (world + 1) / 2}]"
    return None


ENDINGS: list[Callable[[Case], str | None]] = [open_todo, stopped_on_input, joining, summing, crashed, left_early,
                                                hung, lost_every_rank]


def first_mistake(case: Case, more: list[Callable[[Case], str | None]] = ()) -> str | None:
    """The first line of the endings' rules, then of ``more`` (the step's own), or None."""
    for rule in [*ENDINGS, *more]:
        message = rule(case)
        if message:
            return message
    return None
