"""Distributed state: the one place that reads torchrun's environment.

torchrun starts one process per rank and tells each who it is through
environment variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...).
:func:`read_launch_env` is the only function in the project that reads them;
everything else receives a :class:`DistEnv`.

Under plain ``python`` there is no torchrun; :func:`setup` then makes a
process group of one (rank 0, world size 1) on an in-memory store, so the same
script, DDP wrapper included, runs unchanged with no network port.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from workshop_lib.errors import WorkshopError


@dataclass(frozen=True)
class LaunchEnv:
    """What torchrun (or nothing, under plain python) put in the environment."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    restart_count: int = 0  # how often torchrun restarted this group
    agent_store: bool = False  # torchrun's agent hosts the TCP store
    under_torchrun: bool = False
    omp_threads: int | None = None  # OMP_NUM_THREADS, if the user or torchrun set it


@dataclass(frozen=True)
class DistEnv:
    """Who this process is in the job, and where its tensors live."""

    rank: int  # global rank, 0 .. world_size-1, unique across all nodes
    local_rank: int  # rank on this node; picks the GPU
    world_size: int  # processes in the job, all nodes together
    local_world_size: int  # processes on this node
    device: torch.device  # cuda:LOCAL_RANK with GPUs, else cpu
    backend: str  # "nccl" (GPUs) or "gloo" (CPU)

    @property
    def is_main(self) -> bool:
        """Global rank 0: the one process that logs and writes files."""
        return self.rank == 0

    def describe(self) -> str:
        return (f"rank {self.rank}/{self.world_size} (local {self.local_rank}/{self.local_world_size}) "
                f"backend={self.backend} device={self.device} threads={torch.get_num_threads()}")


def read_launch_env(environ: dict[str, str] | None = None) -> LaunchEnv:
    """Parse torchrun's variables; an absent WORLD_SIZE means plain python, a world of one."""
    env = os.environ if environ is None else environ
    omp = env.get("OMP_NUM_THREADS")
    if "WORLD_SIZE" not in env:
        return LaunchEnv(omp_threads=int(omp) if omp else None)
    try:
        return LaunchEnv(
            rank=int(env["RANK"]),
            local_rank=int(env.get("LOCAL_RANK", env["RANK"])),
            world_size=int(env["WORLD_SIZE"]),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", "29500")),
            restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
            under_torchrun="TORCHELASTIC_RUN_ID" in env,
            omp_threads=int(omp) if omp else None,
        )
    except (KeyError, ValueError) as err:
        raise WorkshopError(f"incomplete torchrun environment ({err}); launch with torchrun, or unset WORLD_SIZE") from None


def rank_label() -> str:
    """'[rank N] ' in a multi-process job, '' otherwise: a prefix for messages."""
    launch = read_launch_env()
    return f"[rank {launch.rank}] " if launch.world_size > 1 else ""


def _pick_backend(requested: str | None, launch: LaunchEnv) -> tuple[str, torch.device]:
    has_cuda = torch.cuda.is_available()
    backend = requested or ("nccl" if has_cuda else "gloo")
    if backend == "nccl":
        if not has_cuda:
            raise WorkshopError("--backend nccl needs CUDA GPUs and none is visible; use --backend gloo or leave it out")
        n_gpus = torch.cuda.device_count()
        # Every rank checks the node's process count, so they all refuse, not just the ones without a GPU.
        if max(launch.local_world_size, launch.local_rank + 1) > n_gpus:
            raise WorkshopError(f"--nproc_per_node={launch.local_world_size} is more than the {n_gpus} GPU(s) on "
                                f"this node; use --nproc_per_node={n_gpus} or fewer (or --backend gloo for CPU)")
        return backend, torch.device("cuda", launch.local_rank)
    return backend, torch.device("cpu")


def _set_threads(launch: LaunchEnv, device: torch.device) -> None:
    """On CPU, give each rank its share of the cores instead of letting them fight."""
    if device.type != "cpu":
        return
    cores = os.cpu_count() or 1
    if launch.local_world_size > cores and launch.local_rank == 0:  # one line, from one rank per node
        print(f"warning: --nproc_per_node={launch.local_world_size} is more than the {cores} CPU cores: ranks "
              f"will share cores and run slower; use --nproc_per_node={cores} or fewer", file=sys.stderr, flush=True)
    if launch.omp_threads is not None:
        torch.set_num_threads(launch.omp_threads)
    elif launch.world_size > 1:
        torch.set_num_threads(max(1, cores // launch.local_world_size))


def _store(launch: LaunchEnv, timeout: timedelta) -> dist.Store:
    """The rendezvous store for init_process_group, namespaced per torchrun restart.

    After torchrun restarts a failed group, its agent's TCP store still holds the
    dead round's keys, and gloo's connectFullMesh would wait on them forever
    (pytorch/pytorch#135712). A prefix per restart gives each round fresh keys.
    """
    if not launch.under_torchrun and launch.world_size == 1:
        return dist.HashStore()  # plain python: a group of one, no network port
    tcp = dist.TCPStore(launch.master_addr, launch.master_port, launch.world_size,
                        is_master=launch.rank == 0 and not launch.agent_store,
                        timeout=timeout, wait_for_workers=False)
    return dist.PrefixStore(f"workshop/restart{launch.restart_count}", tcp)


# Set by setup(), read by teardown(): where a failing rank leaves its reason for the others.
_job: dict = {}
_LINGER = 2.0  # seconds a rank that lost its peers waits, so torchrun sees the rank that failed first


def setup(backend: str | None = None, timeout: float = 120.0) -> DistEnv:
    """Join the process group torchrun prepared (or a group of one) and return who we are."""
    launch = read_launch_env()
    backend, device = _pick_backend(backend, launch)
    _set_threads(launch, device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    wait = timedelta(seconds=timeout)
    try:
        store = _store(launch, wait)
        dist.init_process_group(backend, store=store, rank=launch.rank, world_size=launch.world_size, timeout=wait)
    except (RuntimeError, dist.DistStoreError) as err:
        first = _first_line(err)
        if "EADDRINUSE" in first:
            raise WorkshopError(f"port {launch.master_port} is already in use (another job?); launch with another "
                                f"--master-port, or with torchrun --standalone, which picks a free one") from None
        raise WorkshopError(f"could not join the process group at {launch.master_addr}:{launch.master_port} "
                            f"within {timeout:g}s ({first}); check that every rank started and the port is free") from None
    _job.update(store=store, rank=launch.rank, world_size=launch.world_size, timeout=timeout)
    return DistEnv(launch.rank, launch.local_rank, launch.world_size, launch.local_world_size, device, backend)


def _lost_peers(err: BaseException) -> bool:
    """Did a collective fail because another rank died, left or hangs (not because of this rank)?"""
    return isinstance(err, dist.DistError) or (isinstance(err, RuntimeError) and "gloo" in str(err))


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0][:200] or type(err).__name__


def _explain_failure(err: BaseException) -> str | None:
    """Leave this rank's reason in the store, or read the reason a failed peer left there.

    Returns the one-line message for a rank whose collective broke, else None.
    """
    store, rank, world_size = _job["store"], _job["rank"], _job["world_size"]
    if not _lost_peers(err):
        with contextlib.suppress(Exception):  # a dead store must not hide the original error
            store.set(f"failed/{rank}", f"{type(err).__name__}: {_first_line(err)}")
        return None
    time.sleep(_LINGER)  # the failed rank records before its sockets close; and torchrun sees it exit first
    reasons = []
    with contextlib.suppress(Exception):
        for r in range(world_size):
            if r != rank and store.check([f"failed/{r}"]):
                reasons.append(f"rank {r} failed ({store.get(f'failed/{r}').decode()})")
    if reasons:
        return f"{'; '.join(reasons)}; this rank stopped with it"
    return (f"lost contact with the other ranks ({_first_line(err)}): one of them crashed, was killed or hangs "
            f"(no answer within --timeout {_job['timeout']:g}s); look for its own message")


def exit_worker(code: int) -> None:
    """In a multi-process job, end this process now, after teardown; elsewhere return.

    A finished gloo rank sometimes aborts while the interpreter shuts down (C++
    destructors racing: "terminate called without an active exception"), and
    torchrun then reports a good run as failed. Leaving with ``os._exit`` after the
    process group is destroyed and the output flushed skips that shutdown.
    """
    if read_launch_env().world_size <= 1:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def teardown() -> None:
    """Leave the process group. Safe to call twice, or when setup failed.

    Called from a ``finally`` while an error propagates, it makes a failure legible:
    the rank that failed leaves its reason in the store; a rank whose collective broke
    because of another rank replaces torch's error with one WorkshopError naming that rank.
    """
    err = sys.exc_info()[1]
    message = None
    if isinstance(err, Exception) and _job.get("world_size", 1) > 1 and dist.is_initialized():
        message = _explain_failure(err)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _job.clear()
    if message:
        raise WorkshopError(message) from None
