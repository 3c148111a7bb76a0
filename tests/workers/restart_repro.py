"""torchrun's restart bug with gloo on torch 2.13, in a few lines (docs/reference/restarts.md).

    torchrun --standalone --nproc_per_node=2 --max-restarts=1 tests/workers/restart_repro.py [TIMEOUT]
    export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1   # the workaround; then the same command

Rank 1 SIGKILLs itself once, in round 0; torchrun restarts both ranks. Without
the variable the restarted round sometimes fails (gloo's connectFullMesh:
"Connection refused", to an address of the dead round) or hangs until TIMEOUT
seconds (default 120); with it, every round is clean.
"""

import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 120.0
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))  # the textbook line, env://
    rank, round_ = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    for step in range(20):
        if rank == 1 and round_ == 0 and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash, once: torchrun restarts the group
        total = torch.ones(1)
        dist.all_reduce(total)
        assert total.item() == dist.get_world_size()
    print(f"rank {rank}: round {round_} clean", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
