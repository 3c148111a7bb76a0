"""From what every rank did (:mod:`workshop_lib.checks.record`'s records) to one line naming the mistake and its fix.

The script checker (:mod:`workshop_lib.checks.script`) and the notebook checks
(:mod:`workshop_lib.checks.common`) use these same rules, so a mistake reads the same in
both. Each rule returns a message, or None when it finds nothing wrong; the
first message wins, and the rules run from the root causes (how the group was
joined) to their consequences (a rank left waiting in a collective).
"""

from __future__ import annotations

from collections.abc import Callable

from workshop_lib.checks.events import Events, _and, _at, _at_end, _end, _lost_peers, _of
from workshop_lib.checks.step_rules import averaging, evaluating, reshuffling, saving, sharding, summing, wrapping

# ----------------------------------------------------------------------------- rules


def open_todo(ranks: Events, **_) -> str | None:
    for events in ranks.values():
        end = _end(events)
        if end and end.get("error") == "NotImplementedError":
            where = f" at line {end['at']}" if end.get("at") else ""
            return f"a TODO is still open{where}: fill it in (its line raises NotImplementedError)"
    return None


def device_choice(ranks: Events, cuda: bool = False, **_) -> str | None:
    for rank, events in sorted(ranks.items()):
        calls = _of(events, "set_device")
        if calls and not cuda:
            return (f"rank {rank} called torch.cuda.set_device{_at(calls[0])} on a machine without GPUs: "
                    f"call it only when the device is a GPU")
    return None


def joining(ranks: Events, world_size: int = 2, cuda: bool = False, **_) -> str | None:
    """How each rank called init_process_group: the backend for the device, its own global rank, the world size."""
    inits = {r: _of(ev, "init", phase="enter") for r, ev in ranks.items()}
    for rank, events in sorted(ranks.items()):
        end = _end(events)
        if not inits[rank]:
            early_sampler = any(not e["group"] for e in _of(events, "sampler"))
            if end and "not been initialized" in (end.get("message") or "") and not early_sampler:
                return (f"rank {rank} used the process group before joining it (torch: Default process group has "
                        f"not been initialized){_at_end(end)}: call dist.init_process_group first, in main")
            if end and end.get("ok"):
                return (f"rank {rank} never called dist.init_process_group: the processes never formed a group; "
                        f"join it in main before training")
            continue
        call = inits[rank][0]
        want = "nccl" if cuda else "gloo"
        if call.get("backend") != want:
            return (f"rank {rank} joined with backend {call.get('backend')}{_at(call)} on "
                    f"{'GPUs' if cuda else 'a machine without GPUs'}: use {want} ({'CUDA' if cuda else 'CPU'} tensors)")
        if call.get("world_size") not in (None, world_size):
            return (f"rank {rank} passed world_size={call.get('world_size')} to init_process_group{_at(call)}, but "
                    f"{world_size} processes were started: pass the launch's world size")
    claimed: dict = {}  # rank= as passed; None: env://, where torch reads RANK (torchrun's global rank) itself
    for rank, calls in sorted(inits.items()):
        if calls and calls[0].get("rank") is not None:
            claimed.setdefault(calls[0]["rank"], []).append(rank)
    for value, who in claimed.items():
        if len(who) > 1:
            line = inits[who[0]][0].get("line")
            return (f"ranks {_and(who)} all joined as rank {value} (init_process_group"
                    f"{f' at line {line}' if line else ''} got rank={value}): pass the global rank (launch.rank); "
                    f"the local rank repeats on every node")
    return None


def skipped_collective(ranks: Events, **_) -> str | None:
    """The first collective one rank called and another did not: the others wait for it."""
    seqs = {r: _of(ev, "collective", phase="enter") for r, ev in ranks.items()}
    longest = max(seqs.values(), key=len, default=[])
    for i, call in enumerate(longest):
        for rank, seq in sorted(seqs.items()):
            if len(seq) <= i or seq[i]["name"] != call["name"]:
                caller = next(r for r, s in sorted(seqs.items()) if s is longest)
                where = f" at line {call['line']}" if call.get("line") else ""
                did = f" (it called {seq[i]['name']}{_at(seq[i])} instead)" if len(seq) > i else ""
                return (f"rank {rank} skipped the {call['name']} that rank {caller} called{where}{did}: every rank "
                        f"must call every collective, or the others wait for it until the timeout")
    return None


def crashed(ranks: Events, **_) -> str | None:
    for rank, events in sorted(ranks.items()):
        end = _end(events)
        if end and not end.get("ok") and not _lost_peers(end):
            return f"rank {rank} raised {end.get('error')}{_at_end(end)}: {end.get('message')}"
    return None


def leaving(ranks: Events, **_) -> str | None:
    for rank, events in sorted(ranks.items()):
        end = _end(events)
        if end and end.get("ok") and not _of(events, "destroy"):
            return (f"rank {rank} never called dist.destroy_process_group: leave the group in a finally after the "
                    f"work, so it happens even after an error")
    return None


def stalled(ranks: Events, **_) -> str | None:
    waits = []
    for rank, events in sorted(ranks.items()):
        if _end(events):
            continue
        last = events[-1] if events else {}
        where = f"{last.get('name', last.get('kind', 'starting'))}{_at(last)}"
        waits.append(f"rank {rank} in {where}")
    return ("the ranks stopped making progress (" + "; ".join(waits) + "): look for a collective that not "
            "every rank reaches") if waits else None


RULES: dict[int, list[Callable]] = {
    1: [open_todo, device_choice, joining, summing, crashed, skipped_collective, leaving],
    2: [open_todo, device_choice, joining, sharding, crashed, skipped_collective, reshuffling, leaving],
    3: [open_todo, device_choice, joining, sharding, wrapping, evaluating, saving, crashed, skipped_collective,
        reshuffling, averaging, leaving],
}
RULES[4] = RULES[3]  # step 4 is step 3 plus snapshots: the script checker also reads OUT/snapshot.pt


def first_mistake(step: int, ranks: Events, *, world_size: int = 2, epochs: int = 2, cuda: bool = False,
            timed_out: bool = False) -> str | None:
    """The first mistake the records show, as one line; None when the step's lessons all hold."""
    for rule in RULES[step]:
        message = rule(ranks, world_size=world_size, epochs=epochs, cuda=cuda)
        if message:
            return message
    if timed_out:
        return stalled(ranks)
    return None
