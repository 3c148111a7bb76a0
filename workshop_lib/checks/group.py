"""The check of notebook 01's ``main``: the backend and device it picks, how it joins, that it always leaves.

Nothing is started: ``main`` runs in this process as a made-up rank 3 of 4 with
local rank 1 (2 processes a node), once on a node that pretends to have 2 GPUs
and once on a CPU, with ``torch.cuda.set_device``, ``init_process_group`` and
``destroy_process_group`` recorded instead of called, and the training replaced
by an error. The script checker (:mod:`workshop_lib.checks.script`) runs the same check
on a script's ``main``.
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

    def init(backend=None, **kw):
        seen["init"] = {"backend": backend, **kw}

    def joined(what):
        def get(group=None):
            if seen["init"] is None:
                raise ValueError("Default process group has not been initialized, please make sure to call "
                                 "init_process_group.")
            return seen["init"].get(what)
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


def process_group(main: Callable) -> None:
    """Step 1's ``main``: the backend and device it picks, how it joins, and that it always leaves the group."""
    for gpus in (True, False):
        seen = _run_main(main, gpus)
        where = "on a node with 2 GPUs" if gpus else "on a machine without GPUs"
        init = seen["init"]
        if init is None:
            raise CheckFailed("main never called dist.init_process_group: join the group after picking the device")
        want = "nccl" if gpus else "gloo"
        if init["backend"] != want:
            raise CheckFailed(f"{where} main joined with backend {init['backend']!r}: use {want!r} "
                              f"({'NCCL for CUDA tensors' if gpus else 'Gloo for CPU tensors'})")
        if init.get("rank") == 1:
            raise CheckFailed("as rank 3 of 4 (local rank 1) main joined with rank=1, its local rank: pass the "
                              "global rank (launch.rank); the local rank repeats on every node")
        if init.get("rank") != 3 or init.get("world_size") != 4:
            raise CheckFailed(f"as rank 3 of 4 main joined with rank={init.get('rank')}, world_size="
                              f"{init.get('world_size')}: pass the launch's rank and world size")
        if init.get("store") is None:
            raise CheckFailed("init_process_group got no store=: pass the rendezvous store, or plain `python` "
                              "(no MASTER_ADDR) cannot join")
        if init.get("timeout") is None:
            raise CheckFailed("init_process_group got no timeout=: pass cfg.timeout seconds (a timedelta), or a "
                              "rank waits for a dead peer for torch's default, many minutes")
        device = seen["env"].device if seen["env"] is not None else None
        calls = [_gpu_index(a) for a in seen["set_device"]]
        if gpus and calls != [1]:
            raise CheckFailed(f"as local rank 1 {where}, main called torch.cuda.set_device with {calls or 'nothing'}"
                              f"{': the global rank' if calls == [3] else ''}: make cuda:LOCAL_RANK this process's "
                              f"device")
        if gpus and device != torch.device("cuda", 1):
            raise CheckFailed(f"as local rank 1 {where}, main's device is {device}: use cuda:LOCAL_RANK")
        if not gpus and (calls or device != torch.device("cpu")):
            raise CheckFailed(f"{where} main picked {device} and called torch.cuda.set_device {len(calls)} "
                              f"time(s): stay on the CPU and call set_device only with GPUs")
        if seen["destroy"] != 1:
            raise CheckFailed(f"when the training raised, main called dist.destroy_process_group {seen['destroy']} "
                              f"time(s): call it once, in the finally of a try around the work")
    _passed("main: NCCL on cuda:1 as local rank 1 of a GPU node, Gloo on a CPU; joined as rank 3 of 4; "
            "left the group even when the training raised")


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


