"""``setup(timeout)`` first joined for real by 2 ranks on this machine, started as the script checker starts a
script (:mod:`runner`: torchrun's variables, the store hosted here, no GPU, so the CPU branch joins with Gloo); then,
for what a CPU cannot run, as a made-up rank 3 of 4, local rank 1, on a node faking 2 GPUs, ``set_device`` and
``init_process_group`` recorded in a :class:`~workshop_lib.engine.recorder.Recorder` (the one record), not called,
and judged from that record. The GPU node is faked the same way through ``torch.cuda`` and ``torch.accelerator``, so
the forms of torch's docs pass there (the device-agnostic one, a backend left out or given per device). Notebook 01's
``process_group``, and a row of the script checker's rule table (:func:`on_a_gpu_node`; its CPU run is the script's
own)"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import os
import shutil
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist

from workshop_lib.debug.launchenv import launch_variables
from workshop_lib.engine import runner, torch_errors
from workshop_lib.engine.common import CheckFailed, run_forked, said, verdict
from workshop_lib.engine.recorder import Recorder, _at, _of, call_name, recording, waiting_in

RANK, LOCAL_RANK, WORLD, PER_NODE = 3, 1, 4, 2  # the made-up GPU node's rank
TIMEOUT = 6.0  # the group timeout setup is given: a join that cannot complete raises there (2 forked ranks meet in
# well under a second)
LIMIT = 20.0  # seconds for the real run (a setup may not pass its timeout on)
REAL = f"in a real run of {runner.WORLD} ranks on this machine (torchrun's variables, no GPU)"


# ----------------------------------------------------------------------------- the real run, on this machine


def _real_rank(env, setup: Callable, port: int, folder: str) -> dict:
    """One rank: ``setup(TIMEOUT)`` recorded (also to a file, read if the run is stopped); how it joined."""
    rank = int(os.environ["RANK"])
    os.environ.update(runner.rank_env(rank, port))
    rec, device, end, given = Recorder(Path(folder, f"setup.rank{rank}")), None, None, None
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            with recording(rec):
                device = setup(TIMEOUT)
        except Exception as err:
            given = _given(rec.events, rank)
            end = said(err, "setup", given or _with_nccl(rec.events))
    rec.close()
    joined = dist.is_initialized() and end is None
    if dist.is_initialized():  # every rank in the group, setup's error or not: no barrier ends init_process_group
        with contextlib.suppress(Exception):  # (TORCH_DIST_INIT_BARRIER=0), and a rank that left at once could close
            dist.barrier()  # its Gloo pairs while another still connects them; a failed barrier hides no setup error
    return {"rank": rank, "end": end, "given": given, "device": str(device), "events": rec.events, "joined": joined,
            "as": (dist.get_rank(), dist.get_world_size()) if joined else None}


def _given(events: list[dict], rank: int) -> str | None:
    """A rank or world size given to init_process_group that torchrun's variables contradict."""
    init = next(iter(_of(events, "init", phase="enter")), {})
    for name, told in (("world_size", runner.WORLD), ("rank", rank)):
        if init.get(f"given_{name}") not in (None, -1, told):
            return (f"init_process_group was given {name}={init[f'given_{name}']}{_at(init)}, and torchrun started "
                    f"this rank with {name.upper()}={told}: leave {name}= out under torchrun (env:// reads "
                    f"{name.upper()})")
    return None


def _with_nccl(events: list[dict]) -> str | None:
    """A backend given per device, NCCL among them, where the join failed: init_process_group builds each one."""
    backend = next(iter(_of(events, "init", phase="enter")), {}).get("backend") or ""
    if ":" not in backend or "nccl" not in backend.lower():
        return None
    return (f"init_process_group builds every backend of {backend!r}, NCCL too, which needs GPUs and a torch built "
            f"with NCCL: where there is no GPU pass \"gloo\", or leave the backend out (torch picks the one of this "
            f"machine's accelerator, gloo where there is none)")


def _stuck(folder: str) -> str | None:
    """Where a rank of the stopped run waited, from its record (inside init_process_group), and why: a rank whose
    arguments contradict torchrun's variables first."""
    records = runner.Records(Path(folder, "setup"), runner.WORLD)
    records.update()
    waits = [(rank, waiting, _given(events, rank)) for rank, events in records.events.items()
             if (waiting := waiting_in(events)) is not None]
    if not waits:
        return None
    rank, waiting, why = min(waits, key=lambda w: w[2] is None)
    return (f"setup did not return within {LIMIT:g}s {REAL}: rank {rank} waits in {call_name(waiting)}{_at(waiting)}; "
            f"{why or 'a join completes once every rank has joined'}")


def _on_this_machine(setup: Callable) -> dict:
    """The real run: CheckFailed with the first thing it shows wrong, else rank 0's record."""
    store = dist.TCPStore("127.0.0.1", 0, runner.WORLD, is_master=True, wait_for_workers=False)  # torchrun's agent's
    folder = tempfile.mkdtemp(prefix="setup-")
    try:
        ranks = run_forked(_real_rank, runner.WORLD, setup, store.port, folder, timeout=LIMIT, backend=None,
                           name="setup", timed_out=lambda: _stuck(folder))
    finally:
        del store
        shutil.rmtree(folder, ignore_errors=True)
    for r in sorted(ranks, key=lambda r: r["given"] is None):  # a rank told what contradicts torchrun's first
        if r["end"]:
            raise CheckFailed(f"{r['end']} ({REAL}, rank {r['rank']})")
        if not r["joined"]:
            raise CheckFailed(f"setup never called dist.init_process_group ({REAL}): join the group that torchrun "
                              f"describes")
        if r["as"] != (r["rank"], runner.WORLD):
            raise CheckFailed(f"{REAL}, rank {r['rank']} joined as rank {r['as'][0]} of {r['as'][1]}: leave rank= "
                              f"and world_size= out under torchrun (env:// reads RANK and WORLD_SIZE)")
        if r["device"] != "cpu":
            raise CheckFailed(f"{REAL}, setup returned {r['device']}: return the CPU where there is no GPU")
    return ranks[0]


# ----------------------------------------------------------------------------- the made-up GPU node


def _fakes(rec: Recorder) -> tuple[dict, list[tuple[object, str, object]]]:
    """torchrun's variables, and (owner, name, fake) for what :func:`_on_a_gpu_node` fakes: a node with 2 GPUs seen the
    same way through ``torch.cuda`` and ``torch.accelerator``, rank 3 of 4, nothing joined. The fakes keep no state of
    their own: set_device writes to ``rec``, the record that :func:`~workshop_lib.engine.recorder.recording` also
    keeps of init_process_group, and what they answer is read from it."""
    def init(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None, **kw):
        if timeout is not None and not isinstance(timeout, timedelta):  # torch raises TypeError
            fix = torch_errors.explain("Expected timeout argument to be of type datetime.timedelta")
            raise CheckFailed(f"setup passed init_process_group timeout={timeout!r}, a {type(timeout).__name__}: torch "
                              f"raises TypeError there; {fix}")
        if store is not None and (rank in (None, -1) or world_size in (None, -1)):  # torch asserts the same
            raise CheckFailed("init_process_group got store= but not both rank= and world_size=: with a store torch "
                              "needs all three (without store=, under torchrun, it reads RANK and WORLD_SIZE itself)")

    def joined(what):  # as torch would answer once joined: the arguments recorded, else (env://) torchrun's variables
        def get(group=None):
            init = next(iter(_of(rec.events, "init", phase="enter")[-1:]), None)
            if init is None:
                raise ValueError("Default process group has not been initialized, please make sure to call "
                                 "init_process_group.")
            given = init.get(f"given_{what}")
            env = not init["store"] and init.get("given_init_method") in (None, "env://")
            return given if given not in (None, -1) else int(os.environ[what.upper()]) if env else None
        return get

    def set_device(device) -> None:
        rec.add("set_device", index=_index(device))

    def current() -> int:  # the index set last, as torch.cuda.current_device() would say
        calls = _of(rec.events, "set_device")
        return calls[-1]["index"] if calls and calls[-1]["index"] is not None else 0

    variables = launch_variables(RANK, WORLD, PER_NODE, MASTER_ADDR="node0", MASTER_PORT=29500)
    fakes = [(torch.cuda, "is_available", lambda: True), (torch.cuda, "device_count", lambda: 2),
             (torch.cuda, "set_device", set_device), (torch.cuda, "current_device", current),
             (torch.accelerator, "is_available", lambda: True), (torch.accelerator, "device_count", lambda: 2),
             (torch.accelerator, "current_accelerator", lambda check_available=False: torch.device("cuda")),
             (torch.accelerator, "set_device_index", set_device), (torch.accelerator, "set_device_idx", set_device),
             (torch.accelerator, "current_device_index", current),
             (dist, "init_process_group", init), (dist, "get_rank", joined("rank")),
             (dist, "is_initialized", lambda: bool(_of(rec.events, "init", phase="exit"))),
             (dist, "get_world_size", joined("world_size"))]
    return variables, [f for f in fakes if hasattr(f[0], f[1])]


def _on_a_gpu_node(setup: Callable) -> tuple[str | None, list[dict]]:
    """``setup(TIMEOUT)`` as rank 3 of 4 (local rank 1, 2 a node) with 2 GPUs faked, recorded as a real rank is: what
    is wrong there (:func:`_mistake`, else None), and the record."""
    rec = Recorder()
    variables, faked = _fakes(rec)
    with contextlib.ExitStack() as fakes:
        fakes.enter_context(mock.patch.dict(os.environ, variables))
        for owner, name, fake in faked:
            fakes.enter_context(mock.patch.object(owner, name, fake))
        try:
            with contextlib.redirect_stdout(io.StringIO()), recording(rec):  # observes the fakes as it observes torch
                device = setup(TIMEOUT)
        except CheckFailed as err:
            return str(err), rec.events
        except Exception as err:  # the learner's error, said in one line
            return f"on a made-up node with 2 GPUs, {said(err, 'setup')}", rec.events
    return _mistake(rec.events, device), rec.events


def _index(arg) -> int | None:
    if isinstance(arg, int) or (isinstance(arg, str) and arg.isdigit()):
        return int(arg)
    try:
        return torch.device(arg).index
    except (RuntimeError, TypeError):
        return None


def _gpu_backend(backend) -> str | None:
    """The backend that ``init_process_group(backend)`` uses for cuda tensors: None when left out (torch picks the
    device's), the cuda entry of a ``"cpu:gloo,cuda:nccl"`` string ("none" where it has none), else the one named."""
    text = None if backend in (None, "None") else str(backend).lower()
    if not text or ":" not in text:
        return text
    return dict(part.strip().split(":", 1) for part in text.split(",") if ":" in part).get("cuda", "none")


def _mistake(events: list[dict], device) -> str | None:
    """What is wrong with what setup did, read from its record, as rank 3 of 4 (local rank 1) on a node with 2 GPUs
    (``device``: what it returned), or None."""
    where = "on a node with 2 GPUs"
    init, joined = (next(iter(_of(events, "init", phase=phase)), None) for phase in ("enter", "exit"))
    if init is None or joined is None:
        return "setup never called dist.init_process_group: join the group that torchrun describes"
    if _gpu_backend(init["backend"]) not in ("nccl", None):
        return (f"{where} setup joined with backend {init['backend']!r}, which has no nccl for cuda tensors: join "
                f"with the backend for the device, dist.get_default_backend_for_device(device) (nccl on a GPU, gloo "
                f"on a CPU), or leave the backend out")
    if joined["rank"] == LOCAL_RANK:
        return (f"as rank {RANK} of {WORLD} (local rank {LOCAL_RANK}) setup joined with rank={LOCAL_RANK}, its local "
                f"rank: leave rank= out under torchrun (env:// reads RANK), or pass the global rank")
    if (joined["rank"], joined["world_size"]) != (RANK, WORLD):
        return (f"as rank {RANK} of {WORLD} setup joined with rank={joined['rank']}, world_size={joined['world_size']}: "
                f"leave both out under torchrun (env:// reads RANK and WORLD_SIZE)")
    calls = [e["index"] for e in _of(events, "set_device")]
    if calls != [LOCAL_RANK]:
        what = "never called torch.cuda.set_device" if not calls else f"called torch.cuda.set_device with {calls}" + \
            (", the global rank" if calls == [RANK] else "")
        return (f"as local rank {LOCAL_RANK} {where}, setup {what}: make cuda:LOCAL_RANK this process's current "
                f"device, torch.cuda.set_device or torch.accelerator.set_device_index (every process would use cuda:0 "
                f"otherwise)")
    if device != torch.device("cuda", LOCAL_RANK):
        return f"as local rank {LOCAL_RANK} {where}, setup returned {device}: return cuda:LOCAL_RANK, its own GPU"
    device_id = init.get("given_device_id")
    if device_id not in (None, "None") and _index(device_id) != LOCAL_RANK:
        global_rank = " (the global rank)" if _index(device_id) == RANK else ""
        return (f"{where}, as local rank {LOCAL_RANK}, setup passed device_id={device_id}{global_rank}: device_id is "
                f"this process's own GPU, cuda:LOCAL_RANK")
    return None


def process_group(setup: Callable) -> None:
    """``setup(timeout) -> device``: joined for real by 2 ranks on this machine, then the backend and device it picks,
    and how it joins, as rank 3 of 4 on a made-up node with 2 GPUs."""
    real = _on_this_machine(setup)
    mistake, events = _on_a_gpu_node(setup)
    device_id = next(iter(_of(events, "init", phase="enter")), {}).get("given_device_id")
    notes = [f"{f'device_id={device_id} given' if device_id not in (None, 'None') else 'no device_id'} (optional: with "
             f"it NCCL connects at init_process_group, so a bad GPU shows there rather than at the first collective)"]
    if not any(e.get("timeout") for e in _of(real["events"], "init", phase="enter")):
        notes.append("without timeout=, a rank waits torch's default (10 min on NCCL, 30 on Gloo) for a missing peer")
    verdict(mistake, f"setup: NCCL on cuda:{LOCAL_RANK} as local rank {LOCAL_RANK} of a node with 2 GPUs, Gloo on a "
                     f"CPU; joined as rank {RANK} of {WORLD} through torchrun's variables; " + "; ".join(notes))


@functools.lru_cache(maxsize=4)
def on_a_gpu_node(source: str, name: str) -> tuple[str | None, str | None]:
    """The rule table's row of what a CPU run cannot show (a step's ``source``): its ``setup`` as rank 3 of 4, local
    rank 1, on a node with 2 GPUs, nothing joined, from the script's imports and definitions alone (whatever else it
    does at import time does not run here). (the ✓'s claim where setup ran, the mistake): both None where the script
    has no ``setup`` or its imports fail (the run has judged those)."""
    tree = ast.parse(source)
    tree.body = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.ClassDef)]
    names: dict = {"__name__": "learner_gpu_check", "__file__": name}
    try:
        exec(compile(tree, name, "exec"), names)
    except Exception:
        return None, None
    if not callable(names.get("setup")):
        return None, None
    mistake = _on_a_gpu_node(names["setup"])[0]
    return (f"as rank {RANK} of {WORLD} on a made-up node with 2 GPUs, setup chose NCCL on cuda:{LOCAL_RANK}",
            mistake and f"setup as a made-up rank {RANK} of {WORLD} (nothing joined): {mistake}")
