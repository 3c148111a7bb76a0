"""diagnose: every rank's stack, side by side, from a real 2-rank job that waits."""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import time

import psutil
import pytest

from tests.conftest import REPO, cpu_env
from tests.reliability import pyspy_attaches
from workshop_lib.debug import hangreport, stacks
from workshop_lib.debug.stacks import Rank, side_by_side
from workshop_lib.launching.launch import torchrun_argv
from workshop_lib.launching.processes import kill_tree

WORKER = REPO / "tests" / "workers" / "hang_worker.py"


def line_of(marker: str) -> int:
    return next(i for i, text in enumerate(WORKER.read_text().splitlines(), 1) if marker in text)


def test_columns_line_up_the_innermost_frames():
    text = side_by_side([Rank(0, 10, ["a.py:1 main()", "a.py:9 train()"], "py-spy"),
                         Rank(1, 11, ["a.py:1 main()", "a.py:5 f()", "a.py:4 evaluate()"], "SIGUSR1 -> log")], width=20)
    rows = text.splitlines()
    assert rows[0].startswith("rank 0 (pid 10)") and "rank 1 (pid 11)" in rows[0]
    assert rows[-2].startswith("a.py:9 train()") and rows[-2].endswith("a.py:4 evaluate()")  # bottom rows: innermost
    assert rows[-1] == "rank 1: SIGUSR1 -> log"


def test_a_handler_for_sigusr1_is_seen_before_signalling():
    before = stacks._catches_sigusr1(os.getpid())
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        assert stacks._catches_sigusr1(os.getpid())
    finally:
        faulthandler.unregister(signal.SIGUSR1)
    assert stacks._catches_sigusr1(os.getpid()) == before


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_diagnose_shows_both_ranks_of_a_waiting_job_with_py_spy_and_with_the_signal(tmp_path):
    """Rank 0 waits in all_reduce, rank 1 sits in evaluate(): both stacks, by py-spy and by SIGUSR1 into the log."""
    log, record = tmp_path / "job.log", tmp_path / "hang.json"
    with open(log, "w") as out:
        job = subprocess.Popen(torchrun_argv(WORKER, 2, watch=["--after", 1], args=["wait", 120]), cwd=REPO,
                               env=cpu_env(**{hangreport.RECORD_VARIABLE: str(record)}), stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not hangreport.load(record):  # the watch has spoken: rank 0 is in all_reduce #2, rank 1 in evaluate()
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        waiting, busy = f"hang_worker.py:{line_of('rank 0 waits here')}", f"hang_worker.py:{line_of('rank 1 is here')}"

        text = stacks.main([str(job.pid), "--width", "70"])
        assert "rank 0 (pid" in text and "rank 1 (pid" in text, text
        assert waiting in text and busy in text, text
        if pyspy_attaches():
            assert "SIGUSR1" not in text, text  # py-spy attached; without ptrace rights the signal answered instead

        workers = [p.pid for p in psutil.Process(job.pid).children(recursive=True)]
        text = stacks.main([str(workers[-1]), "--no-py-spy", "--width", "70"])  # by a rank's pid, via the signal
        assert waiting in text and busy in text, text
        assert f"SIGUSR1 -> {log}" in text, text
    finally:
        kill_tree(job, grace=0, first=signal.SIGKILL)
        job.wait(timeout=30)
