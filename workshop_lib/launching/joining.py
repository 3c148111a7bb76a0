"""Joining a process group for the lab's own ranks (notebook ranks, the checks, test workers): :func:`join`.

A step script joins in view, with ``dist.init_process_group(backend)``; these join on a store they are given,
and get the :class:`DistEnv` a notebook's function takes as ``env``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from workshop_lib.debug.launchenv import read_launch_env


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


def join(backend: str = "gloo", timeout: float = 120.0, store: dist.Store | None = None) -> DistEnv:
    """Join the group torchrun's variables describe (on ``store`` if given, else env://); return who we are."""
    launch = read_launch_env()
    device = torch.device("cuda", launch.local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif launch.omp_threads:  # a forked rank keeps its parent's thread pool: the launcher's OMP_NUM_THREADS says
        torch.set_num_threads(launch.omp_threads)
    if store is None:
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    else:
        dist.init_process_group(backend, store=store, rank=launch.rank, world_size=launch.world_size,
                                timeout=timedelta(seconds=timeout))
    return DistEnv(launch.rank, launch.local_rank, launch.world_size, launch.local_world_size, device, backend)


def leave() -> None:
    """Leave the group :func:`join` joined, if any. Safe to call twice."""
    if dist.is_available() and dist.is_initialized():
        let_gloo_finish()
        dist.destroy_process_group()


def let_gloo_finish(seconds: float = 0.1) -> None:
    """Give gloo's worker thread the GIL for a moment before the group can be destroyed.

    That thread needs the GIL to drop a collective's last tensor; destroying the group joins it holding the GIL,
    so both would wait for ever (seen on torch 2.13, a forked rank failing right after an all_gather).
    """
    try:
        gloo = dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo"
    except (RuntimeError, ValueError):  # no default group after all
        return
    if gloo:
        time.sleep(seconds)
