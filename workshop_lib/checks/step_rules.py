"""What a run that ended well did, step by step: each rank's split and shard, the replicas, rank 0's duties.

Each rule measures an effect, then names a cause where the records show one; :func:`passed` builds the ✓ line from
the same measurements, so it states only what was measured."""

from __future__ import annotations

import math
from collections.abc import Callable

from workshop_lib.checks import shards, source
from workshop_lib.checks.recorder import _and, _at, _of, passes, split_sizes, spreads, steps
from workshop_lib.checks.rules import Case

TOLERANCE = 1e-6  # the replicas' spread that counts as equal (DDP on CPU gives exactly 0.0)


def same_split(case: Case) -> str | None:
    prints = {r: _of(ev, "splits")[0]["train"]["fp"] for r, ev in case.ranks.items() if _of(ev, "splits")}
    if len(set(prints.values())) > 1:
        ref = prints[min(prints)]
        other = next(r for r, p in sorted(prints.items()) if p != ref)
        return (f"rank {other}'s training split is not rank {min(prints)}'s (their molecules differ: fingerprint "
                f"{prints[other]} against {ref}): every rank must load the same split, and a DistributedSampler "
                f"gives each its share of it")
    return None


def _reads(case: Case, split: str = "train") -> dict[int, list[list[int]]]:
    return {r: passes(ev, split) for r, ev in case.ranks.items()}


def sharding(case: Case) -> str | None:
    n = split_sizes(case.ranks[0]).get("train")
    if n is None:
        return None
    found = shards.read_mistake(_reads(case), n, case.epochs)
    if found is None:
        return None
    kind, measured = found
    why = shards.cause(kind, case.ranks, "train", len(case.ranks)) if kind != "epochs" else ""
    return f"{measured}: {why}" if why else measured


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
            b = bypass[0]
            where = f"line {b['at']}" + (f" (in {b['function']}, called at line {b['called_from']})"
                                         if b.get("called_from") else "")
            return (f"{drift}: the training forward at {where} calls the model inside the wrapper "
                    f"(model.module, or another name for it), so DDP never saw the batch and backward() did not "
                    f"average the gradients; compute the loss through the DDP wrapper")
    for events in case.ranks.values():
        for c in _of(events, "collective", name="reduce", phase="enter"):
            return (f"{drift}: every rank stepped from values only rank 0 got from dist.reduce{_at(c)}; use "
                    f"dist.all_reduce where every rank uses the value")
    return f"{drift}: every rank must take the same step (the gradients averaged by DDP, the same optimizer settings)"


def evaluating(case: Case) -> str | None:
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


def saving(case: Case) -> str | None:
    saves = {r: [s for s in _of(ev, "save") if s.get("path")] for r, ev in case.ranks.items()}
    savers = sorted(r for r, s in saves.items() if s)
    if len(savers) > 1:
        first = saves[savers[0]][0]
        return (f"ranks {_and(savers)} all saved {first['path'].rsplit('/', 1)[-1]}{_at(first)}: one file for the "
                f"job, written by global rank 0 only (dist.get_rank() == 0); the local rank is 0 on every node")
    if savers and savers[0] != 0:
        return f"rank {savers[0]} saved{_at(saves[savers[0]][0])}: save from global rank 0 only"
    for rank in savers:
        keys = saves[rank][0]["keys"]
        if any(k.startswith("module.") for k in keys):
            return (f"rank {rank} saved the DDP wrapper's weights{_at(saves[rank][0])}: their keys start with 'module.' "
                    f"({keys[0]}); save model.module.state_dict(), the plain model's")
    if not savers:
        return "nothing was saved with torch.save: rank 0 saves the model's weights to cfg.out / 'model.pt'"
    return None


def _synced(events: list[dict], upto: dict) -> int:
    """How many collectives this rank had finished before the event ``upto``."""
    count = 0
    for e in events:
        if e is upto:
            return count
        count += e["kind"] == "collective" and e.get("phase") == "exit"
    return count


def loading(case: Case) -> str | None:
    """A file one rank saved and another loaded, with no collective between: found only because the saver was faster."""
    for saver, events in sorted(case.ranks.items()):
        for save in _of(events, "save"):
            if not save.get("path"):
                continue
            for rank, others in sorted(case.ranks.items()):
                load = next((e for e in _of(others, "load") if e.get("path") == save["path"]), None)
                if rank != saver and load is not None and _synced(others, load) <= _synced(events, save):
                    return (f"rank {rank} loaded {save['path'].rsplit('/', 1)[-1]}{_at(load)} with no collective "
                            f"between rank {saver}'s save (line {save['line']}) and the load: it found the file only "
                            f"because rank {saver} was faster this time; put dist.barrier() after the save, before any "
                            f"rank loads the file")
    return None


def _mean_losses(case: Case, ranks) -> list[tuple[float, int]]:
    """Per epoch, from each training batch's loss on ``ranks``: (the mean over their molecules, the molecules)."""
    out = []
    for e in range(case.epochs):
        losses = [(loss, n) for r in ranks for s in steps(case.ranks[r]) if s.get("epoch_pass") == e
                  for loss, n in s["losses"]]
        count = sum(n for _, n in losses)
        out.append((sum(loss * n for loss, n in losses) / count if count else math.nan, int(count)))
    return out


def logged_loss(case: Case) -> str | None:
    """Step 2 on: the loss rank 0 logs is the mean over every rank's molecules."""
    history = (case.metrics or {}).get("history")
    if history is None:
        return "rank 0 wrote no metrics.json: call report.finish(...) at the end, on rank 0"
    for e, ((truth, count), (own, _)) in enumerate(zip(_mean_losses(case, case.ranks), _mean_losses(case, [0]),
                                                       strict=True)):
        if e >= len(history) or math.isnan(truth):
            continue
        logged = history[e]["train_loss"]
        if abs(logged - truth) <= 1e-4 * max(1.0, abs(truth)):
            continue
        ops = [c for ev in case.ranks.values() for c in _of(ev, "collective", phase="enter")
               if c.get("op") not in (None, "SUM", "AVG")
               and source.function_at(case.source, c.get("line")) != "check_all_reduce"]
        what = (f"the logged loss of epoch {e + 1} is {logged:.4f}; the mean over the {count} molecules every rank "
                f"trained on is {truth:.4f}")
        if ops:
            return f"{what}: the totals were all-reduced with op={ops[0]['op']}{_at(ops[0])}; sum them (ReduceOp.SUM)"
        if abs(logged - own) <= 1e-4 * max(1.0, abs(own)):
            return f"{what}, and {logged:.4f} is rank 0's molecules alone: all_reduce the [loss sum, molecules] totals"
        return what
    return None


def leaving(case: Case) -> str | None:
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


def trained_every_epoch(case: Case) -> str | None:
    """Step 1 (no sharding yet): every rank read the training data in every epoch."""
    for rank, events in sorted(case.ranks.items()):
        read = len(passes(events, "train"))
        if read < case.epochs:
            return f"rank {rank} read the training molecules in {read} epoch(s), not {case.epochs}: train every epoch"
    return None


def _summed(case: Case) -> bool:
    """check_all_reduce's all_reduce left 1 + 2 + ... + N on every rank."""
    world = len(case.ranks)
    for events in case.ranks.values():
        calls = [c for c in _of(events, "collective", name="all_reduce", phase="exit")
                 if c.get("after") == [world * (world + 1) / 2]]
        if not calls:
            return False
    return True


def _what_each_read(case: Case) -> str:
    sizes = split_sizes(case.ranks[0])
    n = sizes.get("train", 0)
    reads = _reads(case)
    counts = {len(per_epoch[0]) for per_epoch in reads.values() if per_epoch}
    if counts == {n}:
        return f"each read all {n} training molecules"
    return f"each read its own {min(counts, default=0)} of {n} training molecules, a new order each epoch"


def passed(case: Case) -> str:
    """The ✓ line: what was measured, in the step's terms."""
    d, world = split_sizes(case.ranks[0]).get("dev", 0), len(case.ranks)
    spread = spreads(case.run.params)
    dev = f"rank 0 alone evaluated all {d} dev molecules each epoch"
    reads = f"{world} ranks, {case.epochs} epochs: {_what_each_read(case)}"
    if case.step == 1:
        joined = f"{world} ranks joined one group" + (f" and all-reduced {' + '.join(str(r + 1) for r in range(world))} "
                                                      f"= {world * (world + 1) // 2}" if _summed(case) else "")
        return (f"{joined}; {case.epochs} epochs: {_what_each_read(case)}; {dev} and saved the model; every rank left "
                f"the group")
    most = max(spread, default=0.0)
    loss = "the logged loss is the mean over all ranks"
    if case.step == 2:
        replicas = (f"the replicas drifted apart (spread {spread[-1]:.3g} after the last step)" if most > 0 else
                    "the replicas stayed equal (spread 0.0 after every step)")
        return f"{reads}; {replicas}; {dev} and saved its replica; {loss}"
    equal = "0.0" if most == 0 else f"at most {most:.1g}"
    return f"{reads}; spread after every step {equal}; {dev} and saved the plain model; {loss}"


RULES: dict[int, list[Callable[[Case], str | None]]] = {
    1: [same_split, trained_every_epoch, evaluating, saving, loading, leaving],
    2: [same_split, sharding, evaluating, saving, loading, logged_loss, leaving],
    3: [same_split, sharding, replicas, evaluating, saving, loading, logged_loss, leaving, device_ids],
}
RULES[4] = RULES[3]
