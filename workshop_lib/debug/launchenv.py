"""What torchrun told this process: the tools' one reader of its environment (and, for the ranks the tools start
or make up, its one writer: :func:`launch_variables`).

A step script reads what it needs itself, in view (``int(os.environ["LOCAL_RANK"])``,
``dist.get_rank()``). The tools (the hang watch, the launchers, the checks)
read torchrun's variables here, and only here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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


def launch_variables(rank: int, world_size: int, per_node: int | None = None, **extra: object) -> dict[str, str]:
    """What torchrun gives worker ``rank`` of ``world_size``, ``per_node`` workers a node (default: one node), plus
    ``extra``: the variables :func:`read_launch_env` reads back."""
    per_node = per_node or world_size
    variables = {"RANK": rank, "LOCAL_RANK": rank % per_node, "WORLD_SIZE": world_size, "LOCAL_WORLD_SIZE": per_node,
                 "GROUP_RANK": rank // per_node, **extra}
    return {k: str(v) for k, v in variables.items()}
