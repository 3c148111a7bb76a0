"""DDP under TORCH_DISTRIBUTED_DEBUG=DETAIL on CPU (gloo) ends in a segmentation fault: the whole reproduction.

    TORCH_DISTRIBUTED_DEBUG=DETAIL torchrun --standalone --nproc_per_node=2 tests/workers/detail_ddp_segfault.py

Seen on torch 2.13.0+cpu and 2.15.0+cu132 (on CPU): every rank dies with SIGSEGV while DDP(...) is built, before
the line below prints; with TORCH_DISTRIBUTED_DEBUG=INFO, or unset, both ranks print it. No upstream report was found
(pytorch/pytorch's issues, searched 2026-12-05); notebook 05 cites this file, and tests/integration/test_upstream.py
runs it on each torch CI tests, so that a release that fixes it shows.
"""

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(nn.Linear(3, 1))
print(f"rank {dist.get_rank()}: DDP built", flush=True)
dist.destroy_process_group()
