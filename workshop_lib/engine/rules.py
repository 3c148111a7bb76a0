"""The script checker's invariants over what every rank recorded: one table (:data:`RULES`), one judge each.

A judge measures its invariant on the record and, where it breaks, names the line, the cause (read from the
record and from the script's text) and the fix in one line. :func:`first_mistake` asks them in the table's order:
how the run went comes first (the group formed, the sums hold, the script ran, the collectives agree, nobody
crashed), so that no later rule, and no ✓, is read from a run that did not end well; the rules that judge other
runs of the script (its data at 1 and 3 ranks, step 4's resume) come last and start those runs only then. Each
rule's scope says which runs and steps it judges; each says what its ✓ claims, so :func:`passed` builds the ✓ line
from the rules that were measured, and states only what was measured.
"""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from workshop_lib import metrics as core_metrics
from workshop_lib.debug.collectives import first_difference
from workshop_lib.engine import branches, made_up_rank, resume, shards, source, torch_errors
from workshop_lib.engine.recorder import _and, _at, _of, call_name, end, how, passes, split_sizes, spreads, steps, waiting_in
from workshop_lib.engine.runner import Run
from workshop_lib.launching import ends

TOLERANCE = 1e-6  # the replicas' spread that counts as equal (DDP on CPU gives exactly 0.0)
EVERY_COLLECTIVE = "every rank must call every collective, in the same order, or the others wait for it"
# How a rank ended that the checker stopped (recorder.how): waiting where the watch saw it, else timed out; no
# record at all (a run built by hand)
STOPPED = ("waiting", "timed out", "stopped")


@dataclass
class Case:
    """One run to judge: the records, the workshop step (None: a script that is not one, judged by the rules for any
    DDP script), the script's text, rank 0's metrics.json if it wrote one, and ``rerun``: only how the run went is
    judged (step 4's resumed and uninterrupted runs); ``reads``: a probe of the data alone (:mod:`runner`'s ``reads``),
    judged by the data rules. ``again(name, **item)`` runs the script once more into a folder ``name`` beside ``out``
    (the run's --out), for the rules that judge other runs (the data at other world sizes, step 4's resume)."""

    run: Run
    step: int | None
    epochs: int = 2
    source: str = ""
    name: str = "script.py"
    metrics: dict | None = None
    rerun: bool = False
    reads: bool = False  # a probe of the data alone at another world size: only the data rules are judged
    again: Callable[..., Run] | None = None
    out: Path | None = None
    later: dict[str, Case] = field(default_factory=dict, repr=False)  # the other runs, each run once

    def run_again(self, name: str, epochs: int, copy: bool = False) -> Case:
        """The script run again for ``epochs`` epochs into ``name`` beside --out (``copy``: into a copy of --out),
        once, judged as a rerun."""
        if name not in self.later:
            out = self.out.parent / name
            if copy:
                shutil.copytree(self.out, out, dirs_exist_ok=True)
            self.later[name] = replace(self, run=self.again(name, epochs=epochs), epochs=epochs, rerun=True, out=out,
                                       metrics=read_metrics(out), later={})
        return self.later[name]

    @property
    def ranks(self) -> dict[int, list[dict]]:
        return self.run.ranks

    def code(self, line: int | None) -> str:
        lines = self.source.splitlines()
        return lines[line - 1].strip() if line and 0 < line <= len(lines) else ""

    @property
    def items(self) -> str:
        return "training molecules" if self.step is not None else "training items"


def read_metrics(out: Path) -> dict | None:
    """What rank 0 wrote to OUT/metrics.json (the core's reader); None if nothing readable."""
    try:
        return core_metrics.read_metrics(out)
    except (OSError, ValueError):
        return None


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-4 * max(1.0, abs(b))


# ----------------------------------------------------------------------------- how the run went


def started(case: Case) -> str | None:
    """Every rank ran the script it was given: no TODO left open, no exit on its arguments."""
    for _, events in sorted(case.ranks.items()):
        e = end(events) or {}
        if e.get("type") == "NotImplementedError":
            return f"a TODO is still open{_at(e)}: fill it in (its line raises NotImplementedError)"
        if how(events) == "exit":
            said = (e.get("said") or [e["message"]])[-1]  # the script's own last words, as it printed them
            usage = (f"; its own arguments go after its path: python -m workshop_lib.check [options] {case.name} ARGS"
                     if case.step is None and e["code"] == 2 else "")
            return ends.summary({**e, "message": said}, by_line=True) + usage
    return None


def joined(case: Case) -> str | None:
    """Every rank joined one group, before using it, as its own rank, with the backend of its device."""
    for rank, events in sorted(case.ranks.items()):
        inits, e = _of(events, "init", phase="enter"), end(events) or {}
        if not inits and "not been initialized" in (e.get("message") or ""):
            if "DistributedSampler" in case.code(e.get("line")):
                return (f"the DistributedSampler{_at(e)} was built before the process group existed (torch: "
                        f"Default process group has not been initialized): build it after init_process_group")
            return (f"rank {rank} used the process group before joining it (torch: Default process group has not "
                    f"been initialized){_at(e)}: call dist.init_process_group first (in setup)")
        if not inits and e.get("how") == "returned" and not _of(events, "collective") and not _of(events, "destroy"):
            return (f"rank {rank} never called dist.init_process_group: the processes never formed a group; join it "
                    f"in setup, before training")
        if inits and inits[0]["backend"] not in ("gloo", "None") and how(events) == "raised":
            return (f"rank {rank} joined with backend {inits[0]['backend']}{_at(inits[0])} on a machine without GPUs: "
                    f"use the backend of the device, gloo for CPU tensors (dist.get_default_backend_for_device(device) "
                    f"picks it)")
    given = {r: inits[0].get("given_rank") for r, ev in case.ranks.items() if (inits := _of(ev, "init", phase="enter"))}
    for value in {v for v in given.values() if v is not None}:
        who = sorted(r for r, v in given.items() if v == value)
        if len(who) > 1:
            call = _of(case.ranks[who[0]], "init", phase="enter")[0]
            return (f"ranks {_and(who)} all joined as rank {value} (init_process_group{_at(call)} got rank={value}, "
                    f"the local rank): leave rank= out under torchrun (env:// reads RANK), or pass the global rank")
    return None


def _held(case: Case, epoch: int) -> dict[int, tuple[float, int]]:
    """Each rank's (summed loss, molecules) over its training batches of ``epoch``."""
    held = {}
    for r, events in case.ranks.items():
        batches = [(loss, n) for s in steps(events) if s.get("epoch_pass") == epoch for loss, n in s["losses"]]
        held[r] = (sum(loss * n for loss, n in batches), int(sum(n for _, n in batches)))
    return held


def _seq(events: list[dict], call: dict, phase: str = "exit") -> dict:
    """This rank's event of the collective numbered as ``call`` (its exit: what it left, ``after``); {} if none."""
    return next(iter(_of(events, "collective", phase=phase, seq=call.get("seq"))), {})


def _totals_call(case: Case, held: dict[int, tuple[float, int]], after: float) -> tuple[dict, str] | None:
    """Rank 0's all_reduce that left ``after`` among its values, and what each value was: 'loss sum', 'molecules'."""
    for call in _of(case.ranks[0], "collective", name="all_reduce", phase="enter"):
        if not any(_close(v, after) for v in _seq(case.ranks[0], call).get("after") or []):
            continue
        befores = {r: _seq(ev, call, "enter").get("before") or [] for r, ev in case.ranks.items()}
        names = []
        for i, _ in enumerate(call.get("before") or []):
            mine = {r: b[i] if i < len(b) else math.nan for r, b in befores.items()}
            names.append("molecules" if all(mine[r] == held[r][1] for r in mine) else
                         "loss sum" if all(_close(mine[r], held[r][0]) for r in mine) else f"value {i + 1}")
        return call, f"[{', '.join(names)}]"
    return None


def _reduced_twice(case: Case) -> tuple[dict, dict] | None:
    """Rank 0's two all_reduces where the second was given what the first returned: the sums summed again."""
    events = case.ranks[0]
    calls = _of(events, "collective", name="all_reduce", phase="enter")
    for i, call in enumerate(calls):
        for earlier in calls[:i]:
            if call.get("before") and call["before"] == _seq(events, earlier).get("after") and not _in_check(case, call):
                return earlier, call
    return None


def _logged_at(case: Case, epoch: int) -> tuple[int | None, str]:
    """(the line that logged ``epoch``, ' (logged at line N, its code)')."""
    logged = _of(case.ranks[0], "logged")
    line = logged[epoch]["line"] if epoch < len(logged) else None
    return line, f" (logged at line {line}, {case.code(line)})" if line else ""


def logged(case: Case) -> str | None:
    """What rank 0 logs (the loss, the molecules, every throughput figure) is the sum, or the mean where the name says
    so, over every rank's batches, in a run that ended well; where they differ, the line that made the difference (an
    all_reduce done twice, a scale by the world size, an op)."""
    world = len(case.ranks)
    ended_well = all(how(events) == "returned" for events in case.ranks.values())
    for e, row in enumerate((case.metrics or {}).get("history", [])[:case.epochs] if ended_well else ()):
        held = _held(case, e)
        count = sum(n for _, n in held.values())
        if not count:
            continue
        truth, own, logged = sum(s for s, _ in held.values()) / count, held[0][0] / max(held[0][1], 1), row["train_loss"]
        molecules = core_metrics.logged_samples(row) if row.get("seconds") else count
        twice = _reduced_twice(case)
        line, shown = _logged_at(case, e)
        scale = source.world_scale(case.source, line)
        if not _close(logged, truth):
            what = (f"the logged loss of epoch {e + 1} is {logged:.4f}{shown}; the mean over the {count} "
                    f"molecules every rank trained on is {truth:.4f}")
            ops = [c for ev in case.ranks.values() for c in _of(ev, "collective", phase="enter")
                   if c.get("op") not in (None, "SUM", "AVG")
                   and not _in_check(case, c)]
            if ops:
                return f"{what}: the totals were all-reduced with op={ops[0]['op']}{_at(ops[0])}; sum them (ReduceOp.SUM)"
            if _close(logged, own):
                return f"{what}, and {logged:.4f} is rank 0's molecules alone: all_reduce the [loss sum, molecules] totals"
            if scale and (_close(logged * world, truth) or _close(logged, truth * world)):
                at, text = scale
                verb = "divides" if _close(logged * world, truth) else "multiplies"
                return (f"{what}: line {at} ({text}) {verb} by the world size ({world}) a loss that the totals summed "
                        f"over every rank already made the mean; divide the summed loss by the summed molecules, and "
                        f"by nothing else")
            return what
        if molecules != count:
            said = f"rank 0 logs {molecules} molecules in epoch {e + 1}, the ranks trained on {count}"
            if twice and molecules == world * count:
                first, again = twice
                return (f"the totals were all-reduced twice, at line {first['line']} and again at line "
                        f"{again['line']}: the second sums the sums ({said}; the loss, a ratio, hides it): all_reduce "
                        f"them once")
            if scale and molecules * world == count:
                at, text = scale
                return (f"{said}: line {at} ({text}) divides by the world size a count the all_reduce already summed; "
                        f"log the summed count as it is")
            found = _totals_call(case, held, molecules)
            if found is None:
                return (f"{said}{shown}: count every rank's molecules, all_reduce the [loss sum, "
                        f"molecules] totals (ReduceOp.SUM)")
            call, values = found
            how_much = "halved" if 2 * molecules == count else f"{molecules} of {count}"
            did = "averaged" if call.get("op") == "AVG" else f"reduced with op={call.get('op')}"
            return (f"the all_reduce at line {call['line']} {did} {values} (op={call.get('op')}): the loss is right but "
                    f"the molecule count is {how_much} ({said}), and every throughput figure with it: sum the totals "
                    f"(ReduceOp.SUM)")
    return None


def _in_check(case: Case, call: dict) -> bool:
    """Whether a recorded call ran in the script's ``check_all_reduce`` (step 1's own all-reduce, judged apart)."""
    return source.function_at(case.source, call.get("line")) == "check_all_reduce"


def summed(case: Case) -> str | None:
    """check_all_reduce's all_reduce: each rank contributes rank + 1, and every rank gets the sum."""
    return all_reduced(case.ranks, lambda call: _in_check(case, call))


def all_reduced(ranks: dict[int, list[dict]], picked: Callable[[dict], bool] = lambda call: True) -> str | None:
    """The one judge of an all-reduce of rank + 1 (a script's check_all_reduce, notebook 01's cell), over each rank's
    record: its first dist.all_reduce that ``picked`` keeps sums (op SUM) rank + 1 and leaves 1 + ... + N on the
    rank. None where it holds, and for a rank that called none (whoever asks judges that)."""
    world = len(ranks)
    for rank, events in sorted(ranks.items()):
        call = next((c for c in _of(events, "collective", name="all_reduce", phase="enter") if picked(c)), None)
        if call is None:
            continue
        if call.get("op") not in (None, "SUM"):
            return f"rank {rank} used op={call['op']}{_at(call)}: summing needs op=dist.ReduceOp.SUM"
        if call.get("before") != [rank + 1.0]:
            return (f"rank {rank} contributed {call.get('before')}{_at(call)}, expected [{rank + 1.0}]: each rank "
                    f"contributes its rank + 1 (dist.get_rank() + 1)")
        after = _seq(events, call).get("after")
        if after is not None and after != [world * (world + 1) / 2]:
            return f"rank {rank} got {after} from the all_reduce{_at(call)}, expected [{world * (world + 1) / 2}]"
    return None


def _calls(events: list[dict]) -> list[dict]:
    """This rank's collectives in the order it entered them; once it wrapped a model in DDP, its backward() calls
    too (each all-reduces the gradients, unless its forward ran inside no_sync(): counted all the same, as every rank
    runs as many)."""
    wrapped, found = False, []
    for e in events:
        wrapped |= e["kind"] == "ddp"
        if e.get("phase") == "enter" and (e["kind"] == "collective" or (wrapped and e["kind"] == "backward")):
            found.append(e)
    return found


def _line_of(case: Case, event: dict) -> str:
    """'line 78 (in replica_spread, called at line 107)': where the learner's code led to ``event``."""
    via, name = event.get("via") or [], source.function_at(case.source, event.get("line"))
    return f"line {event.get('line')}" + (f" (in {name}, called at line {via[-1]})" if len(via) > 1 and name else "")


def _waited(case: Case, ranks: list[int]) -> str:
    """What ``ranks`` waited in, and how that ended: the hang watch's line where it saw it."""
    watched = next((b["line"] for b in case.run.hang if b.get("missing")), None) or \
        next((b["line"] for b in case.run.hang), None)
    if watched:
        return re.sub(r"\S*/" + re.escape(case.name), case.name, watched)  # the script's path as its name
    said = []
    for rank in ranks:
        events = case.ranks[rank]
        call = waiting_in(events) or next((c for c in reversed(_calls(events))), None)
        e = end(events) or {}
        where = f"{call_name(call)}{_at(call)}" if call else f"line {e['line']}" if e.get("line") else "its script"
        then = {"lost": " until its connection to the others closed", "group timeout": " until the group's timeout",
                **dict.fromkeys(STOPPED, " until the checker stopped it")}.get(how(events), "")
        said.append(f"rank {rank} waited in {where}{then}")
    return "; ".join(said)


def _left_where(case: Case, rank: int) -> str:
    events = case.ranks[rank]
    destroy = _of(events, "destroy")
    gone = f"; it left the group{_at(destroy[-1])}" if destroy else ""
    return (f"after {len(passes(events, 'train'))} epoch(s) of {case.epochs} and {len(steps(events))} optimizer "
            f"step(s){gone}")


def _decision(case: Case, ranks_left: list[int]) -> str | None:
    """Why some ranks left the loop: a value only rank 0 got (reduce) decided, or a break under a rank test."""
    for events in case.ranks.values():
        for c in _of(events, "collective", name="reduce", phase="enter"):
            afters = {r: _seq(ev, c).get("after") for r, ev in case.ranks.items()}
            if len({str(v) for v in afters.values()}) > 1:
                kept = ", ".join(f"rank {r} [{', '.join(f'{x:.4g}' for x in v or [])}]" for r, v in sorted(afters.items()))
                return (f"dist.reduce{_at(c)} delivers the result to one rank only ({kept}), yet every rank decided "
                        f"from it: use dist.all_reduce where every rank uses the value")
    stop = branches.rank_exit(case.source)
    if stop is not None:
        kind, at, test, where = stop
        return (f"the {kind} at line {at} runs under `if {test}:` (line {where}), on rank {_and(ranks_left)} alone: "
                f"a decision that ends the loop must be taken on every rank (share it first, with dist.broadcast or "
                f"an all_reduce)")
    return None


def same_collectives(case: Case) -> str | None:
    """The same collectives in the same order on every rank. At the first difference: each rank's call and line,
    and the cause: a call under a rank condition, a rank that left the loop early, or one that skipped the call."""
    calls = {r: _calls(ev) for r, ev in sorted(case.ranks.items())}
    i = first_difference({r: [c.get("name", "backward") for c in cs] for r, cs in calls.items()})
    stuck = [r for r, ev in sorted(case.ranks.items()) if how(ev) in ("lost", "group timeout", *STOPPED)]
    if i is None:
        if not stuck or any(how(ev) in ("raised", "killed") for ev in case.ranks.values()):
            return None
        return f"the ranks stopped making progress ({_waited(case, stuck)}): {EVERY_COLLECTIVE}"
    at = {r: cs[i] for r, cs in calls.items() if i < len(cs)}
    without = [r for r in calls if r not in at]
    ended = {"returned": " (it finished)", "raised": " (it raised)"}
    each = ", ".join(f"rank {r} called {call_name(at[r])} at {_line_of(case, at[r])}" if r in at else
                     f"rank {r} called nothing more{ended.get(how(case.ranks[r]), ' (it was elsewhere in its script)')}"
                     for r in calls)
    if any(how(case.ranks[r]) in ("raised", "killed") for r in without):
        return None  # the rank that crashed called no more: the crash is the cause
    for call in at.values():
        found = branches.under_rank((case.source, line) for line in [call.get("line"), *reversed(call.get("via") or [])])
        if found:
            alone = [q for q, c in at.items() if (c.get("name"), c["line"]) == (call.get("name"), call["line"])]
            line, if_line, test = found
            deadlock = (f": a barrier that rank {_and(alone)} alone reaches waits for ranks that never call it, a "
                        f"deadlock;" if call.get("name") == "barrier" else ", called by rank " + _and(alone) +
                        " alone:")
            return (f"the ranks' collectives first differ: {each}; line {line} runs under `if {test}:` (line "
                    f"{if_line}){deadlock} call it on every rank, or move it out of the block")
    waited = f", while {_waited(case, stuck)}" if stuck or case.run.hang else ""
    epochs = {r: len(passes(ev, "train")) for r, ev in case.ranks.items()}
    early = [r for r, n in sorted(epochs.items())  # in the loop, then out of it before the others, or before its end
             if n > 0 and (n < max(epochs.values()) or (r in without and n < case.epochs))]
    why = _decision(case, early) if early else None
    if early and (why or set(early) <= set(without)):
        why = why or "a decision taken on some ranks alone ended their loop: every rank must run every epoch and step"
        return f"rank {_and(early)} left the training loop early ({_left_where(case, early[0])}){waited}: {why}"
    if without:
        first, finished = next(iter(at)), all(how(case.ranks[r]) == "returned" for r in without)
        return (f"rank {_and(without)} skipped the {call_name(at[first])} that rank {first} called at line "
                f"{at[first].get('line')}{' and finished' if finished else ''}{waited}: every rank must call every "
                f"collective, or the others wait for it")
    return f"the ranks' collectives first differ: {each}: {EVERY_COLLECTIVE}"


def _file_race(case: Case, rank: int, e: dict) -> str | None:
    """A file this rank loaded (and failed on: not there yet, or half written) that another rank saved in this run."""
    loads = _of(case.ranks[rank], "load")
    loaded = loads[-1].get("path") if loads else None
    for saver, events in sorted(case.ranks.items()):
        for save in _of(events, "save"):
            path = save.get("path") or ""
            if saver != rank and path and (path == loaded or Path(path).name in (e.get("message") or "")):
                return (f"rank {rank} loaded {Path(path).name}{_at(e)} before rank {saver} had saved it (line "
                        f"{save['line']}; {e['type']}): put dist.barrier() after the save, before any rank loads the "
                        f"file")
    return None


def _kept_the_wrapper(case: Case, e: dict) -> str | None:
    """The line that handed the wrapper to best.update, when a load of the best weights met module. keys."""
    if "module." not in (e.get("detail") or "") or "restore" not in case.code(e.get("line")):
        return None
    found = re.search(r"^.*best\.update\([^)]*\bmodel\)", case.source, re.M)
    kept = case.source[:found.start()].count("\n") + 1 if found else None
    return kept and (f"(its keys start with module.): the best weights were kept from DDP's wrapper, line {kept} "
                     f"({case.code(kept)}); keep the plain model's, model.module, and line {e.get('line')} loads them "
                     f"as it is")


def set_up(events: list[dict], message: str, code: Callable[[int], str] | None = None) -> str:
    """Where the learner's call that set torch's ``message`` up was made, when that is not the line that raised
    (:data:`torch_errors.SET_UP`): the DataLoader the last pass drew from, built without a collate_fn; else ''. For a
    script's run and a cell's function alike (``code``: a line's text, where the source is known)."""
    last = next((p for p in reversed(_of(events, "pass")) if p.get("loader")), None)
    if torch_errors.set_up_by(message) != "loader" or last is None or last.get("collate_fn"):
        return ""
    shown = f" ({code(last['loader'])})" if code else ""
    return f"line {last['loader']}{shown} built the loader it read; "


def crashed(case: Case) -> str | None:
    """Every rank ran to the end. A rank that raised (not a peer that lost contact with it): torch's words, and the
    learner's line that set it up where the record or the text shows one."""
    for rank, events in sorted(case.ranks.items()):
        if how(events) == "killed":  # its process died, with no Python error to read: how, and its last lines
            return ends.summary(end(events))
        if how(events) != "raised" or (case.reads and _of(events, "pass", split="train")):
            continue  # (a probe's training passes are left empty: what fails after one is the probe's)
        e = end(events)
        said = ends.summary(e, by_line=True)
        race, kept = _file_race(case, rank, e), _kept_the_wrapper(case, e)
        if race or kept:
            return race or f"{said} {kept}"
        why = branches.unset_on_rank(case.source, e.get("line"), e["type"], e["message"], rank) or torch_errors.explain(
            e.get("detail") or e["message"]) or (
            shards.cause("raised", case.ranks, "train") if "DistributedSampler" in case.code(e.get("line")) else None)
        setup = set_up(events, e.get("detail") or e["message"], case.code)
        return f"{said.rstrip('.')}; {setup}{why}" if why else said
    return None


# ----------------------------------------------------------------------------- what a run that ended well did


def same_split(case: Case) -> str | None:
    prints = {r: _of(ev, "splits")[0]["train"]["fp"] for r, ev in case.ranks.items() if _of(ev, "splits")}
    if len(set(prints.values())) > 1:
        ref = prints[min(prints)]
        other = next(r for r, p in sorted(prints.items()) if p != ref)
        return (f"rank {other}'s training split is not rank {min(prints)}'s (their molecules differ: fingerprint "
                f"{prints[other]} against {ref}): every rank must load the same split, and a DistributedSampler "
                f"gives each its share of it")
    return None


def _read(case: Case, kinds: tuple[str, ...] | None = None) -> str | None:
    n = split_sizes(case.ranks[0]).get("train")
    found = shards.read_mistake({r: passes(ev, "train") for r, ev in case.ranks.items()}, n, case.epochs,
                                case.items) if n else None
    if found is None or (kinds and found[0] not in kinds):
        return None
    kind, measured = found
    why = shards.cause(kind, case.ranks, "train", len(case.ranks)) if kind != "epochs" else "train every epoch"
    return f"{measured}: {why}" if why else measured


def every_epoch(case: Case) -> str | None:
    """Every rank reads the training data in every epoch."""
    return _read(case, ("epochs",))


def sharded(case: Case) -> str | None:
    """The shards: every epoch read by every rank, disjoint, covering and reshuffled each epoch."""
    return _read(case)


def same_start(case: Case) -> str | None:
    """Every rank's weights before its first optimizer step are the same (DDP broadcasts rank 0's when it wraps)."""
    starts = {r: w[0]["fp"] for r, ev in sorted(case.ranks.items()) if (w := _of(ev, "weights"))}
    if len(set(starts.values())) < 2:
        return None
    other = next(r for r, fp in starts.items() if fp != starts[min(starts)])
    seeds = {r: [e["seed"] for e in _of(ev, "seed")] for r, ev in case.ranks.items()}
    differ = next((_of(case.ranks[other], "seed")[k] for k, v in enumerate(seeds[other])
                   if k < len(seeds[min(starts)]) and v != seeds[min(starts)][k]), None)
    what = f"ranks {min(starts)} and {other} start from different weights (measured before the first optimizer step)"
    if differ is not None:
        code = case.code(differ.get("line"))
        return (f"{what}: torch.manual_seed at line {differ['line']}{f' ({code})' if code else ''} seeds each rank "
                f"with its own number, so each builds its own initial model; give every rank the same seed (DDP would "
                f"broadcast rank 0's weights when it wraps the model, and this script has no DDP wrapper before its "
                f"first step)")
    return (f"{what}: each rank built its model from its own random numbers; seed every rank the same before "
            f"building the model, or wrap it in DDP, which broadcasts rank 0's weights")


def one_rank_decides(case: Case) -> str | None:
    """A value that only one rank received (dist.reduce's result, gather's list) read by a test that every rank
    runs: each rank decides from its own value, whether or not this run happened to diverge."""
    for events in case.ranks.values():
        for c in _of(events, "collective", phase="enter"):
            if c.get("name") not in ("reduce", "gather"):
                continue
            found = branches.decided_by_received(case.source, c.get("line"), c["name"])
            if found:
                name, at, test = found
                return (f"dist.{c['name']}{_at(c)} delivers {name} to its dst rank alone, yet line {at} (`{test}`) "
                        f"decides from it on every rank: each other rank decides from its own value; use "
                        f"dist.{'all_reduce' if c['name'] == 'reduce' else 'all_gather'} where every rank uses it")
    return None


def replicas(case: Case) -> str | None:
    """Step 3 on: the same weights on every rank after every optimizer step."""
    spread = spreads(case.run.params)
    bad = next((k for k, s in enumerate(spread) if s > TOLERANCE), None)
    if bad is None:
        return None
    drift = f"the replicas differ by up to {spread[bad]:.3g} after step {bad + 1}"
    for rank, events in sorted(case.ranks.items()):
        if not _of(events, "ddp"):
            return (f"rank {rank} never wrapped its model in DistributedDataParallel: {drift}, each replica following "
                    f"its own gradients; wrap it (model = DDP(model)) and train through the wrapper")
        bypass = _of(events, "bypass")
        if bypass and not sum(s["ddp_forwards"] for s in steps(events)):
            return (f"{drift}: the training forward at {_line_of(case, bypass[0])} calls the model inside the wrapper "
                    f"(model.module, or another name for it), so DDP never saw the batch and backward() did not "
                    f"average the gradients; compute the loss through the DDP wrapper")
    for events in case.ranks.values():
        for c in _of(events, "collective", name="reduce", phase="enter"):
            return (f"{drift}: every rank stepped from values only rank 0 got from dist.reduce{_at(c)}; use "
                    f"dist.all_reduce where every rank uses the value")
    return f"{drift}: every rank must take the same step (the gradients averaged by DDP, the same optimizer settings)"


def evaluated(case: Case) -> str | None:
    """Rank 0, alone, scores the whole dev set once an epoch (through the plain model, from step 3 on)."""
    d = split_sizes(case.ranks[0]).get("dev")
    for rank, events in sorted(case.ranks.items()):
        if rank != 0 and passes(events, "dev"):
            where = next(iter(_of(events, "evaluate", split="dev")), _of(events, "pass", split="dev")[0])
            return (f"rank {rank} evaluated too{_at(where)}: every rank scored the same model on the dev set, N times "
                    f"the work; evaluate on global rank 0 only (dist.get_rank() == 0)")
    reads = passes(case.ranks[0], "dev")
    if not reads:
        return "rank 0 never evaluated: score the model on the dev split every epoch, on global rank 0"
    short = next(((e, r) for e, r in enumerate(reads) if sorted(set(r)) != list(range(d)) or len(r) != d), None)
    if short is not None:
        e, r = short
        dev_sampler = [s for ev in case.ranks.values() for s in _of(ev, "sampler", split="dev")]
        why = (f"the dev loader has a DistributedSampler{_at(dev_sampler[0])}, which gives rank 0 its shard alone; "
               f"rank 0 evaluates alone, so give the dev loader no sampler") if dev_sampler else \
            "evaluate every dev molecule, once"
        return f"rank 0 evaluated {len(set(r))} of the {d} dev molecules in epoch {e + 1}: {why}"
    if len(reads) != case.epochs:
        return f"rank 0 evaluated the dev set {len(reads)} time(s) in {case.epochs} epochs: once an epoch"
    wrapped = [e for e in _of(case.ranks[0], "evaluate") if e["model"] == "DistributedDataParallel"]
    if wrapped:
        return (f"rank 0 evaluated the DDP wrapper{_at(wrapped[0])}: evaluate the plain model inside it, model.module "
                f"(the wrapper's forward is for training; with buffers it would wait for the other ranks)")
    return None


def _synced(events: list[dict], upto: dict) -> int:
    """How many collectives this rank had finished before the event ``upto``."""
    return sum(e["kind"] == "collective" and e.get("phase") == "exit" for e in events[:events.index(upto)])


def files(case: Case) -> str | None:
    """The files: written by global rank 0 alone; none loaded by another rank without a collective after its save."""
    saves = {r: [s for s in _of(ev, "save") if s.get("path")] for r, ev in case.ranks.items()}
    savers = sorted(r for r, s in saves.items() if s)
    if len(savers) > 1:
        first = saves[savers[0]][0]
        return (f"ranks {_and(savers)} all saved {Path(first['path']).name}{_at(first)}: one file for the job, written "
                f"by global rank 0 only (dist.get_rank() == 0); the local rank is 0 on every node")
    if savers and savers[0] != 0:
        return f"rank {savers[0]} saved{_at(saves[savers[0]][0])}: save from global rank 0 only"
    for save in saves.get(0, []):
        for rank, others in sorted(case.ranks.items()):
            load = next((e for e in _of(others, "load") if e.get("path") == save["path"]), None)
            if rank and load is not None and _synced(others, load) <= _synced(case.ranks[0], save):
                return (f"rank {rank} loaded {Path(save['path']).name}{_at(load)} with no collective between rank 0's "
                        f"save (line {save['line']}) and the load: it found the file only because rank 0 was faster "
                        f"this time; put dist.barrier() after the save, before any rank loads the file")
    return None


def workshop_files(case: Case) -> str | None:
    """The workshop's files: model.pt, with the plain model's keys, and metrics.json."""
    saves = [s for s in _of(case.ranks[0], "save") if s.get("path")]
    if not saves:
        return "nothing was saved with torch.save: rank 0 saves the model's weights to cfg.out / 'model.pt'"
    if any(k.startswith("module.") for k in saves[0]["keys"]):
        return (f"rank 0 saved the DDP wrapper's weights{_at(saves[0])}: their keys start with 'module.' "
                f"({saves[0]['keys'][0]}); save model.module.state_dict(), the plain model's")
    if not (case.metrics or {}).get("history"):
        return "rank 0 wrote no metrics.json: call report.finish(...) at the end, on rank 0"
    return None


def left_the_group(case: Case) -> str | None:
    for rank, events in sorted(case.ranks.items()):
        if not _of(events, "destroy"):
            return (f"rank {rank} never called dist.destroy_process_group: leave the group in the finally of a try "
                    f"around the work")
    line = source.destroy_outside_finally(case.source)
    if line is not None:
        return (f"dist.destroy_process_group() at line {line} is not in a finally: an error before it would leave the "
                f"group behind; put it in the finally of a try around the work")
    return None


def device_ids(case: Case) -> str | None:
    """What the CPU run cannot show: device_ids naming the global rank (on a node of 2 GPUs, rank 3 is on cuda:1)."""
    found = source.global_rank_device_ids(case.source)
    if found is None:
        return None
    at, text = found
    return (f"device_ids at line {at} ({text}) names the global rank: on a node with 2 GPUs rank 3 lives on cuda:1; "
            f"pass [device.index], this process's own GPU")


def other_worlds(case: Case) -> str | None:
    """The data rules at each of :data:`WORLDS`, on probes of the data alone (each training pass read from the
    sampler at once, no step taken: a second or so each). A probe runs with the same arguments, so it writes where
    the script writes (a workshop step: an --out of its own); one that reads fewer passes on every rank (a script
    that resumed from the first run's snapshot) is judged on those."""
    reads = min(case.epochs, 2)
    for world in WORLDS if _probed(case) else ():
        run = case.again(f"world{world}", world=world, reads=reads)
        read = min(reads, max((len(passes(ev, "train")) for ev in run.ranks.values()), default=0))  # fewer: resumed
        message = first_mistake(replace(case, run=run, epochs=read, metrics=None, reads=True, again=None, later={}))
        if message:
            return f"at {world} rank{'s' if world > 1 else ''} (the data is judged at 1 and 3 ranks too): {message}"
    return None


def _probed(case: Case) -> bool:
    return case.again is not None and bool(passes(case.ranks[0], "train"))


def reran(case: Case) -> str | None:
    """Step 4's second run (--epochs 3 into a copy of --out) and an uninterrupted one each run well."""
    for name, what, copy in (("resumed", f"the resumed run (--epochs {resume.EPOCHS} into the same --out)", True),
                             ("whole", f"an uninterrupted {resume.EPOCHS}-epoch run", False)):
        message = first_mistake(case.run_again(name, resume.EPOCHS, copy)) if case.again else None
        if message:
            return f"{what}: {message}"
    return None


# ----------------------------------------------------------------------------- gradient accumulation, gradients by hand


def accumulating(case: Case) -> tuple[int, list[dict], int] | None:
    """Where a step of rank 0 follows more than one backward(): (its steps, its backward() calls, how many of those
    all-reduced); None where none does. Counted from the all-reduces recorded in backward() where DDP's go through
    dist.all_reduce (a "comm_hook" event: a notebook's check); else from DDP's own flag at each training forward
    (``require_backward_grad_sync``, False inside no_sync()): a backward() all-reduces after a forward that synced."""
    events = case.ranks[0]
    made, calls = steps(events), _of(events, "backward", phase="enter")
    if not any(s["backwards"] > 1 for s in made):
        return None
    if _of(events, "comm_hook"):
        return len(made), calls, len({c["backward"] for c in _of(events, "collective", name="all_reduce",
                                                                   phase="enter") if c.get("backward")})
    if not _of(events, "ddp"):
        return None  # no DDP: nothing all-reduced in backward() but what the script calls (the by-hand rows)
    return len(made), calls, sum(min(s.get("ddp_syncs", 0), s["backwards"]) for s in made)


def accumulation(case: Case) -> str | None:
    """Gradient accumulation all-reduces once per optimizer step: each backward() but the last before the step runs,
    with its forward, inside DDP's no_sync(); the replicas stay equal."""
    found = accumulating(case)
    if found is None:
        return None
    made, calls, reduced = found
    if max(spreads(case.run.params), default=0.0) > TOLERANCE:
        return ("the replicas drifted apart with 0 all-reduces: the last micro-batch of each step must run its forward "
                "and backward outside model.no_sync()" if reduced == 0 else
                "the replicas drifted apart: a step used gradients that were not all-reduced; only the last micro-batch "
                "before each optimizer.step() may run outside model.no_sync()")
    if reduced == len(calls):
        step = steps(case.ranks[0])[0]
        return (f"the gradients were all-reduced in all {reduced} backward() calls{_at(calls[0])}, {step['backwards']} "
                f"per optimizer step{_at(step)}: DDP all-reduces in every backward() whose forward ran outside "
                f"no_sync(), where one per step suffices (the same weights, to rounding); run the forward and backward "
                f"of all but the last micro-batch of each step inside `with model.no_sync():` (the forward too)")
    if reduced != made:
        return (f"DDP all-reduced the gradients in {reduced} backward() calls for {made} optimizer steps: exactly one "
                f"backward per step, the last before optimizer.step(), must run outside model.no_sync()")
    return None


def hand_allreduces(events: list[dict]) -> list[dict]:
    """The all-reduces this rank started inside backward(), of a model not wrapped in DDP: its gradient hooks'."""
    if _of(events, "ddp") or _of(events, "comm_hook"):
        return []  # DDP's own, through a comm hook: DDP waits for them
    return [c for c in _of(events, "collective", name="all_reduce", phase="enter") if c.get("backward")]


def blocked(case: Case) -> str | None:
    """Gradients all-reduced by hand start asynchronously as backward() makes them, so that backward goes on."""
    for events in case.ranks.values():
        blocking = [c for c in hand_allreduces(events) if not c.get("async_op")]
        if blocking:
            return (f"{len(blocking)} all-reduces blocked backward: dist.all_reduce{_at(blocking[0])} waited for every "
                    f"rank before backward went on (async_op=False); start them with async_op=True, keep the handles, "
                    f"and wait for them after backward()")
    return None


def unwaited(case: Case) -> str | None:
    """Gradients all-reduced by hand: every handle waited for before the optimizer step reads the gradients."""
    for events in case.ranks.values():
        started = {c["seq"]: c for c in hand_allreduces(events) if c.get("async_op")}
        pending, missed, at = set(), [], None
        for e in events:
            if e["kind"] == "collective" and e.get("phase") == "enter" and e.get("seq") in started:
                pending.add(e["seq"])
            elif e["kind"] == "wait":
                pending.discard(e["seq"])
            elif e["kind"] == "step" and pending:
                missed, at, pending = missed + sorted(pending), at or e, set()
        if missed:
            return (f"{len(missed)} all-reduces were still unwaited at optimizer.step(){_at(at)}: the step may read a "
                    f"gradient before its all-reduce{_at(started[missed[0]])} ends; wait() on every handle after "
                    f"backward(), then clear them")
    return None


def _note(found: str | None) -> str | None:
    """A finding where the result is right and only its cost is not: said after the ✓, not as a ✗."""
    return found and f"note: {found}"


RUN, ANY = "run", "any"  # a rule's scope: every run, resumed ones too; any DDP script and every workshop step
WORLDS = (3, 1)  # the world sizes the data rules are judged at besides 2
Claim = Callable[[Case], str | None]


@dataclass(frozen=True)
class Rule:
    holds: str  # the invariant, in words
    judge: Callable[[Case], str | None]
    scope: str | tuple[int | None, ...] = RUN  # RUN, ANY, or the steps whose finished runs it judges (None: any script)
    data: bool = False  # judged on a probe of the data alone, at another world size
    says: tuple[tuple[tuple[int | None, ...], Claim], ...] = ()  # what its ✓ claims, at which steps ("and ..." joins)

    def applies(self, case: Case) -> bool:
        if case.reads and not self.data:
            return False
        return self.scope == RUN or (not case.rerun and (self.scope == ANY or case.step in self.scope))

    def claim(self, case: Case) -> str | None:
        return next((say(case) for steps, say in self.says if case.step in steps), None)


def _what_each_read(case: Case) -> str:
    n = split_sizes(case.ranks[0]).get("train", 0)
    counts = {len(per_epoch[0]) for per_epoch in (passes(ev, "train") for ev in case.ranks.values()) if per_epoch}
    if not counts:
        return f"no {case.items} were read through a DataLoader"
    if counts == {n}:
        return f"each read all {n} {case.items}"
    return (f"each read its own {min(counts, default=0)} of {n} {case.items}" +
            (", a new order each epoch" if case.epochs > 1 else ""))


def _drift(case: Case) -> str:
    spread = spreads(case.run.params)
    if max(spread, default=0.0) == 0:
        return "the replicas stayed equal (spread 0.0 after every step)"
    began = "started from the same weights, then " if all(_of(ev, "weights") for ev in case.ranks.values()) else ""
    return f"the replicas {began}drifted apart (spread {spread[-1]:.3g} after the last step)"


def _summed(case: Case) -> str | None:
    world = len(case.ranks)
    return f"and all-reduced {' + '.join(str(r + 1) for r in range(world))} = {world * (world + 1) // 2}" if any(
        _in_check(case, c)
        for c in _of(case.ranks[0], "collective", name="all_reduce")) else None


def _any_replicas(case: Case) -> str:
    spread = spreads(case.run.params)
    return (f"the replicas started equal and stayed equal (spread {max(spread):.1g} after {len(spread)} step(s))"
            if spread else "no optimizer step was recorded")


def _wrote(case: Case) -> str:
    saved = sorted({Path(s["path"]).name for s in _of(case.ranks[0], "save") if s.get("path")})
    return f"rank 0 alone wrote {', '.join(saved)}" if saved else "no rank saved a file with torch.save"


ALL, DDP, STEPS = (1, 2, 3, 4), (3, 4), (2, 3, 4)
RULES = (
    Rule("every rank joins one group, as its own rank, with the backend of its device", joined, data=True,
         says=(((1,), lambda c: f"{len(c.ranks)} ranks joined one group"),)),
    Rule("check_all_reduce's all-reduce leaves every rank the sum of what the ranks held", summed, ALL,
         says=(((1,), _summed),)),
    Rule("every rank runs the script it was given (no TODO left open, no exit on its arguments)", started, data=True,
         says=(((1,), lambda c: f"{c.epochs} epochs: {_what_each_read(c)}"),
               (STEPS, lambda c: f"{len(c.ranks)} ranks, {c.epochs} epochs: {_what_each_read(c)}"),
               ((None,), lambda c: f"{len(c.ranks)} ranks, {c.epochs} epoch(s): {_what_each_read(c)}"))),
    Rule("the same collectives in the same order on every rank", same_collectives,
         says=(((None,), lambda c: f"the same {len(_calls(c.ranks[0]))} collectives on every rank (each backward() "
                                   f"through DDP counted: it all-reduces the gradients outside no_sync())"),)),
    Rule("every rank runs to the end", crashed, data=True),
    Rule("a value one rank received decides nothing on the others", one_rank_decides, ANY),
    Rule("the replicas start from the same weights", same_start, ANY, says=(((2,), _drift),)),
    Rule("gradients all-reduced by hand are waited for before the optimizer step reads them", unwaited, ANY),
    Rule("the replicas are equal after every step (DDP wraps the model)", replicas, (None, *DDP),
         says=((DDP, lambda c: "spread after every step " + (f"at most {most:.1g}" if (
             most := max(spreads(c.run.params), default=0.0)) else "0.0")), ((None,), _any_replicas))),
    Rule("every rank loads the same split", same_split, ALL, data=True),
    Rule("every rank reads the training data every epoch", every_epoch, (1,), data=True),
    Rule("the shards: disjoint, covering, reshuffled each epoch (set_epoch)", sharded, (None, *STEPS), data=True),
    Rule("rank 0 alone evaluates the whole dev set once an epoch, through the plain model", evaluated, ALL,
         says=((ALL, lambda c: f"rank 0 alone evaluated all {split_sizes(c.ranks[0]).get('dev', 0)} dev molecules "
                               f"each epoch"),)),
    Rule("the files: written by global rank 0 alone, loaded after a collective", files, ANY, says=(((None,), _wrote),)),
    Rule("the files: model.pt in plain keys and metrics.json", workshop_files, ALL,
         says=(((1,), lambda c: "and saved the model"), ((2,), lambda c: "and saved its replica"),
               (DDP, lambda c: "and saved the plain model"))),
    Rule("setup, as rank 3 of 4 on a made-up node with 2 GPUs, makes its own GPU current and joins with NCCL",
         lambda c: made_up_rank.on_a_gpu_node(c.source, c.name)[1], ALL,
         says=(((1,), lambda c: made_up_rank.on_a_gpu_node(c.source, c.name)[0]),)),
    Rule("what rank 0 logs is the sum, or the mean, over every rank's batches", logged, STEPS,
         says=((STEPS, lambda c: "the logged loss is the mean over all ranks"),)),
    Rule("every rank leaves the group, in a finally", left_the_group, ANY,
         says=(((1,), lambda c: "every rank left the group"), ((None,), lambda c: "every rank left the group in a "
                                                                                  "finally"))),
    Rule("device_ids names this process's own GPU", device_ids, (None, *DDP)),
    Rule("the data rules hold at 1 and 3 ranks too", other_worlds, (None, *STEPS),
         says=(((None, *STEPS), lambda c: "at 1 and 3 ranks the shards held too" if _probed(c) else None),)),
    Rule("step 4's snapshot: in --out, loadable with weights_only=True, holding the last epoch", resume.snapshot, (4,)),
    Rule("step 4's snapshot: written to a temporary file in --out, then renamed onto it", resume.writing, (4,)),
    Rule("step 4's resumed run and an uninterrupted one each run well", reran, (4,)),
    Rule("step 4's resumed run loads the snapshot with weights_only=True and a map_location", resume.loading, (4,)),
    Rule("step 4's resumed run trains the epochs after the snapshot's alone", resume.epochs_trained, (4,)),
    Rule("step 4's resumed run ends with the uninterrupted run's figures", resume.figures, (4,),
         says=(((4,), lambda c: resume.PASSED if {"resumed", "whole"} <= set(c.later) else None),)),
    Rule("gradient accumulation all-reduces once per optimizer step, with no_sync (a note where it does not: the "
         "weights are the same)", lambda c: None, ANY, says=(((None, *ALL), lambda c: _note(accumulation(c))),)),
    Rule("gradients all-reduced by hand start asynchronously in backward() (a note where they block)", lambda c: None,
         ANY, says=(((None, *ALL), lambda c: _note(blocked(c))),)),
)


def first_mistake(case: Case) -> str | None:
    """The first broken invariant of :data:`RULES` that applies to the case, as one line; None if none."""
    for rule in RULES:
        if rule.applies(case):
            message = rule.judge(case)
            if message:
                return message
    return None


def judged(case: Case) -> tuple[list[str], list[str]]:
    """(the invariants judged on the case, those that need a workshop step): what a ✓ on any DDP script covers."""
    rules = [r for r in RULES if r.applies(case)]
    return [r.holds for r in rules], [r.holds for r in RULES if r not in rules]


def passed(case: Case) -> str:
    """The ✓ line: what each rule that was judged claims at the case's step, in the table's order."""
    return re.sub(r"; (?=and )", " ", "; ".join(filter(None, (r.claim(case) for r in RULES if r.applies(case)))))
