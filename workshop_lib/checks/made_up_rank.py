"""``setup(timeout)`` as a made-up rank 3 of 4, local rank 1, once on a node faking 2 GPUs and once on a CPU, with
torchrun's variables set and ``set_device``/``init_process_group`` observed, not called: nothing is joined. The GPU
node is faked the same way through ``torch.cuda`` and ``torch.accelerator``, so every form of torch's docs passes
(the device-agnostic one, a backend left out or given per device). Notebook 01's ``process_group``, and the script
checker's :func:`on_a_gpu_node`."""

from __future__ import annotations

import ast
import contextlib
import io
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist

from workshop_lib.checks import torch_errors
from workshop_lib.checks.common import CheckFailed, _passed, still_todo
from workshop_lib.debug.launchenv import launch_variables
from workshop_lib.errors import first_line

RANK, LOCAL_RANK, WORLD, PER_NODE = 3, 1, 4, 2


def _fakes(seen: dict, gpus: bool) -> tuple[dict, list[tuple[object, str, object]]]:
    """torchrun's variables, and (owner, name, fake) for what :func:`_run_setup` fakes: a node with ``gpus`` seen the
    same way through ``torch.cuda`` and ``torch.accelerator``, rank 3 of 4, nothing joined."""
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

    def current() -> int:  # the index set last, as torch.cuda.current_device() would say
        calls = [_index(a) for a in seen["set_device"]]
        return calls[-1] if calls and calls[-1] is not None else 0

    variables = launch_variables(RANK, WORLD, PER_NODE, MASTER_ADDR="node0", MASTER_PORT=29500)
    count, accelerator = (2, torch.device("cuda")) if gpus else (0, None)
    fakes = [(torch.cuda, "is_available", lambda: gpus), (torch.cuda, "device_count", lambda: count),
             (torch.cuda, "set_device", seen["set_device"].append), (torch.cuda, "current_device", current),
             (torch.accelerator, "is_available", lambda: gpus), (torch.accelerator, "device_count", lambda: count),
             (torch.accelerator, "current_accelerator", lambda check_available=False: accelerator),
             (torch.accelerator, "set_device_index", seen["set_device"].append),
             (torch.accelerator, "set_device_idx", seen["set_device"].append),
             (torch.accelerator, "current_device_index", current),
             (dist, "init_process_group", init), (dist, "is_initialized", lambda: seen["init"] is not None),
             (dist, "get_rank", joined("rank")), (dist, "get_world_size", joined("world_size"))]
    return variables, [f for f in fakes if hasattr(f[0], f[1])]


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
    variables, faked = _fakes(seen, gpus)
    with contextlib.ExitStack() as fakes:
        fakes.enter_context(mock.patch.dict(os.environ, variables))
        for owner, name, fake in faked:
            fakes.enter_context(mock.patch.object(owner, name, fake))
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                seen["device"] = setup(30.0)
        except NotImplementedError:
            raise CheckFailed(still_todo("setup")) from None
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


def _backend_for(backend, kind: str) -> str | None:
    """The backend that ``init_process_group(backend)`` uses for ``kind`` tensors: None when left out (torch picks
    the device's), the entry for ``kind`` of a ``"cpu:gloo,cuda:nccl"`` string, else the one named."""
    if backend is None:
        return None
    text = str(backend).lower()
    if ":" not in text:
        return text
    pairs = dict(part.strip().split(":", 1) for part in text.split(",") if ":" in part)
    return pairs.get(kind, "none")


def _mistake(seen: dict, gpus: bool) -> str | None:
    """What is wrong with what setup did as rank 3 of 4 (local rank 1), or None."""
    where = "on a node with 2 GPUs" if gpus else "on a machine without GPUs"
    init = seen["init"]
    if init is None:
        return "setup never called dist.init_process_group: join the group that torchrun describes"
    kind = "cuda" if gpus else "cpu"
    backend = _backend_for(init["backend"], kind)
    want = dist.get_default_backend_for_device(kind)
    if backend not in (want, None):
        return (f"{where} setup joined with backend {init['backend']!r}, which has no {want} for {kind} tensors: join "
                f"with the backend for the device, dist.get_default_backend_for_device(device) (nccl on a GPU, gloo "
                f"on a CPU), or leave the backend out")
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
                f"device, torch.cuda.set_device or torch.accelerator.set_device_index (every process would use cuda:0 "
                f"otherwise)")
    if gpus and device != torch.device("cuda", LOCAL_RANK):
        return f"as local rank {LOCAL_RANK} {where}, setup returned {device}: return cuda:LOCAL_RANK, its own GPU"
    if not gpus and (calls or device != torch.device("cpu")):
        return (f"{where} setup returned {device} and called torch.cuda.set_device {len(calls)} time(s): return the "
                f"CPU, and call set_device only with GPUs")
    device_id = init.get("device_id")
    cpu_device = not gpus and isinstance(device_id, torch.device) and device_id.type == "cpu"  # torch accepts it
    if device_id is not None and not cpu_device and (not gpus or _index(device_id) != LOCAL_RANK):
        global_rank = " (the global rank)" if _index(device_id) == RANK else ""
        return (f"{where}, as local rank {LOCAL_RANK}, setup passed device_id={device_id}{global_rank}: "
                + ("device_id is this process's own GPU, cuda:LOCAL_RANK" if gpus else "pass device_id= only on GPUs"))
    return None


def process_group(setup: Callable) -> None:
    """``setup(timeout) -> device``: the backend and device it picks, and how it joins, as rank 3 of 4 on GPUs and CPU."""
    seen = {}
    for gpus in (True, False):
        seen[gpus] = _run_setup(setup, gpus)
        mistake = _mistake(seen[gpus], gpus)
        if mistake:
            raise CheckFailed(mistake)
    device_id = seen[True]["init"].get("device_id")
    given = f"device_id={_index(device_id) if isinstance(device_id, int) else device_id} given" \
        if device_id is not None else "no device_id"
    notes = [f"{given} (optional: with it NCCL connects at init_process_group, so a bad GPU shows there rather "
             f"than at the first collective)"]
    if seen[False]["init"]["timeout"] is None:
        notes.append("without timeout=, a rank waits torch's default (10 min on NCCL, 30 on Gloo) for a missing peer")
    _passed(f"setup: NCCL on cuda:{LOCAL_RANK} as local rank {LOCAL_RANK} of a node with 2 GPUs, Gloo on a CPU; joined "
            f"as rank {RANK} of {WORLD} through torchrun's variables; " + "; ".join(notes))


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
