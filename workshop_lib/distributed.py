"""Distributed state: the one place that reads torchrun's environment, and the safety nets.

torchrun starts one process per rank and tells each who it is through
environment variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...).
:func:`read_launch_env` is the only function in the project that reads them;
everything else receives a :class:`LaunchEnv` or a :class:`DistEnv`.

The step scripts call ``torch.cuda.set_device``, ``dist.init_process_group``
and ``dist.destroy_process_group`` themselves, in plain view: those lines are
the lesson. What this module adds around them is robustness, each piece behind
a name that says what it is:

* :func:`rendezvous_store`: the store ``init_process_group`` meets on; its keys
  are fresh after every torchrun restart, and under plain ``python`` it is an
  in-memory store (a group of one, no network port);
* :func:`failure_relay`: a rank that fails leaves its reason in the store, and
  a rank whose collective broke because of it says which rank failed and why;
* :func:`check_backend` and :func:`set_threads`: one line instead of a CUDA
  traceback, and one thread per rank on CPU.

:func:`setup` and :func:`teardown` do all of it in two calls, for code that is
not a lesson (the notebook fork launcher, test workers).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from workshop_lib.errors import WorkshopError, first_line


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
        if "LOCAL_RANK" not in env and int(env["WORLD_SIZE"]) > int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])):
            raise WorkshopError(f"LOCAL_RANK is not set, and RANK cannot stand in for it on several nodes (WORLD_SIZE "
                                f"{env['WORLD_SIZE']} > LOCAL_WORLD_SIZE {env['LOCAL_WORLD_SIZE']}): it would pick the "
                                f"wrong GPU; set LOCAL_RANK on every process, or launch with torchrun")
        return LaunchEnv(
            rank=int(env["RANK"]),
            local_rank=int(env.get("LOCAL_RANK", env["RANK"])),  # one node: the global rank is the local one
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


def check_backend(backend: str, launch: LaunchEnv) -> None:
    """Refuse, in one line, a backend this node cannot run (NCCL without a GPU for every local process)."""
    if backend != "nccl":
        return
    if not torch.cuda.is_available():
        raise WorkshopError("--backend nccl needs CUDA GPUs and none is visible; use --backend gloo or leave it out")
    n_gpus = torch.cuda.device_count()
    # Every rank checks the node's process count, so they all refuse, not just the ones without a GPU.
    if max(launch.local_world_size, launch.local_rank + 1) > n_gpus:
        raise WorkshopError(f"--nproc_per_node={launch.local_world_size} is more than the {n_gpus} GPU(s) on "
                            f"this node; use --nproc_per_node={n_gpus} or fewer (or --backend gloo for CPU)")


def _pick_backend(requested: str | None, launch: LaunchEnv) -> tuple[str, torch.device]:
    backend = requested or ("nccl" if torch.cuda.is_available() else "gloo")
    check_backend(backend, launch)
    if backend == "nccl":
        return backend, torch.device("cuda", launch.local_rank)
    return backend, torch.device("cpu")


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity (a container's, taskset's or SLURM's share), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def set_threads(launch: LaunchEnv, device: torch.device) -> None:
    """On CPU, give each rank its share of the cores instead of letting them fight."""
    if device.type != "cpu":
        return
    cores = usable_cores()
    if launch.local_world_size > cores and launch.local_rank == 0:  # one line, from one rank per node
        print(f"warning: --nproc_per_node={launch.local_world_size} is more than the {cores} CPU cores: ranks "
              f"will share cores and run slower; use --nproc_per_node={cores} or fewer", file=sys.stderr, flush=True)
    if launch.omp_threads is not None:
        torch.set_num_threads(launch.omp_threads)
    elif launch.world_size > 1:
        torch.set_num_threads(max(1, cores // launch.local_world_size))


def rendezvous_store(launch: LaunchEnv, timeout: float = 120.0) -> dist.Store:
    """The store for ``init_process_group(store=...)``: in memory under plain python, else TCP, fresh per restart.

    After torchrun restarts a failed group, its agent's TCP store still holds the
    dead round's keys, and gloo's connectFullMesh would wait on them forever
    (pytorch/pytorch#135712). A prefix per restart gives each round fresh keys.
    A port already taken becomes one WorkshopError naming it.
    """
    if not launch.under_torchrun and launch.world_size == 1:
        return dist.HashStore()  # plain python: a group of one, no network port
    try:
        tcp = dist.TCPStore(launch.master_addr, launch.master_port, launch.world_size,
                            is_master=launch.rank == 0 and not launch.agent_store,
                            timeout=timedelta(seconds=timeout), wait_for_workers=False,
                            multi_tenant=True)  # a plain init_process_group(backend) on rank 0 shares its server
    except (RuntimeError, dist.DistStoreError) as err:
        raise _join_error(err, launch, timeout) from None
    return dist.PrefixStore(f"workshop/restart{launch.restart_count}", tcp)


def _join_error(err: BaseException, launch: LaunchEnv, timeout: float) -> WorkshopError:
    first = first_line(err)
    if "EADDRINUSE" in first:
        return WorkshopError(f"port {launch.master_port} is already in use (another job?); launch with another "
                             f"--master-port, or with torchrun --standalone, which picks a free one")
    return WorkshopError(f"could not join the process group at {launch.master_addr}:{launch.master_port} "
                         f"within {timeout:g}s ({first}); check that every rank started and the port is free")


def setup(backend: str | None = None, timeout: float = 120.0, store: dist.Store | None = None) -> DistEnv:
    """All of a step script's start in one call (for the fork launcher and test workers): join, return who we are.

    ``store``: the store to join on (default: :func:`rendezvous_store`).
    """
    launch = read_launch_env()
    backend, device = _pick_backend(backend, launch)
    set_threads(launch, device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = store if store is not None else rendezvous_store(launch, timeout)
    try:
        dist.init_process_group(backend, store=store, rank=launch.rank, world_size=launch.world_size,
                                timeout=timedelta(seconds=timeout))
    except (RuntimeError, dist.DistStoreError) as err:
        raise _join_error(err, launch, timeout) from None
    _job.update(store=store, rank=launch.rank, world_size=launch.world_size, timeout=timeout)
    return DistEnv(launch.rank, launch.local_rank, launch.world_size, launch.local_world_size, device, backend)


# Set by setup(), read by teardown(): where a failing rank leaves its reason for the others.
_job: dict = {}
_LINGER = 2.0  # seconds a rank that lost its peers waits, so torchrun sees the rank that failed first


def _lost_peers(err: BaseException) -> bool:
    """Did a collective fail because another rank died, left or hangs (not because of this rank)?"""
    return isinstance(err, dist.DistError) or (isinstance(err, RuntimeError) and "gloo" in str(err))


def _explain_failure(err: BaseException, store: dist.Store, rank: int, world_size: int, timeout: float) -> str | None:
    """Leave this rank's reason in the store, or read the reason a failed peer left there.

    Returns the one-line message for a rank whose collective broke, else None.
    """
    if not _lost_peers(err):
        with contextlib.suppress(Exception):  # a dead store must not hide the original error
            store.set(f"failed/{rank}", f"{type(err).__name__}: {first_line(err)}")
        return None
    time.sleep(_LINGER)  # the failed rank records before its sockets close; and torchrun sees it exit first
    reasons = []
    with contextlib.suppress(Exception):
        for r in range(world_size):
            if r != rank and store.check([f"failed/{r}"]):
                reasons.append(f"rank {r} failed ({store.get(f'failed/{r}').decode()})")
    if reasons:
        return f"{'; '.join(reasons)}; this rank stopped with it"
    return (f"lost contact with the other ranks ({first_line(err)}): one of them crashed, was killed or hangs "
            f"(no answer within --timeout {timeout:g}s); look for its own message")


@contextlib.contextmanager
def failure_relay(store: dist.Store, env: DistEnv, timeout: float = 120.0):
    """Around the work between init and destroy: make a failure legible on every rank.

    The rank that fails leaves its reason in ``store``; a rank whose collective broke
    because of another rank raises one WorkshopError naming that rank and its reason,
    instead of torch's "connection closed by peer". A group of one passes errors through.

    It patches nothing: a rank that *hangs* is the hang watch's job (:mod:`workshop_lib.debug.hangwatch`),
    which a script installs with its own visible line.
    """
    try:
        yield
    except Exception as err:
        if env.world_size <= 1:
            raise
        message = _explain_failure(err, store, env.rank, env.world_size, timeout)
        if message:
            _relay(err, message)
        raise
    finally:
        let_gloo_finish()


def let_gloo_finish(seconds: float = 0.1) -> None:
    """Give gloo's worker thread the GIL for a moment before the group can be destroyed.

    After a collective, that thread drops its work object, and with it the last
    reference to a Python tensor: it needs the GIL for that. Destroying a gloo group
    joins the thread while holding the GIL, so if the thread has not got there yet,
    both wait for ever (seen on torch 2.13, when a run that had just all-gathered
    failed and its DDP model was freed with the traceback). Sleeping releases the GIL.
    """
    try:
        gloo = dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo"
    except (RuntimeError, ValueError):  # no default group after all
        return
    if gloo:
        time.sleep(seconds)


def _relay(err: BaseException, message: str) -> None:
    """Raise the one-line error for a rank whose collective broke, keeping the traceback where it may be a bug.

    When another rank left its reason, that rank printed its own traceback and the
    line names it. When none did, this rank's own error may be the bug (a gloo
    call misused here, say): its traceback is printed and kept as the cause.
    """
    if message.startswith("lost contact"):
        traceback.print_exception(err, file=sys.stderr)
        raise WorkshopError(message) from err
    raise WorkshopError(message) from None


def teardown() -> None:
    """Leave the process group :func:`setup` joined. Safe to call twice, or when setup failed.

    Called from a ``finally`` while an error propagates, it relays the failure as
    :func:`failure_relay` does.
    """
    err = sys.exc_info()[1]
    message = None
    if isinstance(err, Exception) and _job.get("world_size", 1) > 1 and dist.is_initialized():
        message = _explain_failure(err, _job["store"], _job["rank"], _job["world_size"], _job["timeout"])
    if dist.is_available() and dist.is_initialized():
        let_gloo_finish()
        dist.destroy_process_group()
    _job.clear()
    if message:
        _relay(err, message)
