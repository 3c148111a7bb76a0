"""Sharding judged by the indices each rank's loader read (:func:`read_mistake`), then explained by how its sampler
was built and used (:func:`cause`): for the script checker and notebook 02's check alike."""

from __future__ import annotations

import itertools
import math
from collections import Counter

from workshop_lib.engine.recorder import _and, _at, _of

Reads = dict[int, list[list[int]]]  # rank -> the indices read in each epoch, in order


def read_mistake(reads: Reads, n: int, epochs: int, what: str = "training molecules") -> tuple[str, str] | None:
    """(kind, what was measured) for the first thing wrong with what the ranks read; None if nothing."""
    world = len(reads)
    for rank, per_epoch in sorted(reads.items()):
        if len(per_epoch) < epochs:
            return "epochs", f"rank {rank} read the {what} in {len(per_epoch)} epoch(s), not {epochs}"
    share = math.ceil(n / world)
    for e in range(epochs):
        got = {r: reads[r][e] for r in sorted(reads)}
        counts = Counter(i for indices in got.values() for i in indices)
        whole = [r for r, indices in got.items() if len(set(indices)) >= n]
        if whole and world > 1:
            who = "every rank" if len(whole) == world else f"rank {whole[0]}"
            return "all", f"in epoch {e + 1} {who} read all {n} {what}"
        sizes = {len(indices) for indices in got.values()}
        padding = share * world - n if sizes == {share} else 0
        repeated = sum(c - 1 for c in counts.values() if c > 1)
        if repeated > padding:  # the pair of ranks that share the most
            a, b = max(itertools.combinations(sorted(got), 2), key=lambda p: len(set(got[p[0]]) & set(got[p[1]])))
            return "overlap", (f"in epoch {e + 1} ranks {_and([a, b])} read {len(set(got[a]) & set(got[b]))} of the "
                               f"same {what} (together {len(counts)} of {n})")
        dropped = world - 1 if sizes == {n // world} else 0  # drop_last=True leaves out fewer than one a rank
        if len(counts) < n - dropped:
            return "missing", f"in epoch {e + 1} the ranks read {len(counts)} of the {n} {what} together"
    for e in range(1, epochs):
        if all(reads[r][e] == reads[r][e - 1] for r in reads):
            return "same_order", f"epoch {e + 1} read the same {what} in the same order as epoch {e} on every rank"
    return None


def cause(kind: str, ranks: dict[int, list[dict]], split: str = "train", world: int | None = None) -> str:
    """Why, from the records of the samplers over ``split`` and the loader passes; '' if unknown (``kind``: what
    :func:`read_mistake` measured)."""
    world = world or len(ranks)
    made = {r: _of(ev, "sampler", split=split) for r, ev in ranks.items()}
    built = {r: m[-1] for r, m in made.items() if m}
    if not built:
        return ("no DistributedSampler was built over the data, so every rank's DataLoader reads all of it: give the "
                "DataLoader sampler=DistributedSampler(dataset)")
    first = next(iter(built.values()))
    for r, ev in sorted(ranks.items()):
        passes = _of(ev, "pass", split=split)
        if r in built and passes and passes[0]["sampler_id"] != built[r]["id"]:
            return (f"the DistributedSampler built at line {built[r]['line']} is not the one the DataLoader draws from "
                    f"(it draws from a {passes[0]['sampler']}): pass it as DataLoader(..., sampler=sampler), "
                    f"without shuffle=")
    replicas = {r: s["num_replicas"] for r, s in built.items()}
    if any(v != world for v in replicas.values()):
        r, v = next((r, v) for r, v in sorted(replicas.items()) if v != world)
        return (f"rank {r}'s DistributedSampler{_at(built[r])} splits the data into {v} shard(s) (num_replicas={v}), "
                f"but {world} ranks train: leave num_replicas out (the group's size) or pass dist.get_world_size()")
    by_rank: dict[int, list[int]] = {}
    for r, s in sorted(built.items()):
        by_rank.setdefault(s["rank"], []).append(r)
    for value, who in by_rank.items():
        if len(who) > 1:
            local = all(str(built[r].get("local_rank")) == str(value) for r in who)
            return (f"ranks {_and(who)} all built their DistributedSampler with rank={value}{_at(built[who[0]])}"
                    f"{', their local rank' if local else ''}: leave rank out (the group's rank) or pass "
                    f"dist.get_rank(); the local rank repeats on every node")
    seeds = {r: s["seed"] for r, s in built.items()}
    if len(set(seeds.values())) > 1:
        shown = ", ".join(f"rank {r}: {v}" for r, v in sorted(seeds.items()))
        return (f"the samplers' seeds differ ({shown}{', line ' + str(first['line']) if first.get('line') else ''}): "
                f"each rank shuffles the data its own way, so the shards overlap; give every rank the same seed")
    if kind != "same_order":
        return ""
    if not first["shuffle"]:
        return f"the DistributedSampler was built with shuffle=False{_at(first)}: pass shuffle=True"
    return _set_epoch_cause(ranks, split)


def _set_epoch_cause(ranks: dict[int, list[dict]], split: str) -> str:
    """Why the order repeated though the sampler shuffles: set_epoch never called, given the same number before each
    pass, or called only after the loader was read (from each set_epoch's argument and each pass's epoch)."""
    for _, ev in sorted(ranks.items()):
        if not _of(ev, "set_epoch", split=split):
            return ("sampler.set_epoch is never called; call train_loader.sampler.set_epoch(epoch) at the start of "
                    "every epoch, before the loader is read")
        last, before, passes = None, [], []  # the last set_epoch before each pass, and the passes
        for e in (e for e in ev if e["kind"] in ("set_epoch", "pass") and e.get("split") == split):
            if e["kind"] == "pass":
                passes.append(e)
                before.append(last)
            last = e if e["kind"] == "set_epoch" else last
        given = [c["epoch"] for c in before if c is not None]
        if len(given) == len(passes) and len(set(given)) < len(given):
            return (f"set_epoch was called with {', '.join(map(str, given))} in epochs "
                    f"{', '.join(str(k + 1) for k in range(len(given)))}{_at(before[-1])}: pass the epoch number, "
                    f"sampler.set_epoch(epoch)")
        late = next((p for e, p in enumerate(passes) if p.get("sampler_epoch") not in (None, e)), None)
        if late is not None:
            return (f"in epoch {passes.index(late) + 1} the loader{_at(late)} read the sampler while it was still set "
                    f"to epoch {late['sampler_epoch']}: call sampler.set_epoch(epoch) before the loader is read, not "
                    f"after")
    return ""
