"""``setup(timeout)`` as a made-up rank 3 of 4, local rank 1, once on a node faking 2 GPUs and once on a CPU, with
torchrun's variables set and ``set_device``/``init_process_group`` observed, not called: nothing is joined. Every
textbook form passes. Notebook 01's ``process_group``, and the script checker's :func:`on_a_gpu_node`."""

from __future__ import annotations

import ast
import contextlib
import io
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch

from workshop_lib.checks import torch_errors
from workshop_lib.checks.common import CheckFailed, _passed
from workshop_lib.debug.patching import patched
from workshop_lib.errors import first_line

RANK, LOCAL_RANK, WORLD, PER_NODE = 3, 1, 4, 2


def _fakes(seen: dict, gpus: bool) -> list[tuple[object, str, object]]:
    """(owner, name, fake) for what :func:`_run_setup` fakes: a node with ``gpus``, rank 3 of 4, nothing joined."""
    import torch.distributed as dist

    def init(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None, **kw):
        seen["init"] = {"backend": backend, "init_method": init_method, "timeout": timeout, "store": store,
                        "rank": rank, "world_size": world_size, **kw}
        if timeout is not None and not isinstance(timeout, timedelta):  # torch raises TypeError
            fix = torch_errors.explain("Expected timeout argument to be of type datetime.timedelta")
            raise CheckFailed(f"setup passed init_process_group timeout={timeout!r}, a {type(timeout).__name__}: torch "
                              f"raises TypeError there; {fix}")
        if store is not None and (rank in (None, -1) or world_size in (None, -1)):  # torch asserts the same
            raise CheckFailed("init_process_group got store= but not both rank= and world_size=: with a store torch "
                              "needs all three (without store=, under torchrun, it reads RANK and WORLD_SIZE itself)")
        seen["init"]["joined"] = _joined(seen["init"])  # now, while torchrun's variables are faked

    def joined(what):
        def get(group=None):
            if seen["init"] is None:
                raise ValueError("Default process group has not been initialized, please make sure to call "
                                 "init_process_group.")
            return seen["init"]["joined"][what]
        return get

    variables = {"RANK": RANK, "LOCAL_RANK": LOCAL_RANK, "WORLD_SIZE": WORLD, "LOCAL_WORLD_SIZE": PER_NODE,
                 "GROUP_RANK": RANK // PER_NODE, "MASTER_ADDR": "node0", "MASTER_PORT": 29500}
    return [(torch.cuda, "is_available", lambda: gpus), (torch.cuda, "device_count", lambda: 2 if gpus else 0),
            (torch.cuda, "set_device", seen["set_device"].append), (dist, "init_process_group", init),
            (dist, "is_initialized", lambda: seen["init"] is not None),
            (dist, "get_rank", joined("rank")), (dist, "get_world_size", joined("world_size")),
            *((os.environ, k, str(v)) for k, v in variables.items())]


def _joined(init: dict) -> dict:
    """The rank and world size torch would give this call: as passed, else (env://) RANK and WORLD_SIZE."""
    env = init.get("store") is None and init.get("init_method") in (None, "env://")

    def value(name: str, variable: str):
        given = init.get(name)
        if given is not None and given != -1:
            return given
        return int(os.environ[variable]) if env else None

    return {"rank": value("rank", "RANK"), "world_size": value("world_size", "WORLD_SIZE")}


def _run_setup(setup: Callable, gpus: bool) -> dict:
    """Call ``setup(30.0)`` as rank 3 of 4 (local rank 1, 2 a node), with ``gpus`` faked; what it called, returned."""
    seen: dict = {"set_device": [], "init": None, "device": None}
    with contextlib.ExitStack() as fakes:
        for owner, name, fake in _fakes(seen, gpus):
            fakes.enter_context(patched(owner, name, lambda _, fake=fake: fake))
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                seen["device"] = setup(30.0)
        except NotImplementedError:
            raise CheckFailed("setup still raises NotImplementedError: fill in its TODO and run its cell again") from None
        except CheckFailed:
            raise
        except Exception as err:  # the learner's error, said in one line
            raise CheckFailed(f"setup raised {type(err).__name__} {'on a node with 2 GPUs' if gpus else 'on a CPU'}: "
                              f"{first_line(err, 300)}") from None
    return seen


def _index(arg) -> int | None:
    if isinstance(arg, int):
        return arg
    try:
        return torch.device(arg).index
    except (RuntimeError, TypeError):
        return None


def _mistake(seen: dict, gpus: bool) -> str | None:
    """What is wrong with what setup did as rank 3 of 4 (local rank 1), or None."""
    where = "on a node with 2 GPUs" if gpus else "on a machine without GPUs"
    init = seen["init"]
    if init is None:
        return "setup never called dist.init_process_group: join the group that torchrun describes"
    want = "nccl" if gpus else "gloo"
    if init["backend"] not in (want, None):
        return (f"{where} setup joined with backend {init['backend']!r}: use {want!r} "
                f"({'NCCL for CUDA tensors' if gpus else 'Gloo for CPU tensors; NCCL needs GPUs'})")
    joined = init["joined"]
    if joined["rank"] == LOCAL_RANK:
        return (f"as rank {RANK} of {WORLD} (local rank {LOCAL_RANK}) setup joined with rank={LOCAL_RANK}, its local "
                f"rank: leave rank= out under torchrun (env:// reads RANK), or pass the global rank")
    if joined != {"rank": RANK, "world_size": WORLD}:
        return (f"as rank {RANK} of {WORLD} setup joined with rank={joined['rank']}, world_size={joined['world_size']}: "
                f"leave both out under torchrun (env:// reads RANK and WORLD_SIZE)")
    calls = [_index(a) for a in seen["set_device"]]
    device = seen["device"]
    if gpus and calls != [LOCAL_RANK]:
        what = "never called torch.cuda.set_device" if not calls else f"called torch.cuda.set_device with {calls}" + \
            (", the global rank" if calls == [RANK] else "")
        return (f"as local rank {LOCAL_RANK} {where}, setup {what}: make cuda:LOCAL_RANK this process's current "
                f"device (every process would use cuda:0 otherwise)")
    if gpus and device != torch.device("cuda", LOCAL_RANK):
        return f"as local rank {LOCAL_RANK} {where}, setup returned {device}: return cuda:LOCAL_RANK, its own GPU"
    if not gpus and (calls or device != torch.device("cpu")):
        return (f"{where} setup returned {device} and called torch.cuda.set_device {len(calls)} time(s): return the "
                f"CPU, and call set_device only with GPUs")
    device_id = init.get("device_id")
    if device_id is not None and (not gpus or _index(device_id) != LOCAL_RANK):
        global_rank = " (the global rank)" if _index(device_id) == RANK else ""
        return (f"{where}, as local rank {LOCAL_RANK}, setup passed device_id={device_id}{global_rank}: "
                + ("device_id is this process's own GPU, cuda:LOCAL_RANK" if gpus else "pass device_id= only on GPUs"))
    return None


def process_group(setup: Callable) -> None:
    """``setup(timeout) -> device``: the backend and device it picks, and how it joins, as rank 3 of 4 on GPUs and CPU."""
    for gpus in (True, False):
        seen = _run_setup(setup, gpus)
        mistake = _mistake(seen, gpus)
        if mistake:
            raise CheckFailed(mistake)
    notes = [] if seen["init"]["timeout"] is not None else \
        ["without timeout=, a rank waits torch's default (10 min on NCCL, 30 on Gloo) for a missing peer"]
    _passed(f"setup: NCCL on cuda:{LOCAL_RANK} as local rank {LOCAL_RANK} of a node with 2 GPUs, Gloo on a CPU; joined "
            f"as rank {RANK} of {WORLD} through torchrun's variables" + (f" (note: {notes[0]})" if notes else ""))


def on_a_gpu_node(path: Path) -> str | None:
    """What the CPU run cannot show: ``setup`` as rank 3 of 4, local rank 1, on a node with 2 GPUs (nothing joined)."""
    # The script's imports and definitions only: whatever else it does at import time does not run here.
    tree = ast.parse(path.read_text())
    tree.body = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.ClassDef)]
    names: dict = {"__name__": "learner_gpu_check", "__file__": str(path)}
    try:
        exec(compile(tree, str(path), "exec"), names)
    except Exception:  # an import the run has already judged
        return None
    if not callable(names.get("setup")):
        return None
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            process_group(names["setup"])
    except CheckFailed as err:
        return f"setup as a made-up rank 3 of 4 (nothing joined): {err}"
    return None
