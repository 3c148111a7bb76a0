"""On a GPU node: the packed LSTM path, nccl step 3 and snapshot resume (skipped with a reason without CUDA).

``benchmarks/gpu_check.sh`` runs these and prints the GPU figures. NCCL does
not allow two ranks on one GPU, so the nccl runs use min(2, GPUs) ranks: on a
one-GPU machine a world of one (the nccl process group, DDP and the snapshot
code paths all still run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO, SOLUTIONS
from workshop_lib.data import load_splits
from workshop_lib.model import SmilesLSTM
from workshop_lib.paths import DEFAULT_DATA

pytestmark = pytest.mark.gpu  # conftest skips these with a reason when no CUDA GPU is visible
RANKS = min(2, torch.cuda.device_count()) or 1


def gpu_env() -> dict[str, str]:
    """A child's environment: the GPUs visible, no torchrun leftovers."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def step3(out, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={RANKS}",
           str(SOLUTIONS / "step3_ddp.py"), "--limit", "600", "--out", str(out), "--no-progress", "--no-tensorboard",
           *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=gpu_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_packed_path_on_cuda_gives_the_cpu_logits():
    splits = load_splits(DEFAULT_DATA, limit=400)
    torch.manual_seed(0)
    model = SmilesLSTM(len(splits.tokenizer), dropout=0.0).eval()
    b = splits.train.__getitems__(range(64))
    with torch.no_grad():
        cpu = model(b.tokens, b.lengths)  # the padded path (oneDNN)
        gpu = model.cuda()(b.tokens.cuda(), b.lengths.cuda()).cpu()  # the packed path (cuDNN)
    assert torch.allclose(cpu, gpu, atol=1e-4), (cpu - gpu).abs().max()


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_nccl_step3_keeps_the_replicas_identical(tmp_path):
    step3(tmp_path, "--epochs", "2")
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert (m["backend"], m["world_size"], m["device"]) == ("nccl", RANKS, "cuda:0")
    assert [row["replica_spread"] for row in m["history"]] == [0.0, 0.0]
    assert m["replica_spread"] == 0.0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_snapshot_resume_on_the_gpu(tmp_path):
    step3(tmp_path, "--epochs", "2")
    again = step3(tmp_path, "--epochs", "3")
    assert "resuming from" in again.stdout + again.stderr
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert [row["epoch"] for row in m["history"]] == [0, 1, 2]
    assert m["device"] == "cuda:0" and m["history"][-1]["replica_spread"] == 0.0
