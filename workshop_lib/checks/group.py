"""The check of notebook 01's ``main``: the backend and device it picks, how it joins, that it always leaves.

Nothing is started: ``main`` runs in this process as a made-up rank 3 of 4 with
local rank 1 (2 processes a node, torchrun's variables set), once on a node that
pretends to have 2 GPUs and once on a CPU, with ``torch.cuda.set_device``,
``init_process_group`` and ``destroy_process_group`` recorded instead of called,
and the training replaced by an error. Both ways of joining pass: the standard
``init_process_group(backend)``, where torch reads RANK and WORLD_SIZE itself
(env://), and ``store=`` with ``rank=`` and ``world_size=``; ``device_id=``, if
given, must be this process's GPU. The script checker
(:mod:`workshop_lib.checks.script`) runs the same check on a script's ``main``.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable

import torch

from workshop_lib.checks import record
from workshop_lib.checks.common import HANG_AFTER, CheckFailed, _passed, run_forked
from workshop_lib.debug import collectives
from workshop_lib.debug.patching import patched
from workshop_lib.distributed import DistEnv
from workshop_lib.errors import first_line


class _Stop(Exception):
    """Raised in place of the training: main's work failed; did it leave the group?"""


def _fakes(seen: dict, gpus: bool) -> list[tuple[object, str, Callable]]:
    """(owner, name, make) for each call that :func:`_run_main` fakes: a node with ``gpus``, rank 3 of 4, nothing joined."""
    import os

    import torch.distributed as dist

    from workshop_lib import distributed

    def init(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None, **kw):
        seen["init"] = {"backend": backend, "init_method": init_method, "timeout": timeout, "store": store,
                        "rank": rank, "world_size": world_size, **kw}
        if store is not None and (rank in (None, -1) or world_size in (None, -1)):  # torch asserts the same
            raise CheckFailed("init_process_group got store= but not both rank= and world_size=: with a store torch "
                              "needs all three (without store=, it reads RANK and WORLD_SIZE from torchrun's "
                              "environment)")
        seen["init"]["joined"] = _joined(seen["init"])  # now, while torchrun's variables are faked

    def joined(what):
        def get(group=None):
            if seen["init"] is None:
                raise ValueError("Default process group has not been initialized, please make sure to call "
                                 "init_process_group.")
            return seen["init"]["joined"][what]
        return get

    fakes = [(torch.cuda, "is_available", lambda: gpus), (torch.cuda, "device_count", lambda: 2),
             (torch.cuda, "set_device", seen["set_device"].append), (dist, "init_process_group", init),
             (dist, "get_rank", joined("rank")), (dist, "get_world_size", joined("world_size")),
             (dist, "destroy_process_group", lambda *a, **kw: seen.update(destroy=seen["destroy"] + 1)),
             (distributed, "rendezvous_store", lambda *a, **kw: dist.HashStore()),
             (distributed, "set_threads", lambda *a, **kw: None),
             *((os.environ, k, v) for k, v in (("RANK", "3"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "4"),
                                                ("LOCAL_WORLD_SIZE", "2")))]
    return [(owner, name, lambda _, fake=fake: fake) for owner, name, fake in fakes]


def _env_join(init: dict) -> bool:
    """Does this init_process_group call read torchrun's variables (env://, the default without store=)?"""
    return init.get("store") is None and init.get("init_method") in (None, "env://")


def _joined(init: dict) -> dict:
    """The rank and world size torch would give this call: as passed, else (env://) RANK and WORLD_SIZE."""
    import os

    def value(name: str, variable: str):
        given = init.get(name)
        if given is not None and given != -1:
            return given
        return int(os.environ[variable]) if _env_join(init) else None

    return {"rank": value("rank", "RANK"), "world_size": value("world_size", "WORLD_SIZE")}


def _run_main(main: Callable, gpus: bool) -> dict:
    """Call ``main`` as rank 3 of 4 (local rank 1, 2 per node), with ``gpus`` faked; record what it called."""
    seen: dict = {"set_device": [], "init": None, "destroy": 0, "env": None}

    def work(cfg, env):
        seen["env"] = env
        raise _Stop

    names = main.__globals__
    with contextlib.ExitStack() as patches:
        for owner, name, make in _fakes(seen, gpus):
            patches.enter_context(patched(owner, name, make))
        patches.enter_context(patched(names, "train", lambda _: work))
        patches.enter_context(patched(names, "check_all_reduce", lambda _: lambda env: None))
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                main(["--limit", "50"])
        except _Stop:
            pass
        except NotImplementedError:
            raise CheckFailed("main still raises NotImplementedError: fill in its TODOs and run its cell again") from None
        except (ValueError, RuntimeError) as err:
            if "not been initialized" not in str(err):
                raise CheckFailed(f"main raised {type(err).__name__}: {first_line(err, 10_000)}") from None
    return seen


def _gpu_index(arg) -> int | None:
    return arg if isinstance(arg, int) else torch.device(arg).index


def _join_mistake(init: dict | None, gpus: bool) -> str | None:
    """What is wrong with main's init_process_group call as rank 3 of 4 (local rank 1), or None."""
    where = "on a node with 2 GPUs" if gpus else "on a machine without GPUs"
    if init is None:
        return "main never called dist.init_process_group: join the group after picking the device"
    want = "nccl" if gpus else "gloo"
    if init["backend"] != want:
        return (f"{where} main joined with backend {init['backend']!r}: use {want!r} "
                f"({'NCCL for CUDA tensors' if gpus else 'Gloo for CPU tensors'})")
    joined = init["joined"]
    if joined["rank"] == 1:
        return ("as rank 3 of 4 (local rank 1) main joined with rank=1, its local rank: pass the global rank "
                "(launch.rank), or leave rank= out under torchrun; the local rank repeats on every node")
    if joined != {"rank": 3, "world_size": 4}:
        return (f"as rank 3 of 4 main joined with rank={joined['rank']}, world_size={joined['world_size']}: pass "
                f"the launch's rank and world size, or leave both out under torchrun")
    device_id = init.get("device_id")
    if device_id is not None and (not gpus or _gpu_index(device_id) != 1):
        return (f"{where}, as local rank 1, main passed device_id={device_id!r}: "
                + ("device_id is this process's own GPU, cuda:LOCAL_RANK" if gpus else "pass device_id= only with GPUs"))
    return None


def _device_mistake(seen: dict, gpus: bool) -> str | None:
    """What is wrong with the device main picked and made current as local rank 1, or None."""
    where = "on a node with 2 GPUs" if gpus else "on a machine without GPUs"
    device = seen["env"].device if seen["env"] is not None else None
    calls = [_gpu_index(a) for a in seen["set_device"]]
    if gpus and calls != [1]:
        return (f"as local rank 1 {where}, main called torch.cuda.set_device with {calls or 'nothing'}"
                f"{': the global rank' if calls == [3] else ''}: make cuda:LOCAL_RANK this process's device")
    if gpus and device != torch.device("cuda", 1):
        return f"as local rank 1 {where}, main's device is {device}: use cuda:LOCAL_RANK"
    if not gpus and (calls or device != torch.device("cpu")):
        return (f"{where} main picked {device} and called torch.cuda.set_device {len(calls)} time(s): stay on the "
                f"CPU and call set_device only with GPUs")
    return None


def process_group(main: Callable) -> None:
    """Step 1's ``main``: the backend and device it picks, how it joins, and that it always leaves the group."""
    for gpus in (True, False):
        seen = _run_main(main, gpus)
        mistake = _join_mistake(seen["init"], gpus) or _device_mistake(seen, gpus)
        if mistake:
            raise CheckFailed(mistake)
        if seen["destroy"] != 1:
            raise CheckFailed(f"when the training raised, main called dist.destroy_process_group {seen['destroy']} "
                              f"time(s): call it once, in the finally of a try around the work")
    how = "through torchrun's variables (env://)" if _env_join(seen["init"]) else "on the store"
    notes = []
    if _env_join(seen["init"]):
        notes.append("plain `python` (no RANK to read) and torchrun's restarts (the dead round's keys) need the "
                     "store= form")
    if seen["init"]["timeout"] is None:
        notes.append("without timeout=, a rank waits torch's default (30 min on Gloo) for a missing peer")
    _passed(f"main: NCCL on cuda:1 as local rank 1 of a GPU node, Gloo on a CPU; joined as rank 3 of 4 {how}; "
            f"left the group even when the training raised" + (f" (note: {'; '.join(notes)})" if notes else ""))


def _record_all_reduce(env: DistEnv, fn: Callable) -> dict:
    """On one rank: run ``fn(env)`` while recording every dist.all_reduce call (what it held before and after)."""
    rec = record.Recorder()
    try:
        with collectives.observing(record.Collectives(rec)):
            fn(env)
        outcome = "ok"
    except NotImplementedError:
        outcome = "todo"
    except AssertionError as err:
        outcome = f"assert: {err}"
    except RuntimeError as err:  # a peer left while this rank waited in a collective
        outcome = f"error: {first_line(err)}"
    calls = []
    for e in rec.events:
        if e.get("name") == "all_reduce" and e["phase"] == "enter":
            calls.append({"before": e["before"], "op": e["op"] or "SUM", "after": None})  # SUM: the default op
        elif e.get("name") == "all_reduce":
            calls[-1]["after"] = e["after"]
    return {"rank": env.rank, "outcome": outcome, "calls": calls}


def all_reduce(fn: Callable, nprocs: int = 2, timeout: float = 30) -> None:
    """Run ``fn(env)`` on ``nprocs`` ranks; it must all_reduce(rank + 1) with SUM and see 1 + ... + N."""
    ranks = run_forked(_record_all_reduce, nprocs, fn, timeout=timeout, hang_after=min(HANG_AFTER, timeout / 2),
                         fix="every rank must call dist.all_reduce")
    expected = nprocs * (nprocs + 1) / 2
    if any(r["outcome"] == "todo" for r in ranks):
        raise CheckFailed(f"{fn.__name__} still raises NotImplementedError: fill in its TODO and run its cell again")
    silent = [r["rank"] for r in ranks if not r["calls"]]
    if len(silent) == nprocs:
        raise CheckFailed("no rank called dist.all_reduce: call it on a tensor holding env.rank + 1")
    if silent:
        raise CheckFailed(f"rank {silent[0]} never called dist.all_reduce while other ranks did: every rank must "
                          f"call every collective, or the others wait for it (and fail when it leaves)")
    for r in ranks:
        call = r["calls"][0]
        if call["op"] != "SUM":
            raise CheckFailed(f"rank {r['rank']} used op={call['op']}: summing needs op=dist.ReduceOp.SUM (the default)")
        if call["before"] != [r["rank"] + 1.0]:
            raise CheckFailed(f"rank {r['rank']} contributed {call['before']}, expected [{r['rank'] + 1.0}]: "
                              f"start from torch.tensor([env.rank + 1.0])")
        if call["after"] != [expected]:
            raise CheckFailed(f"rank {r['rank']} holds {call['after']} after all_reduce, expected [{expected}]")
        if r["outcome"] != "ok":
            raise CheckFailed(f"rank {r['rank']}: {r['outcome']}")
    _passed(f"{fn.__name__}: each of {nprocs} ranks contributed rank + 1, all_reduce(SUM) left {expected:g} on every rank")


