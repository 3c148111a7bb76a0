"""Faults: a rank killed mid-training, ranks that die or raise, launches that cannot start."""

from __future__ import annotations

import json
import os
import signal
import socket
from datetime import timedelta

import pytest
import torch

from tests.conftest import REPO, run_python, run_torchrun
from tests.reliability import (
    RUN,
    STEP3,
    STEP4,
    children,
    environ_of,
    reference_metrics,
    same_results,
    still_alive,
    stop,
    torchrun,
)
from workshop_lib import distributed
from workshop_lib.config import build_parser, parse_config
from workshop_lib.data import check_shardable
from workshop_lib.errors import WorkshopError


def _workers(run) -> dict[str, int]:
    """{RANK: pid} of torchrun's worker processes."""
    return {environ_of(pid).get("RANK"): pid for pid in children(run.proc.pid)}


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_sigkill_in_epoch_2_restarts_and_matches_an_uninterrupted_run(tmp_path):
    """torchrun --max-restarts=1 restarts the group; step 4 resumes from the last snapshot, losing nothing."""
    run = torchrun(["--max-restarts=1", STEP4, *RUN, "--out", tmp_path])
    try:
        # Rank 0 writes epoch 1's snapshot and goes straight on to epoch 2: that file is the signal.
        assert run.wait_for(lambda: (tmp_path / "snapshot.pt").exists(), 120), run.output[-3000:]
        workers = _workers(run)
        assert set(workers) >= {"0", "1"}, (workers, run.output[-3000:])
        os.kill(workers["1"], signal.SIGKILL)
        rc = run.wait(timeout=150)
    finally:
        stop(run)
    assert rc == 0, run.output[-3000:]
    assert "resuming from" in run.output, run.output[-3000:]
    for epoch in range(1, 5):  # each epoch trained (and printed) exactly once, before the kill or after it
        assert run.output.count(f"epoch {epoch}/4  train loss") == 1, run.output[-3000:]
    same_results(json.loads((tmp_path / "metrics.json").read_text()), reference_metrics())


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_ctrl_c_stops_every_rank_keeps_the_snapshot_and_the_same_command_resumes(tmp_path):
    """A terminal's Ctrl-C (SIGINT to torchrun's process group) in epoch 2 of step 4; then the same command again."""
    run = torchrun([STEP4, *RUN, "--out", tmp_path])
    try:
        assert run.wait_for(lambda: (tmp_path / "snapshot.pt").exists(), 120), run.output[-3000:]
        workers = _workers(run)
        os.killpg(run.proc.pid, signal.SIGINT)
        rc = run.wait(timeout=60)  # torchrun passes SIGINT on to its workers; it would SIGKILL them only after 30 s
        assert still_alive(workers.values(), timeout=10) == []
    finally:
        stop(run)
    assert rc != 0 and run.output.count("interrupted") == 2, run.output[-3000:]  # each rank ended by the interrupt
    assert "SIGKILL" not in run.output, run.output[-3000:]
    snap = torch.load(tmp_path / "snapshot.pt", weights_only=True)  # whole, and loads
    assert (f"interrupted: {tmp_path / 'snapshot.pt'} holds epoch {snap['epoch'] + 1}/4; run the same command "
            "again to resume") in run.output, run.output[-3000:]  # rank 0, the one that wrote it, says how to go on
    again = torchrun([STEP4, *RUN, "--out", tmp_path])
    try:
        assert again.wait(timeout=150) == 0, again.output[-3000:]
    finally:
        stop(again)
    assert f"resuming from {tmp_path / 'snapshot.pt'}: epoch {snap['epoch'] + 1}/4 was done" in again.output
    same_results(json.loads((tmp_path / "metrics.json").read_text()), reference_metrics())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_dying_rank_is_named_and_the_others_exit_at_once():
    """Rank 1 os._exit()s while rank 0 waits in all_reduce: torchrun names rank 1 and stops rank 0."""
    timeout = 60
    run = torchrun([REPO / "tests" / "workers" / "fault_worker.py", "exit", timeout])
    try:
        assert run.wait_for(lambda: "rank 1 fails now" in run.output, 90), run.output[-3000:]
        rc = run.wait(timeout=timeout + 30)
    finally:
        stop(run)
    assert rc != 0, run.output[-3000:]
    assert "lost contact" not in run.output  # rank 0 was stopped by torchrun, not by its own timeout
    # The survivor waits a moment before it exits, so torchrun blames the rank that failed first.
    root_cause = run.output.split("Root Cause (first observed failure):", 1)[1].split("=====")[0]
    assert "rank      : 1 (local_rank: 1)" in root_cause and "exitcode  : 3" in root_cause, run.output[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_hanging_rank_stops_the_others_after_the_timeout():
    """Rank 1 stays alive but never joins the next all_reduce: rank 0 gives up after --timeout seconds."""
    timeout = 6
    run = torchrun([REPO / "tests" / "workers" / "fault_worker.py", "hang", timeout])
    try:
        assert run.wait_for(lambda: "rank 1 fails now" in run.output, 90), run.output[-3000:]
        rc = run.wait(timeout=90)
    finally:
        stop(run)
    assert rc != 0, run.output[-3000:]
    assert "[rank 0] error: lost contact with the other ranks (" in run.output
    assert f"(no answer within --timeout {timeout}s); look for its own message\n" in run.output


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
@pytest.mark.timeout(120)
def test_nccl_without_gpus_under_torchrun(tmp_path):
    proc = run_torchrun(STEP3, ["--backend", "nccl", *RUN, "--out", tmp_path / "out"], timeout=100)
    assert proc.returncode != 0
    ours = sorted(line for line in proc.stderr.splitlines() if line.startswith("[rank"))  # the rest is torchrun's
    # Each rank that gets to speak says the same one line; torchrun may stop the
    # other rank first, once the first has exited with code 2.
    expected = {f"[rank {rank}] error: --backend nccl needs CUDA GPUs and none is visible; "
                "use --backend gloo or leave it out" for rank in (0, 1)}
    assert ours and set(ours) <= expected and len(ours) == len(set(ours)), proc.stderr[-3000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_master_port_in_use(tmp_path):
    """torchrun's own agent fails (its traceback ends in EADDRINUSE); a rank hosting the store says it in one line."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        agent = torchrun([STEP3, *RUN, "--out", tmp_path / "a"], port=port)
        try:
            rc = agent.wait(timeout=90)
        finally:
            stop(agent)
        assert rc != 0 and "EADDRINUSE" in agent.output.strip().splitlines()[-1], agent.output[-3000:]
        assert not (tmp_path / "a").exists()
        # Without torchrun's agent (as under a hand-made launch), rank 0 hosts the store itself.
        proc = run_python([STEP3, *RUN, "--timeout", "10", "--out", tmp_path / "b"], timeout=90,
                          RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    assert proc.returncode == 2
    assert proc.stderr == (f"[rank 0] error: port {port} is already in use (another job?); launch with another "
                           f"--master-port, or with torchrun --standalone, which picks a free one\n")
    assert not (tmp_path / "b").exists()


def _launch_env(**kw) -> distributed.LaunchEnv:
    return distributed.LaunchEnv(under_torchrun=True, **kw)


@pytest.mark.parametrize("local_rank", [0, 1])
def test_more_processes_than_gpus_is_refused_on_every_rank(monkeypatch, local_rank):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    launch = _launch_env(rank=local_rank, local_rank=local_rank, world_size=2, local_world_size=2)
    with pytest.raises(WorkshopError, match=r"--nproc_per_node=2 is more than the 1 GPU\(s\) on this node; "
                                            r"use --nproc_per_node=1 or fewer"):
        distributed._pick_backend(None, launch)
    backend, device = distributed._pick_backend(None, _launch_env(world_size=1))  # one per GPU is fine
    assert (backend, device) == ("nccl", torch.device("cuda", 0))
    assert distributed._pick_backend("gloo", launch) == ("gloo", torch.device("cpu"))  # CPU: no GPU needed


def test_more_processes_than_cpu_cores_warns_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(distributed, "usable_cores", lambda: 2)
    threads = torch.get_num_threads()
    try:
        distributed.set_threads(_launch_env(world_size=3, local_world_size=3, omp_threads=1), torch.device("cpu"))
        distributed.set_threads(_launch_env(world_size=2, local_world_size=2, omp_threads=1), torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)
    assert capsys.readouterr().err == ("warning: --nproc_per_node=3 is more than the 2 CPU cores: ranks will share "
                                       "cores and run slower; use --nproc_per_node=2 or fewer\n")


def test_too_few_molecules_for_every_rank():
    check_shardable(4, 4)
    with pytest.raises(WorkshopError, match="3 training molecules cannot be shared by 4 ranks; raise --limit"):
        check_shardable(3, 4)


@pytest.mark.timeout(60)
def test_the_timeout_flag_reaches_init_process_group(monkeypatch):
    seen = {}
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda *a, **kw: seen.update(kw))
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    cfg = parse_config(build_parser("t"), ["--timeout", "7"])
    distributed.setup("gloo", cfg.timeout)
    assert seen["timeout"] == timedelta(seconds=7)
