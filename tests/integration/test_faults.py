"""Faults, as a user meets them: a rank killed mid-training, Ctrl-C, ranks that die, raise or hang, a busy port.

The scripts hold no helper of their own for any of these: each row is kept by
torch (gloo's timeout, ``@record``), torchrun (its failure summary, stopping the
other ranks, restarting the group), the core (snapshots) or an instrument attached
from outside (``-m workshop_lib.watch``). docs/reference/faults.md says which. A hang
with the watch attached is tested where the watch is: tests/unit/debug/test_hangwatch.py
(who never arrived, under torchrun) and test_hangs_lab.py (a lab's hang under torchrun,
ended by the group's own timeout); here, the watch with no flag on a script written
elsewhere (tests/workers/elsewhere/train.py, a line or three changed). A rank that raises
(its traceback in torchrun's summary, through ``@record``) is run once, on two nodes: test_multinode.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, run_python, run_torchrun
from tests.reliability import (
    RESTARTS,
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
from workshop_lib import checkpoint
from workshop_lib.debug import hangreport

FAULT_WORKER = REPO / "tests" / "workers" / "fault_worker.py"
ELSEWHERE = REPO / "tests" / "workers" / "elsewhere"  # train.py in the tutorials' form, and its datautils.py


def _elsewhere(tmp_path: Path, line: str, instead: str, *more: tuple[str, str]) -> tuple[Path, int]:
    """A copy of the script written elsewhere (and its data module beside it) with ``line`` replaced (and each
    ``(line, instead)`` of ``more``): its path, and the number of the line that holds ``instead`` in the copy."""
    for name in ("train.py", "datautils.py"):
        shutil.copy(ELSEWHERE / name, tmp_path / name)
    lines = (ELSEWHERE / "train.py").read_text().splitlines(keepends=True)
    for old, new in [(line, instead), *more]:
        at = [i for i, text in enumerate(lines) if text.strip() == old]
        assert len(at) == 1, old
        lines[at[0]] = lines[at[0]].replace(old, new)
    (tmp_path / "train.py").write_text("".join(lines))
    return tmp_path / "train.py", _line_of(tmp_path / "train.py", instead)


def _line_of(script: Path, code: str) -> int:
    return next(i for i, text in enumerate(script.read_text().splitlines(), 1) if text.strip() == code)


def _workers(run) -> dict[str, int]:
    """{RANK: pid} of torchrun's worker processes."""
    return {environ_of(pid).get("RANK"): pid for pid in children(run.proc.pid)}


def _summary(output: str) -> str:
    """torchrun's failure summary: the part after ``ChildFailedError``."""
    assert "ChildFailedError" in output, output[-3000:]
    return output.rsplit("ChildFailedError", 1)[1]


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_sigkill_in_epoch_2_restarts_and_matches_an_uninterrupted_run(tmp_path):
    """torchrun --max-restarts=1 restarts the group; step 4 resumes from the last snapshot, losing nothing."""
    run = torchrun(["--max-restarts=1", STEP4, *RUN, "--out", tmp_path], **RESTARTS)
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
def test_ctrl_c_stops_every_rank_and_keeps_a_whole_snapshot(tmp_path):
    """A terminal's Ctrl-C (SIGINT to torchrun's process group) in epoch 2 of step 4. That the same command then
    resumes from the snapshot and ends as an uninterrupted run is the SIGKILL test's second round (above), and in one
    process test_checkpoint.py's test_resume_continues_exactly_where_it_stopped: a run of it here repeated them."""
    run = torchrun([STEP4, *RUN, "--out", tmp_path])
    try:
        assert run.wait_for(lambda: (tmp_path / "snapshot.pt").exists(), 120), run.output[-3000:]
        workers = _workers(run)
        os.killpg(run.proc.pid, signal.SIGINT)
        rc = run.wait(timeout=60)  # every rank gets the SIGINT; torchrun would SIGKILL what is left only after 30 s
        assert still_alive(workers.values(), timeout=10) == []
    finally:
        stop(run)
    assert rc != 0, run.output[-3000:]
    assert "SignalException: Process" in run.output and "got signal: 2" in run.output  # torchrun's own last line
    assert "KeyboardInterrupt" in run.output and "SIGKILL" not in run.output, run.output[-3000:]
    snap = torch.load(tmp_path / "snapshot.pt", weights_only=True)  # whole (written atomically), and loads
    assert set(checkpoint.LESSON) <= snap.keys()  # what the same command would resume from
    assert not (tmp_path / "metrics.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_dying_rank_stops_the_others_at_once_and_is_named():
    """Rank 1 os._exit(3)s while rank 0 waits in all_reduce: torchrun stops rank 0 and lists both in its summary.

    Rank 0 stops at once, long before its --timeout: its all_reduce fails (gloo: "Connection closed by peer", or
    "reset"), or torchrun's agent, which saw rank 1 exit first, sends it SIGTERM; which comes first is a race. Which
    of the two torchrun calls the root cause depends on which exit it saw first; it lists both.
    """
    timeout = 60
    run = torchrun([FAULT_WORKER, "exit", timeout])
    try:
        assert run.wait_for(lambda: "rank 1 fails now" in run.output, 90), run.output[-3000:]
        rc = run.wait(timeout=timeout / 2)  # well before rank 0's own timeout
    finally:
        stop(run)
    assert rc != 0, run.output[-3000:]
    summary = _summary(run.output)
    assert re.search(r"rank      : 1 \(local_rank: 1\)\n  exitcode  : 3 ", summary), summary
    assert re.search(r"rank      : 0 \(local_rank: 0\)\n  exitcode  : ", summary), summary
    stopped = re.search(r"Connection (closed|reset) by peer|Sending process \d+ closing signal SIGTERM", run.output)
    assert stopped, run.output[-3000:]
    assert "Timed out" not in run.output


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_master_port_in_use(tmp_path):
    """torch's own error (EADDRINUSE), from torchrun's agent, or from rank 0 when it hosts the store; nothing written."""
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
        # Without torchrun's agent (a hand-made launch), rank 0 hosts the store itself: torch says the same.
        proc = run_python([STEP3, *RUN, "--timeout", "10", "--out", tmp_path / "b"], timeout=90,
                          RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    assert proc.returncode == 1
    assert "EADDRINUSE" in proc.stderr.strip().splitlines()[-1], proc.stderr[-3000:]
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_step_script_under_plain_python_says_it_needs_torchrun(tmp_path):
    """Steps 1-4 join through env://, which reads torchrun's variables: plain python gets one line, how to start it."""
    proc = run_python([STEP3, "--limit", "200", "--out", tmp_path / "out"], timeout=50)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"start it with torchrun: torchrun --standalone --nproc_per_node=2 "
                                                f"{os.path.relpath(STEP3, REPO)}"], proc.stderr[-2000:]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_timeout_flag_reaches_init_process_group(tmp_path):
    """Step 3 with --timeout 3, rank 1 kept from its first collective: rank 0 gives up after 3 s, gloo says so,
    and torchrun's summary names rank 0 (the rank that noticed) as the root cause, with gloo's message."""
    hold = tmp_path / "hold.py"  # rank 1 sleeps instead of its first collective: rank 0 waits in it alone
    hold.write_text("import importlib.util, os, sys, time\n"
                    f"spec = importlib.util.spec_from_file_location('step3', {str(STEP3)!r})\n"
                    "step3 = importlib.util.module_from_spec(spec)\n"
                    "spec.loader.exec_module(step3)\n"
                    "if os.environ['RANK'] == '1':\n"
                    "    step3.check_all_reduce = lambda device: time.sleep(60)\n"
                    "step3.main(sys.argv[1:])\n")
    proc = run_torchrun(hold, ["--limit", "200", "--timeout", "3", "--out", tmp_path / "out"], timeout=120)
    assert proc.returncode != 0
    assert "Timed out waiting 3000ms for recv operation to complete" in proc.stderr, proc.stderr[-3000:]
    root = _summary(proc.stderr).split("Root Cause (first observed failure):", 1)[1]
    assert "rank      : 0 (local_rank: 0)" in root, root
    assert "Timed out waiting 3000ms for recv operation to complete" in root, root


# The script's own group timeout, one keyword of its init_process_group: the watch's default threshold is a quarter of
# it (10 s), with no flag; torch's default (30 min) gives a minute, as test_hangwatch.py's tests of the threshold say.
GROUP_TIMEOUT = 24
INIT = 'dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")'


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_rank_stuck_in_a_script_written_elsewhere_is_named_within_a_minute_with_no_flag(tmp_path):
    """Global rank 0 waits in a barrier inside its snapshot save, which rank 1 never calls (it goes on to the next
    epoch's backward): with no flag, the watch names the rank, the call and the line once a quarter of the group's
    timeout has passed (the script's own: 24 s, so 6 s), and says that its report is not a failure. The
    schedule, and the minute of torch's default timeout, are test_hangwatch.py's."""
    script, barrier = _elsewhere(tmp_path, 'print(f"Epoch {epoch} | snapshot saved at {self.snapshot_path}")',
                                 "dist.barrier()  # rank 0 only: the other rank never comes here",
                                 (INIT, f"{INIT[:-1]}, timeout=timedelta(seconds={GROUP_TIMEOUT}))"),
                                 ("import os", "import os\nfrom datetime import timedelta"))
    run = torchrun(["-m", "workshop_lib.watch", script, "2", "1", "--snapshot_path", tmp_path / "snapshot.pt"])
    try:
        assert run.wait_for(lambda: "[rank 0] epoch 0 | steps: 8" in run.output, 150), run.output[-3000:]
        stuck = time.monotonic()  # rank 0 printed its epoch and went to save: into the barrier
        whole = re.compile(r"hangwatch:   rank 0: .*\n(.*\n)*hangwatch:   rank 1: ")  # the block, to its last rank
        assert run.wait_for(lambda: whole.search(run.output), GROUP_TIMEOUT), run.output[-3000:]
        heard = time.monotonic() - stuck
    finally:
        stop(run)
    said = hangreport.block(run.lines)
    text = "\n".join(said)
    waited = re.match(r"rank (\d) has waited (\d+) s in ", said[0])
    threshold = GROUP_TIMEOUT / 4  # the default: a quarter of the group's timeout
    assert waited and int(waited.group(2)) >= threshold and heard < GROUP_TIMEOUT, (heard, text)
    assert said[1].startswith("a report, not a failure: the call may still complete") and \
        f"({GROUP_TIMEOUT} s)" in said[1], text
    assert re.search(rf"rank 0 (has waited \d+ s in|is in) barrier #1 \(no tensor\),? (called )?at \S*train\.py:"
                     rf"{barrier} in _save_snapshot\(\)", text), text  # the stuck rank, its call and its line
    assert f"train.py:{barrier}: dist.barrier()" in text and "never arrived: rank " in text, text
    assert f"train.py:{_line_of(script, 'loss.backward()')}: loss.backward()" in text, text  # where rank 1 is
    assert "[rank 1] epoch 0 | steps: 8" in run.output  # the script's own arguments and messages, through the watch
    assert not re.search(r"workshop_lib/|runpy", text), text


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_uneven_data_in_a_script_written_elsewhere_is_named_with_each_ranks_counts(tmp_path):
    """Rank 0 reads 32 molecules more than rank 1 (a file of its own, say), so 9 batches to rank 1's 8: rank 0's 9th
    backward waits for a rank that has finished. The watch, with no flag, prints each rank's count of backward passes
    beside the line, when the rank that left makes the waiting one fail."""
    script, _ = _elsewhere(tmp_path, "train_set = MyTrainDataset(512)",
                           "train_set = MyTrainDataset(544 if dist.get_rank() == 0 else 512)")
    run = torchrun(["-m", "workshop_lib.watch", script, "1", "1", "--snapshot_path", tmp_path / "snapshot.pt"])
    try:
        rc = run.wait(timeout=150)
    finally:
        stop(run)
    text = "\n".join(hangreport.block(run.lines))
    assert rc != 0, run.output[-3000:]
    assert re.search(rf"rank 0 failed after \d+ s \(.*\) in loss\.backward\(\) \(DDP's gradient buckets\), called at "
                     rf"\S*train\.py:{_line_of(script, 'loss.backward()')} in _run_batch\(\)", text), text
    # The suite's real run of a rank that left, named by the one left waiting (the words for a rank whose last
    # collective was a numbered one: test_hangwatch.py's test_ranks_that_left_in_backward_or_silent_are_each_explained).
    assert "rank 1 has left the job (it called destroy_process_group)" in text, text
    assert "calls entered so far: rank 0: 9 backward; rank 1: 8 backward (every rank must make the same calls as " \
           "often as the others; under DDP each backward all-reduces the gradients, so the ranks must also run as " \
           "many batches, or train inside DDP's join())" in text, text
