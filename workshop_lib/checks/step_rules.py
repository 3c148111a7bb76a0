"""The rules for what steps 2 and 3 teach: sharding and reshuffling, wrapping, rank 0's duties, averaging.

Each takes every rank's events and returns one line naming the mistake, or None;
:func:`workshop_lib.checks.rules.first_mistake` runs them in order.
"""

from __future__ import annotations

from workshop_lib.checks.events import Events, _and, _at, _end, _of


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
