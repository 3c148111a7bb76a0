"""launch.torchrun and forklaunch.notebook_launch: output per rank, metrics back, failures and hangs stopped."""

from __future__ import annotations

import _thread
import datetime
import gc
import signal
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import psutil
import pytest
import torch
import torch.distributed as dist

from tests.conftest import SOLUTIONS
from tests.reliability import pyspy_attaches, still_alive
from workshop_lib.errors import WorkshopError
from workshop_lib.launching import ends, forklaunch, launch, spawning

SCRIPT = """
import argparse, json, os, sys, time
from pathlib import Path
from workshop_lib.debug.launchenv import read_launch_env
p = argparse.ArgumentParser()
p.add_argument("--out", type=Path)
p.add_argument("--mode", default="ok")
a = p.parse_args()
env = read_launch_env()
(a.out / f"pid{env.rank}").write_text(str(os.getpid()))
print(f"hello from {env.rank} of {env.world_size} threads={os.environ.get('OMP_NUM_THREADS')}", flush=True)
if a.mode == "fail" and env.rank == 1:
    print("rank one gives up", file=sys.stderr, flush=True)
    raise SystemExit(3)
if a.mode == "hang":
    time.sleep(600)
if env.rank == 0:
    print("epoch 1/1  train loss 0.5", flush=True)
    (a.out / "metrics.json").write_text(json.dumps({"answer": 42}))
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "tiny.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return path


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_torchrun_shows_rank0_and_returns_its_metrics(script, tmp_path, capsys):
    result = launch.torchrun(script, 2, ["--mode", "ok"], out=tmp_path, timeout=120)
    captured = capsys.readouterr()
    shown = captured.out.splitlines()
    assert shown[0].startswith("$ torchrun --standalone --nproc_per_node=2 -m workshop_lib.watch ")  # the hang watch
    assert shown[0].endswith(f"tiny.py --mode ok --out {tmp_path}")
    assert "hello from 0 of 2 threads=1" in shown
    assert not any("hello from 1" in line for line in shown)  # rank 1's lines are kept, not shown
    assert dict(result) == {"answer": 42}
    assert result.rank_lines(1) == ["hello from 1 of 2 threads=1"]
    assert result.command == shown[0][2:]
    assert "1/1" in captured.err  # ours, fed by rank 0's "epoch 1/1" line


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_torchrun_failure_raises_with_the_ranks_last_lines_and_show_all_labels_them(script, tmp_path, capsys):
    with pytest.raises(launch.LaunchError, match="exited with code 1") as err:
        launch.torchrun(script, 2, ["--mode", "fail"], out=tmp_path, timeout=120, progress=False, show="all")
    assert "[rank 1] rank one gives up" in str(err.value)
    shown = capsys.readouterr().out.splitlines()
    assert "[rank 0] hello from 0 of 2 threads=1" in shown
    assert "[rank 1] hello from 1 of 2 threads=1" in shown


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_torchrun_timeout_stops_every_rank(script, tmp_path):
    """Every process the launch started is gone: torchrun, and the ranks it had started by then (in ~3 s here;
    on a busy machine, maybe none yet, so they are collected as they appear rather than expected by a time)."""
    before, seen, ended = _children(), set(), threading.Event()

    def collect_the_launch_processes():
        while not ended.is_set():
            seen.update(_started_since(before))
            time.sleep(0.05)

    threading.Thread(target=collect_the_launch_processes, daemon=True).start()
    try:
        with pytest.raises(launch.LaunchError, match="timed out after"):
            launch.torchrun(script, 2, ["--mode", "hang"], out=tmp_path, timeout=7, progress=False)
    finally:
        ended.set()
    written = [p.read_text().strip() for p in tmp_path.glob("pid*")]  # the ranks that got that far
    pids = sorted(seen | {int(pid) for pid in written if pid})
    assert pids
    assert still_alive(pids, timeout=10) == []  # gone, or at most zombies awaiting their reaper


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_stop_button_interrupts_every_rank_as_ctrl_c_does(script, tmp_path, capsys):
    """JupyterLab's stop button raises KeyboardInterrupt in the kernel: torchrun gets SIGINT, as from a terminal."""
    (tmp_path / "snapshot.pt").write_bytes(b"")  # as step 3 leaves one

    # A kernel's SIGINT handler raises KeyboardInterrupt; interrupt_main() does nothing under SIG_IGN or SIG_DFL,
    # which something earlier in a long pytest session may have left behind.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _press_stop_when(lambda: all((tmp_path / f"pid{r}").exists() for r in (0, 1)))
        with pytest.raises(KeyboardInterrupt):
            launch.torchrun(script, 2, ["--mode", "hang"], out=tmp_path, timeout=60, progress=False)
    finally:
        signal.signal(signal.SIGINT, before)
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in (0, 1)]
    assert still_alive(pids, timeout=10) == []
    err = capsys.readouterr().err
    assert err.strip().endswith(f"the last whole snapshot is {tmp_path / 'snapshot.pt'}: run the same command "
                                f"again to resume from it"), err


def test_torchrun_refuses_a_missing_script_and_a_bad_show():
    with pytest.raises(WorkshopError, match="not found"):
        launch.torchrun("solutions/no_such_step.py")
    with pytest.raises(WorkshopError, match="show='rank0', 'all' or None"):
        launch.torchrun(SOLUTIONS / "step1_process_group.py", show="rank1")


def _all_reduce(env, scale):
    t = torch.tensor([env.rank + 1.0])
    dist.all_reduce(t)
    print(f"rank {env.rank} holds {t.item():g}")
    return env.rank, env.world_size, t.item() * scale


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_notebook_launch_returns_every_rank_in_order(capsys):
    assert forklaunch.notebook_launch(_all_reduce, 2, 10.0) == [(0, 2, 30.0), (1, 2, 30.0)]
    assert capsys.readouterr().out == "rank 0 holds 3\n"  # only rank 0 speaks


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_launch_leaves_no_pipe_open_in_the_kernel():
    """Each rank's pipes close as its launch ends (a failed one's too), not at a full garbage collection."""
    forklaunch.notebook_launch(_all_reduce, 2, 1.0)  # what a first launch opens for good (spawn's resource tracker)
    before, _ = psutil.Process().num_fds(), gc.disable()  # closed by the launch, not by a collection
    try:
        forklaunch.notebook_launch(_all_reduce, 2, 1.0)
        with pytest.raises(forklaunch.RanksFailed):
            forklaunch.notebook_launch(_fail_on_rank1, 2)
        assert psutil.Process().num_fds() == before
    finally:
        gc.enable()


def _fail_on_rank1(env):
    if env.rank == 1:
        raise ValueError("rank 1 is unhappy")
    return env.rank


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_notebook_launch_names_the_failing_rank_in_one_line_and_keeps_the_logs_in_a_file(capfd):
    with pytest.raises(launch.LaunchError) as err:
        forklaunch.notebook_launch(_fail_on_rank1, 2)
    lines = str(err.value).splitlines()
    assert lines[0] == "notebook_launch of _fail_on_rank1 failed:"
    assert lines[1].startswith("rank 1 raised ValueError: rank 1 is unhappy (File ") and "in _fail_on_rank1" in lines[1]
    assert lines[2].startswith("every rank's output: ") and len(lines) == 3
    logs = Path(lines[2].split(": ", 1)[1]).read_text()
    assert 'raise ValueError("rank 1 is unhappy")' in logs  # the rank's own traceback
    shown = capfd.readouterr()
    assert "api.py" not in shown.err + shown.out and "Traceback" not in shown.err + shown.out  # none of it in the cell


def _hang_on_rank1(env):
    if env.rank == 1:
        time.sleep(600)
    return env.rank


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_notebook_launch_times_out_and_keeps_where_each_rank_was():
    with pytest.raises(forklaunch.LaunchTimeout, match="did not finish within 5s") as err:
        forklaunch.notebook_launch(_hang_on_rank1, 2, timeout=5)
    assert [(e["rank"], e["how"]) for e in err.value.ends] == [(0, "timed out"), (1, "timed out")]
    all_log = Path(str(err.value).rsplit("every rank's output: ", 1)[1].strip())
    stacks = all_log.read_text().split("===== stacks at the timeout\n", 1)
    assert len(stacks) == 2, all_log.read_text()[-2000:]
    if pyspy_attaches():  # rank 1's stack names the function it is stuck in
        assert "_hang_on_rank1" in stacks[1], stacks[1][-3000:]


def _all_reduce_on_rank0_only(env):
    if env.rank == 0:
        dist.all_reduce(torch.tensor([1.0]))
    else:
        time.sleep(600)  # never joins: the hang watch names it; the launch stops at once instead of at its timeout


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_notebook_launch_with_hang_after_names_the_missing_rank_and_stops_early():
    before = _children()
    with pytest.raises(forklaunch.HangError) as err:
        forklaunch.notebook_launch(_all_reduce_on_rank0_only, 2, timeout=100, hang_after=2)
    # HangError comes only from the watch's saved record (a timeout raises LaunchTimeout): no time window needed
    waited = [(e["rank"], e["how"], e["call"], e["function"]) for e in err.value.ends]  # each rank's end, as fields
    assert waited == [(0, "waiting", "all_reduce #1", "_all_reduce_on_rank0_only"),
                      (1, "waiting", None, "_all_reduce_on_rank0_only")], err.value.ends
    assert err.value.diagnosis.startswith("rank 0 waits in all_reduce #1 (called at ")
    assert "in _all_reduce_on_rank0_only()); rank 1 never joined it: it is in _all_reduce_on_rank0_only() at " \
        in err.value.diagnosis
    assert f"the ranks hang: {err.value.diagnosis}" in str(err.value)
    assert still_alive(_started_since(before), timeout=10) == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_stop_while_the_ranks_start_leaves_none_behind():
    """The press lands while the launcher is still forking: a rank it had not registered yet must die too."""
    before = _children()
    _press_stop_when(lambda: bool(_started_since(before)))
    with pytest.raises(KeyboardInterrupt):
        forklaunch.notebook_launch(_wait_for_the_stop_button, 2, timeout=100)
    assert still_alive(_started_since(before), timeout=10) == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_stop_while_a_rank_waits_in_a_store_ends_at_once(tmp_path):
    """A rank waiting in a store (as one does in init_process_group for a peer that has not come yet) runs no
    Python signal handler, and no peer's exit wakes it: torch's close would give it 30 s; the stop kills it at once."""
    before, waiting = _children(), tmp_path / "rank0-waits"
    _press_stop_when(waiting.exists)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt, match="every rank stopped"):
        forklaunch.notebook_launch(_rank0_waits_in_a_store, 2, str(tmp_path), timeout=100)
    assert time.monotonic() - start < 8
    assert still_alive(_started_since(before), timeout=10) == []


def _rank0_waits_in_a_store(env, folder: str):
    if env.rank == 0:
        store = dist.FileStore(str(Path(folder) / "store"), 2)
        Path(folder, "rank0-waits").touch()
        store.wait(["never set"], datetime.timedelta(seconds=100))
    time.sleep(600)


def _press_stop_when(ready: Callable[[], bool]) -> None:
    """The stop button, pressed from another thread once ``ready()``: a KeyboardInterrupt in this (the main) thread."""
    def press():
        while not ready():
            time.sleep(0.01)
        _thread.interrupt_main()
    threading.Thread(target=press, daemon=True).start()


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _started_since(before: set[int]) -> list[int]:
    """This process's descendants that a launch started (an earlier test's leftovers are not this test's)."""
    return sorted(_children() - before)


def _wait_for_the_stop_button(env):
    time.sleep(600)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_notebook_launch_stop_button_stops_every_rank_and_leaves_the_kernel_as_it_was():
    handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    before = _children()
    _press_stop_when(lambda: len(_started_since(before)) >= 2)
    with pytest.raises(KeyboardInterrupt, match="interrupted; every rank stopped"):
        forklaunch.notebook_launch(_wait_for_the_stop_button, 2, timeout=100)
    assert still_alive(_started_since(before), timeout=10) == []
    # torch's launcher installs its own handlers; the next stop must still be a KeyboardInterrupt
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    assert forklaunch.notebook_launch(_all_reduce, 2, 1.0)[0] == (0, 2, 3.0)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("before", [signal.SIG_IGN, signal.SIG_DFL], ids=["SIG_IGN", "SIG_DFL"])
def test_the_stop_button_stops_every_rank_whatever_sigint_did_before(before):
    """SIG_IGN: what a shell gives a command started with ``&`` (pytest beside another job), under which
    interrupt_main() alone does nothing; SIG_DFL: a real SIGINT would kill the launcher and leave its ranks."""
    ahead = _children()
    kernel = signal.signal(signal.SIGINT, before)
    try:
        _press_stop_when(lambda: len(_started_since(ahead)) >= 2)
        with pytest.raises(KeyboardInterrupt, match="interrupted; every rank stopped"):
            forklaunch.notebook_launch(_wait_for_the_stop_button, 2, timeout=100)
        assert signal.getsignal(signal.SIGINT) == before  # given back
    finally:
        signal.signal(signal.SIGINT, kernel)
    assert still_alive(_started_since(ahead), timeout=10) == []


KERNEL = """
import datetime, os, sys, time
from pathlib import Path
import torch.distributed as dist
from workshop_lib.launching import forklaunch

def wait(env, folder):
    Path(folder, f"pid{env.rank}.tmp").write_text(str(os.getpid()))
    os.replace(Path(folder, f"pid{env.rank}.tmp"), Path(folder, f"pid{env.rank}"))  # whole when seen
    if env.rank == 0:  # in C++, where no Python handler runs
        dist.FileStore(str(Path(folder) / "store"), 2).wait(["never set"], datetime.timedelta(seconds=100))
    time.sleep(600)

try:
    forklaunch.notebook_launch(wait, 2, sys.argv[1], timeout=100)
except KeyboardInterrupt as err:
    print(f"KeyboardInterrupt: {err}", flush=True)
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_stop_button_as_jupyter_presses_it_sigint_to_the_kernels_process_group(tmp_path):
    """jupyter_client interrupts a kernel with SIGINT to its process group: the kernel and, with it, every rank."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO, cpu_env

    kernel = subprocess.Popen([sys.executable, "-c", KERNEL, str(tmp_path)], cwd=REPO, env=cpu_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        while not all((tmp_path / f"pid{r}").exists() for r in (0, 1)):
            assert kernel.poll() is None, kernel.communicate()[0][-3000:]
            time.sleep(0.05)
        os.killpg(kernel.pid, signal.SIGINT)
        out, _ = kernel.communicate(timeout=30)
    finally:
        if kernel.poll() is None:
            os.killpg(kernel.pid, signal.SIGKILL)
            kernel.wait()
    assert "KeyboardInterrupt: notebook_launch of wait interrupted; every rank stopped" in out, out[-3000:]
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in (0, 1)]
    assert still_alive(pids, timeout=10) == []


@pytest.mark.timeout(60)
def test_a_press_in_the_middle_of_the_forks_kills_both_ranks_once_they_exist():
    """The press lands before the first fork; it is honoured when start() returns, with every rank known."""
    import torch.multiprocessing

    from workshop_lib.launching.ranks import Ranks

    ranks = Ranks(_sleep, {0: (), 1: ()}, {0: {}, 1: {}}, "fork")
    real = torch.multiprocessing.start_processes

    def pressed_while_starting(*args, **kwargs):
        _thread.interrupt_main()  # in this thread: the handler runs at the next line of Python, in the forks
        return real(*args, **kwargs)

    kernel = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with (mock.patch.object(torch.multiprocessing, "start_processes", side_effect=pressed_while_starting),
              pytest.raises(KeyboardInterrupt)):
            ranks.start()
        assert len(ranks.pids()) == 2
        assert still_alive(list(ranks.pids().values()), timeout=10) == []  # killed before the raise
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        ranks.stop()
        signal.signal(signal.SIGINT, kernel)


@pytest.mark.timeout(60)
def test_a_press_while_the_ranks_are_reaped_comes_after_the_reaping():
    """stop() is not cut short: both ranks killed and reaped, SIGINT given back, then one KeyboardInterrupt."""
    from workshop_lib.launching import ranks as ranks_module

    ranks = ranks_module.Ranks(_sleep, {0: (), 1: ()}, {0: {}, 1: {}}, "fork")
    real, presses = ranks_module.kill_tree, []

    def pressed_while_killing(*args, **kwargs):
        presses.append(args[0])
        _thread.interrupt_main()  # twice: the second asks for the stop already under way
        return real(*args, **kwargs)

    kernel = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        ranks.start()
        pids = ranks.pids()
        with (mock.patch.object(ranks_module, "kill_tree", side_effect=pressed_while_killing),
              pytest.raises(KeyboardInterrupt)):
            ranks.stop()
        assert sorted(presses) == sorted(pids.values())
        assert not any(psutil.pid_exists(pid) for pid in presses)  # reaped: not even a zombie
        assert signal.getsignal(signal.SIGINT) == signal.default_int_handler
        ranks.stop()  # a second stop: nothing left to do, no second KeyboardInterrupt
    finally:
        signal.signal(signal.SIGINT, kernel)


def test_notebook_launch_refuses_after_cuda_was_initialised(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setenv(spawning.START_METHOD, "fork")  # fork's refusal: a spawned rank may use CUDA
    with pytest.raises(WorkshopError, match="restart the kernel"):
        forklaunch.notebook_launch(_all_reduce, 2, 1.0)


def test_lines_that_torchrun_tee_ran_together_are_split_again():
    import io
    import queue

    from workshop_lib.launching import launch

    lines: queue.Queue = queue.Queue()
    launch._reader(io.StringIO("[default0]:done: 3 steps, replica_spread 0[default0]:\n[default1]:x [y]\n"
                               "[default1]:[rank1]: RuntimeError: a rank's own label stays[default1]:next\n"), lines)
    got = []
    while (line := lines.get()) is not None:
        got.append(line)
    assert got == ["[default0]:done: 3 steps, replica_spread 0", "[default1]:x [y]",
                   "[default1]:[rank1]: RuntimeError: a rank's own label stays", "[default1]:next"]


@pytest.mark.parametrize(("flags", "watch", "argv"), [
    ((), False, ["tiny.py", "--x"]),
    (("--tee", "3"), True, ["--tee", "3", "-m", "workshop_lib.watch", "tiny.py", "--x"]),
])
def test_start_job_runs_torchrun_with_the_watch_before_the_script(monkeypatch, flags, watch, argv):
    """-m workshop_lib.watch (torchrun's way to run a module) goes after torchrun's flags, before the script."""
    started = {}
    monkeypatch.setattr(launch.subprocess, "Popen", lambda cmd, **kw: started.update(cmd=cmd, env=kw["env"]))
    launch.start_job(Path("tiny.py"), ["--x"], 2, flags, watch=watch)
    assert started["cmd"][5:] == argv and started["cmd"][1:5] == ["-m", "torch.distributed.run", "--standalone",
                                                                    "--nproc_per_node=2"]


def _fail_on_rank1_while_rank0_waits_in_a_store(env, folder: str):
    if env.rank == 1:
        while not Path(folder, "rank0-waits").exists():
            time.sleep(0.01)
        raise ValueError("rank 1 gives up")
    _rank0_waits_in_a_store(env, folder)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rank_that_fails_while_its_peer_waits_in_a_store_ends_the_launch_at_once(tmp_path):
    """torch's own close, after a failure, gives the others SIGTERM and 30 s: a rank in a store's wait runs no handler."""
    before, start = _children(), time.monotonic()
    with pytest.raises(launch.LaunchError) as err:
        forklaunch.notebook_launch(_fail_on_rank1_while_rank0_waits_in_a_store, 2, str(tmp_path), timeout=100)
    assert time.monotonic() - start < 8
    assert str(err.value).splitlines()[1].startswith("rank 1 raised ValueError: rank 1 gives up (File ")
    assert still_alive(_started_since(before), timeout=10) == []


def _sleep():
    time.sleep(60)


@pytest.mark.timeout(60)
def test_a_stop_that_comes_while_the_ranks_start_reaches_the_callers_handler_once_they_all_exist(monkeypatch):
    import os

    import torch.multiprocessing

    from workshop_lib.launching.ranks import Ranks

    ranks, seen = Ranks(_sleep, {0: (), 1: ()}, {0: {}, 1: {}}, "fork"), []
    real = torch.multiprocessing.start_processes

    def stopped_while_starting(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler's stop would, in the middle of the forks
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.multiprocessing, "start_processes", stopped_while_starting)
    before = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(len(ranks.pids())))  # the caller's
    try:
        ranks.start()
        assert seen == [2]  # delivered once, after the start, when both ranks were known
    finally:
        ranks.stop()
        signal.signal(signal.SIGTERM, before)
    assert still_alive(list(ranks.pids().values()), timeout=10) == []


def _join_on_rank1_only(env):
    """04a section 1's mistake: uneven batches, Join enabled on one rank only; its collectives and DDP's then differ."""
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workshop_lib.model import SmilesLSTM

    torch.manual_seed(0)
    model = DDP(SmilesLSTM(12), process_group=dist.new_group(timeout=datetime.timedelta(seconds=5)))
    tokens, lengths = torch.randint(1, 12, (4, 6)), torch.tensor([6, 5, 3, 2])  # (B, T), a padded batch
    with Join([model], enable=env.rank == 1):
        for _ in range(2 if env.rank == 0 else 4):
            model(tokens, lengths).sum().backward()
    dist.barrier()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rank_that_dies_in_cpp_is_named_first_with_its_signal_and_last_lines_then_its_peers_echo():
    with pytest.raises(forklaunch.RanksFailed) as err:
        forklaunch.notebook_launch(_join_on_rank1_only, 2, timeout=60)
    died, echo = map(ends.summary, err.value.ends)
    # rank 1's Join all-reduces a count where rank 0's DDP all-reduces the gradients: gloo aborts in C++
    assert died.startswith("rank 1 died of SIGABRT (exit code -6) without a Python error; its last lines: "), died
    assert "gloo::EnforceNotMet" in died and "Is there a distributed collective mismatch" in died, died
    assert echo.startswith("rank 0 raised RuntimeError: ") and "peer" in echo, echo  # the survivor, after it
    assert str(err.value).splitlines()[1:3] == [died, echo]
    assert err.value.ends[0]["how"] == "killed" and err.value.ends[0]["signal"] == "SIGABRT"
    assert "collective mismatch" in err.value.ends[0]["detail"]


JOIN_ON_ONE_RANK = """
import torch, torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from workshop_lib.model import SmilesLSTM

@record
def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(SmilesLSTM(12))
    tokens, lengths = torch.randint(1, 12, (4, 6)), torch.tensor([6, 5, 3, 2])
    with Join([model], enable=rank == 1):  # the mistake: Join on one rank only
        for _ in range(2 if rank == 0 else 4):
            model(tokens, lengths).sum().backward()
    dist.destroy_process_group()

main()
"""


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_torchrun_failure_names_every_rank_that_ended_the_one_aborted_in_cpp_first(tmp_path):
    script = tmp_path / "join_on_one_rank.py"
    script.write_text(JOIN_ON_ONE_RANK)
    with pytest.raises(launch.LaunchError) as err:
        launch.torchrun(script, 2, out=False, timeout=120, progress=False, show=None, watch=False)
    lines = str(err.value).splitlines()
    assert lines[0].startswith("torchrun exited with code 1 (torchrun logs: ")
    died, echo = lines[1:3]
    assert died.startswith("rank 1 died of SIGABRT (exit code -6) without a Python error; its last lines: "), died
    assert "gloo::EnforceNotMet" in died and "Is there a distributed collective mismatch" in died, died
    assert echo.startswith("rank 0 raised RuntimeError: ") and "peer" in echo, echo
    assert lines[3] == "Last lines:"
