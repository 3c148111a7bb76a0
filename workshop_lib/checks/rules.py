"""From what every rank did (:mod:`workshop_lib.checks.record`'s records) to one line naming the mistake and its fix.

The script checker (:mod:`workshop_lib.checks.script`) and the notebook checks
(:mod:`workshop_lib.checks.common`) use these same rules, so a mistake reads the same in
both. Each rule returns a message, or None when it finds nothing wrong; the
first message wins, and the rules run from the root causes (how the group was
joined) to their consequences (a rank left waiting in a collective).
"""

from __future__ import annotations

from collections.abc import Callable

Events = dict[int, list[dict]]  # rank -> its events, in order

_LOST_PEERS = ("lost contact", "this rank stopped with it", "Connection closed", "Connection reset", "gloo",
               "Timed out", "timed out")


def _at(event: dict | None) -> str:
    line = (event or {}).get("line")
    return f" (line {line})" if line else ""


def _of(events: list[dict], kind: str, **match) -> list[dict]:
    return [e for e in events if e["kind"] == kind and all(e.get(k) == v for k, v in match.items())]


def _end(events: list[dict]) -> dict | None:
    ends = _of(events, "end")
    return ends[-1] if ends else None


def _lost_peers(end: dict) -> bool:
    return any(s in (end.get("message") or "") for s in _LOST_PEERS)


def _and(ranks: list[int]) -> str:
    return " and ".join(str(r) for r in ranks)


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
    claimed: dict = {}
    for rank, calls in sorted(inits.items()):
        if calls:
            claimed.setdefault(calls[0].get("rank"), []).append(rank)
    for value, who in claimed.items():
        if len(who) > 1:
            line = inits[who[0]][0].get("line")
            return (f"ranks {_and(who)} all joined as rank {value} (init_process_group"
                    f"{f' at line {line}' if line else ''} got rank={value}): pass the global rank (launch.rank); "
                    f"the local rank repeats on every node")
    return None


def _at_end(end: dict) -> str:
    return f" (line {end['at']})" if end.get("at") else ""


def sharding(ranks: Events, world_size: int = 2, **_) -> str | None:
    """Each rank's DistributedSampler: built after the group exists or told its place, num_replicas, its own rank."""
    made = {}
    for rank, events in sorted(ranks.items()):
        end = _end(events)
        built = _of(events, "sampler")
        if built and not built[0]["group"] and built[0]["rank"] is None and end and \
                "not been initialized" in (end.get("message") or ""):
            return (f"the DistributedSampler{_at(built[0])} was built before the process group existed (torch: "
                    f"Default process group has not been initialized): build it after init_process_group, or tell "
                    f"it this rank's place with num_replicas= and rank=")
        done = _of(events, "sampler_made")
        if done:
            made[rank] = done[0]
    if not made:
        trained = any(_of(ev, "read_sampler") or _of(ev, "evaluate") for ev in ranks.values())
        finished = all((_end(ev) or {}).get("ok") for ev in ranks.values())
        if trained or finished:
            return ("no rank built a DistributedSampler: every rank trains on all the data; give each rank its "
                    "own shard (torch.utils.data.distributed.DistributedSampler)")
        return None
    for rank, s in sorted(made.items()):
        if s["num_replicas"] != world_size:
            return (f"rank {rank}'s DistributedSampler splits the data into {s['num_replicas']} shard(s){_at(s)}, "
                    f"but {world_size} processes train: pass the world size as num_replicas")
    shards: dict = {}
    for rank, s in sorted(made.items()):
        shards.setdefault(s["rank"], []).append(rank)
    for shard, who in shards.items():
        if len(who) > 1:
            return (f"ranks {_and(who)} all read shard {shard} of the DistributedSampler{_at(made[who[0]])}: pass "
                    f"this process's global rank (env.rank) as rank; the local rank repeats on every node")
    for rank, s in sorted(made.items()):
        if s["rank"] != rank:
            return f"rank {rank} read shard {s['rank']}{_at(s)}: pass this process's global rank (env.rank) as rank"
    return None


def reshuffling(ranks: Events, epochs: int = 2, **_) -> str | None:
    """Every epoch must read the sampler after set_epoch(epoch): a new order each epoch, the same on all ranks."""
    for events in ranks.values():
        reads = _of(events, "read_sampler")
        if len(reads) < epochs:
            continue
        seen = [e["epoch"] for e in reads[:epochs]]
        if seen == list(range(epochs)):
            continue
        bad = next(i for i, e in enumerate(seen) if e != i)
        if not _of(events, "set_epoch"):
            return (f"sampler.set_epoch is never called: epoch {bad + 1} reads the same order as epoch 1{_at(reads[bad])}"
                    f"; call it with the epoch number in every epoch, before the loader is read")
        return (f"in epoch {bad + 1} the loader read the sampler while it was still set to epoch {seen[bad]}"
                f"{_at(reads[bad])}: call sampler.set_epoch(epoch) before the loader is read, not after")
    return None


def wrapping(ranks: Events, cuda: bool = False, **_) -> str | None:
    for rank, events in sorted(ranks.items()):
        wraps = _of(events, "ddp")
        if not wraps:
            end = _end(events)
            spread = (end or {}).get("replica_spread")
            unwrapped = "has no attribute 'module'" in ((end or {}).get("message") or "")
            if (end and end.get("ok")) or _of(events, "evaluate") or unwrapped:
                drift = f" (replica_spread {spread:.3g})" if isinstance(spread, float) else ""
                return (f"rank {rank} never wrapped its model in DistributedDataParallel: each replica follows its "
                        f"own gradients and they drift apart{drift}; wrap the model (torch.nn.parallel)")
            continue
        ids = wraps[0].get("device_ids")
        if not cuda and ids is not None:
            return (f"rank {rank} passed device_ids={ids} for a CPU model{_at(wraps[0])}: device_ids names a GPU; "
                    f"give none on CPU, and [env.local_rank] on a GPU")
    return None


def evaluating(ranks: Events, **_) -> str | None:
    for rank, events in sorted(ranks.items()):
        evals = _of(events, "evaluate")
        if rank != 0 and evals:
            return (f"rank {rank} evaluated too{_at(evals[0])}: every rank scores the same replica on the whole dev "
                    f"set, N times the work; evaluate on global rank 0 only (env.is_main)")
        wrapped = [e for e in evals if e["model"] == "DistributedDataParallel"]
        if wrapped:
            return (f"rank {rank} evaluated the DDP wrapper{_at(wrapped[0])}: evaluate the plain model inside it "
                    f"(raw_model = model.module), which every rank holds the same")
    if 0 in ranks and (_end(ranks[0]) or {}).get("ok") and not _of(ranks[0], "evaluate"):
        return "rank 0 never evaluated: score the model on the dev split every epoch, on global rank 0"
    return None


def saving(ranks: Events, **_) -> str | None:
    saves = {r: _of(ev, "save") for r, ev in ranks.items()}
    savers = sorted(r for r, s in saves.items() if s)
    if len(savers) > 1:
        return (f"ranks {_and(savers)} all saved {saves[savers[0]][0]['path'].rsplit('/', 1)[-1]}"
                f"{_at(saves[savers[0]][0])}: one file for the job, written by global rank 0 only (env.is_main); "
                f"local rank 0 exists on every node")
    if savers and savers[0] != 0:
        return f"rank {savers[0]} saved{_at(saves[savers[0]][0])}: save from global rank 0 only (env.is_main)"
    for rank in savers:
        keys = saves[rank][0]["keys"]
        if any(k.startswith("module.") for k in keys):
            return (f"rank {rank} saved the DDP wrapper's weights{_at(saves[rank][0])}: their keys start with "
                    f"'module.' ({keys[0]}); save raw_model.state_dict(), the plain model's")
    if all((_end(ev) or {}).get("ok") for ev in ranks.values()) and not savers:
        return "nothing was saved with torch.save: save the best weights to cfg.out / 'model.pt' on global rank 0"
    return None


def averaging(ranks: Events, world_size: int = 2, **_) -> str | None:
    """mean_over_ranks: every rank must get the mean of every rank's value."""
    calls = {r: _of(ev, "call", name="mean_over_ranks") for r, ev in ranks.items()}
    if not any(calls.values()):
        if all((_end(ev) or {}).get("ok") for ev in ranks.values()):
            return ("mean_over_ranks is never called: the log line's loss is rank 0's shard alone; average it "
                    "over the ranks")
        return None
    for i in range(min(len(c) for c in calls.values())):
        values = [calls[r][i]["args"][0] for r in sorted(calls)]
        results = {r: calls[r][i]["result"] for r in sorted(calls)}
        if None in values:
            continue
        mean, total = sum(values) / len(values), sum(values)
        for rank, got in results.items():
            if got is None or abs(got - mean) <= 1e-6 * max(1.0, abs(mean)):
                continue
            op = next((o for o in calls[rank][i].get("ops") or [] if o and o != "SUM"), None)
            if op:
                return (f"mean_over_ranks all-reduced with op={op}: rank {rank} got {got:.6g} instead of the mean "
                        f"{mean:.6g}; sum with ReduceOp.SUM, then divide by the world size")
            if abs(got - total) <= 1e-6 * max(1.0, abs(total)):
                return (f"mean_over_ranks returned the sum {got:.6g}, not the mean {mean:.6g}: divide the "
                        f"all-reduced sum by the world size ({world_size})")
            return f"mean_over_ranks returned {got:.6g} on rank {rank}, not the mean over the ranks {mean:.6g}"
    return None


def summing(ranks: Events, **_) -> str | None:
    """Step 1's check_all_reduce: rank + 1 summed over the ranks."""
    for rank, events in sorted(ranks.items()):
        calls = _of(events, "collective", name="all_reduce", phase="enter")
        if not calls:
            continue
        if calls[0].get("op") not in (None, "SUM"):
            return f"rank {rank} used op={calls[0]['op']}{_at(calls[0])}: summing needs op=dist.ReduceOp.SUM"
        if calls[0].get("before") != [rank + 1.0]:
            return (f"rank {rank} contributed {calls[0].get('before')}{_at(calls[0])}, expected [{rank + 1.0}]: "
                    f"each rank contributes its rank + 1")
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


def verdict(step: int, ranks: Events, *, world_size: int = 2, epochs: int = 2, cuda: bool = False,
            timed_out: bool = False) -> str | None:
    """The first mistake the records show, as one line; None when the step's lessons all hold."""
    for rule in RULES[step]:
        message = rule(ranks, world_size=world_size, epochs=epochs, cuda=cuda)
        if message:
            return message
    if timed_out:
        return stalled(ranks)
    return None
