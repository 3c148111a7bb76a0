"""On a GPU node: the model on CUDA, nccl step 3, snapshot resume, and the CPU forced (skipped without CUDA).

``benchmarks/gpu_check.sh`` runs these and prints the GPU figures. NCCL does
not allow two ranks on one GPU, so the nccl runs use min(2, GPUs) ranks: on a
one-GPU machine a world of one (the nccl process group, DDP and the snapshot
code paths all still run). The scripts pick nccl whenever CUDA is available;
``CUDA_VISIBLE_DEVICES=`` hides the GPUs and so forces gloo on the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from tests.conftest import LAUNCH_VARS, REPO, SOLUTIONS
from workshop_lib.config import TrainConfig
from workshop_lib.data import collate, load_splits
from workshop_lib.launching.launch import torchrun_argv
from workshop_lib.model import SmilesLSTM

pytestmark = pytest.mark.gpu  # conftest skips these with a reason when no CUDA GPU is visible
RANKS = min(2, torch.cuda.device_count()) or 1
QUICK = ["--limit", "600", "--no-tensorboard"]


def gpu_env(**extra: str) -> dict[str, str]:
    """A child's environment: the GPUs visible, no torchrun leftovers."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def torchrun(script: str, out, *args: str, nproc: int = RANKS, timeout: float = 300,
             **env: str) -> subprocess.CompletedProcess:
    cmd = torchrun_argv(SOLUTIONS / script, nproc, args=[*QUICK, "--out", out, *args])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=gpu_env(**env))


def test_the_model_on_cuda_gives_the_cpu_logits():
    splits = load_splits(TrainConfig(limit=400))
    torch.manual_seed(0)
    model = SmilesLSTM(len(splits.tokenizer), dropout=0.0).eval()
    tokens, lengths, _ = collate([splits.train[i] for i in range(64)])
    with torch.no_grad():
        cpu = model(tokens, lengths)  # oneDNN's LSTM
        gpu = model.cuda()(tokens.cuda(), lengths.cuda()).cpu()  # cuDNN's, on the same padded batch
    assert torch.allclose(cpu, gpu, atol=1e-4), (cpu - gpu).abs().max()


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_nccl_step3_keeps_the_replicas_identical(tmp_path):
    done = torchrun("step3_ddp.py", tmp_path, "--epochs", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert (m["backend"], m["world_size"], m["device"]) == ("nccl", RANKS, "cuda:0")
    assert [row["replica_spread"] for row in m["history"]] == [0.0, 0.0]
    assert m["replica_spread"] == 0.0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_snapshot_resume_on_the_gpu(tmp_path):
    first = torchrun("step4_snapshots.py", tmp_path, "--epochs", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    again = torchrun("step4_snapshots.py", tmp_path, "--epochs", "3")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from" in again.stdout
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert [row["epoch"] for row in m["history"]] == [0, 1, 2]
    assert m["device"] == "cuda:0" and m["history"][-1]["replica_spread"] == 0.0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hiding_the_gpus_forces_gloo_on_the_cpu(tmp_path):
    done = torchrun("step3_ddp.py", tmp_path, "--epochs", "1", nproc=2, CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 0, done.stderr[-3000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert (m["backend"], m["device"], m["world_size"]) == ("gloo", "cpu", 2)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_more_processes_than_gpus_stops_with_torchs_own_cuda_error(tmp_path):
    """The rank whose LOCAL_RANK names no GPU fails in torch.cuda.set_device; torchrun stops the rest."""
    done = torchrun("step3_ddp.py", tmp_path, "--epochs", "1", nproc=torch.cuda.device_count() + 1, timeout=240)
    assert done.returncode != 0
    assert "invalid device ordinal" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "metrics.json").exists()
