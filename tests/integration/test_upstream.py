"""torch's own behaviour that the lesson states, reproduced: torch's bugs the lesson names (each test fails once a
torch release no longer has the bug, so that the text that cites it is mended then), and the facts of torchrun and
FSDP2 that pages and notebooks state (each test fails once a torch release behaves otherwise; the sentences that
rest on it are named in its docstring, and tests/integration/test_content.py keeps the old, wrong sentences out)."""

from __future__ import annotations

import re
import socket
import sys

import pytest

from tests.conftest import REPO
from tests.reliability import Launch, stop, torchrun
from workshop_lib.launching.launch import torchrun_argv

DETAIL_REPRO = REPO / "tests" / "workers" / "detail_ddp_segfault.py"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ddp_under_detail_debug_segfaults_on_cpu():
    """Notebook 05, lab 3: "This lab's script gets no further than DDP(...) under DETAIL".

    Under INFO DDP is built and trains on CPU: lab 5's broken run sets it (hang_runs.DEBUG) and gets as far as DDP's
    error in its second step, in test_hangs_lab.py's test_the_unused_parameter_lab_fails_with_ddps_whole_error and in
    05's replay; a job of this script under INFO as well repeated that."""
    job = torchrun([DETAIL_REPRO], TORCH_DISTRIBUTED_DEBUG="DETAIL")
    rc = job.wait(timeout=90)
    assert rc != 0 and job.output.count("DDP built") == 0 and "SIGSEGV" in job.output, job.output[-3000:]


# ---- torchrun on one node, without --standalone ---------------------------------------------------------------------

STATIC_DEFAULT_PORT = 29500  # torchrun's --master-port when one is needed and none is given
# Each rank joins through env:// and says where torchrun sent it, and which rendezvous run it belongs to.
SAY_WHERE = ("import os, torch, torch.distributed as dist; dist.init_process_group('gloo'); "
             "dist.all_reduce(torch.ones(1)); "
             "os.write(1, f\"rank {dist.get_rank()} port {os.environ['MASTER_PORT']} run "
             "{os.environ['TORCHELASTIC_RUN_ID']}\\n\".encode()); dist.destroy_process_group()")  # one write: lines whole
_SAID = re.compile(r"^rank (\d) port (\d+) run (\S+)$", re.MULTILINE)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_single_node_torchrun_without_a_port_meets_on_a_free_one():
    """README, docs/quickref.md, docs/instructor.md, docs/reference/restarts.md and faults.md: a single-node torchrun
    with no --master-port and no --rdzv-endpoint switches to the c10d rendezvous on localhost:0, a free port
    (torch/distributed/run.py, ``run``: the branch after ``args.rdzv_backend == "static"``), so two such jobs on one
    node never collide, not even with port 29500 taken; only an explicit --master-port (EADDRINUSE:
    test_faults.py's test_master_port_in_use) or several nodes keep the static rendezvous on a fixed port."""
    with socket.socket() as held:
        try:  # 29500 held for the whole test (by this socket, or by whoever holds it already)
            held.bind(("127.0.0.1", STATIC_DEFAULT_PORT))
            held.listen()
        except OSError:
            pass
        jobs = [Launch(torchrun_argv(sys.executable, 2, standalone=False, flags=["--no-python"],
                                     args=["-c", SAY_WHERE])) for _ in range(2)]  # at once, as two learners would
        try:
            codes = [job.wait(timeout=120) for job in jobs]
        finally:
            for job in jobs:
                stop(job)
    said = [sorted(_SAID.findall(job.output)) for job in jobs]
    assert codes == [0, 0] and all(len(s) == 2 for s in said), "\n\n".join(j.output[-2000:] for j in jobs)
    for ranks in said:
        (_, port0, run0), (_, port1, run1) = ranks
        assert port0 == port1 != str(STATIC_DEFAULT_PORT), ranks  # one store per job, not the static default
        assert run0 == run1 != "none", ranks  # a rendezvous id of its own (a uuid): c10d's; the static one's is "none"
    assert said[0][0][1] != said[1][0][1] and said[0][0][2] != said[1][0][2], said  # two jobs, two ports, two runs


# ---- FSDP2 (fully_shard), on one gloo rank ----------------------------------------------------------------------


def _two_units():
    """A root unit over a child unit: ``fully_shard`` on the first layer, then on the whole model."""
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    fully_shard(model[0])
    fully_shard(model)
    return model


def _spawned(body) -> None:
    """``body()`` in a fresh spawned process (its exceptions raised here). FSDP2's backward on CPU starts autograd's
    threads, and torch 2.15 refuses autograd in a rank forked from a process that has started them: run here, in a
    pytest worker, it would fail the later tests of that worker that fork ranks."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.apply(body)


def _root_keeps_its_weights() -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo")
    try:
        model = _two_units()
        out = model(torch.randn(3, 4))
        # After forward a unit's registered parameters are its shards (DTensors) when it resharded, the gathered
        # plain tensors when it kept them (fully_shard's docstring, reshard_after_forward).
        assert all(isinstance(p, DTensor) for p in model[0].parameters()), "the child unit kept its gathered weights"
        assert not any(isinstance(p, DTensor) for p in model[2].parameters()), "the root unit freed its weights"
        out.sum().backward()
        assert all(isinstance(p, DTensor) for p in model.parameters()), "a unit still whole after backward"
    finally:
        dist.destroy_process_group()


def _an_early_optimizer_trains_nothing() -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        old = list(model.parameters())
        too_early = torch.optim.SGD(model.parameters(), lr=0.1)
        fully_shard(model)
        new = list(model.parameters())
        assert not any(a is b for a, b in zip(old, new, strict=True)), "fully_shard kept a parameter object"
        before = [p.detach().full_tensor().clone() for p in new]
        model(torch.randn(3, 4)).sum().backward()
        too_early.step()  # no error, no warning
        assert all(p.grad is None for p in old), "a replaced parameter got a gradient"
        assert all(torch.equal(b, p.detach().full_tensor()) for b, p in zip(before, new, strict=True))
        in_time = torch.optim.SGD(model.parameters(), lr=0.1)  # built after fully_shard, on the new parameters
        in_time.step()
        assert not all(torch.equal(b, p.detach().full_tensor()) for b, p in zip(before, new, strict=True))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_root_unit_keeps_its_gathered_parameters_after_forward(world_of_one):
    """04b §1 and 06 §2: after forward a unit frees its gathered parameters by default, except the root:
    ``reshard_after_forward=None`` (the default) means True for every other unit and False for the root
    (torch/distributed/fsdp/_fully_shard/_fully_shard.py), whose weights backward needs first. So with
    ``fully_shard`` on the whole model only (04b §1), nothing is freed after forward and backward gathers nothing:
    an all-gather and a reduce-scatter a step, DDP's all-reduce's bytes."""
    _spawned(_root_keeps_its_weights)  # its backward stays out of this worker, whose later tests fork ranks


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_an_optimizer_built_before_fully_shard_trains_nothing(world_of_one):
    """06 §2: the optimizer is built after ``fully_shard`` because ``fully_shard`` replaces every parameter with a
    new ``nn.Parameter`` (a DTensor): an optimizer built before holds the old tensors, which get no gradient, and
    its step changes nothing, silently."""
    _spawned(_an_early_optimizer_trains_nothing)  # its backward stays out of this worker, whose later tests fork ranks
