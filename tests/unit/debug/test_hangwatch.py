"""hangwatch: the diagnosis from the ranks' answers, and real 2-rank jobs with the watch attached from outside."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from tests.conftest import REPO, cpu_env
from tests.reliability import RESTARTS
from workshop_lib.debug import collectives, hangreport, hangwatch, rankwatch
from workshop_lib.debug.hangreport import explain
from workshop_lib.launching.launch import torchrun_argv

WORKER = REPO / "tests" / "workers" / "hang_worker.py"


def answer(rank, frames, current=None, last=None, history=(), left=False, inner=""):
    return {"rank": rank, "asked": 1, "pid": 100 + rank, "frames": frames, "inner": inner, "current": current,
            "last": last, "history": list(history), "left": left}


def call(op, seq, tensors="float32[3]", where="t.py:9 in train()", t=0.0):
    """An entry of a rank's record of calls (collectives.entry), as its answer holds it."""
    return {"kind": collectives.kind_of(op), "name": op, "seq": seq, "n": 1, "tensors": tensors, "t": t, "where": where}


STUCK = call("all_reduce", 2)


def test_a_rank_elsewhere_is_named_with_its_function_and_line():
    answers = {0: answer(0, [["t.py", 20, "main", ""], ["t.py", 9, "train", "dist.all_reduce(x)"]],
                         current=call("all_reduce", 2), history=[call("all_reduce", 1), call("all_reduce", 2)]),
               1: answer(1, [["t.py", 20, "main", ""], ["t.py", 4, "evaluate", "time.sleep(9)"]],
                         last=call("all_reduce", 1), history=[call("all_reduce", 1)])}
    report = explain(0, STUCK, "has waited 6 s", answers, 2)
    lines, text = report["block"], "\n".join(report["block"])
    assert lines[0] == "rank 0 has waited 6 s in all_reduce #2 (float32[3]), called at t.py:9 in train()"
    assert "never arrived: rank 1" in text and report["missing"] == [1]
    assert "rank 1 never entered all_reduce #2: it is in evaluate() at t.py:4" in text
    assert "its last collective was all_reduce #1" in text
    assert "rank 1: t.py:20 main() > t.py:4 evaluate()" in text


def test_different_shapes_and_different_ops_are_told_apart():
    mine = call("all_reduce", 2)
    shapes = {0: answer(0, [], current=mine, history=[mine]),
              1: answer(1, [], current=call("all_reduce", 2, "float32[1]"), history=[call("all_reduce", 2, "float32[1]")])}
    text = "\n".join(explain(0, STUCK, "has waited 6 s", shapes, 2)["block"])
    assert "with float32[1] where rank 0 has float32[3]" in text and "same shape and dtype" in text
    assert "first differ (op, tensors or call site) at #2" in text
    ops = {0: answer(0, [], current=mine), 1: answer(1, [], current=call("all_gather", 2, where="t.py:7 in f()"))}
    assert "rank 1 is in all_gather #2 (float32[3]) at t.py:7 in f(), not in all_reduce #2" in "\n".join(
        explain(0, STUCK, "has waited 6 s", ops, 2)["block"])


def test_ranks_that_left_in_backward_or_silent_are_each_explained():
    answers = {0: answer(0, []), 1: answer(1, [], left=True, last=call("all_gather", 7)),
               2: answer(2, [["t.py", 3, "step", "loss.backward()"]], current=call("backward", None, "DDP's buckets"))}
    report = explain(0, STUCK, "has waited 6 s", answers, 4)
    text = "\n".join(report["block"])
    assert "never arrived: rank 1, 2, 3" in text and report["missing"] == [1, 2, 3]
    assert "rank 1 has left the job (it called destroy_process_group); its last collective was all_gather #7" in text
    assert "rank 2 never entered all_reduce #2: it is in loss.backward()" in text
    assert "rank 3 did not answer" in text


def test_one_line_says_who_waits_where_and_what_the_missing_rank_does_instead():
    mine = call("all_reduce", 2)
    elsewhere = {0: answer(0, [], current=mine), 1: answer(1, [], current=call("all_gather", 2, where="t.py:7 in f()"))}
    assert explain(0, STUCK, "has waited 6 s", elsewhere, 2)["line"] == (
        "rank 0 waits in all_reduce #2 (called at t.py:9 in train()); rank 1 never joined it: it is in "
        "all_gather #2 (float32[3]) at t.py:7 in f()")
    backward = {0: answer(0, [], current=mine),
                1: answer(1, [["t.py", 3, "step", "loss.backward()"]], current=call("backward", None, "DDP's buckets"))}
    assert explain(0, STUCK, "has waited 6 s", backward, 2)["line"] == (
        "rank 0 waits in all_reduce #2 (called at t.py:9 in train()); rank 1 never joined it: it is in "
        "loss.backward(), where DDP all-reduces the gradients (step() at t.py:3)")
    left = {0: answer(0, [], current=mine), 1: answer(1, [], left=True)}
    assert explain(0, STUCK, "has waited 6 s", left, 2)["line"].endswith(
        "rank 1 never joined it: it has left the job (it called destroy_process_group)")
    shapes = {0: answer(0, [], current=mine), 1: answer(1, [], current=call("all_reduce", 2, "float32[1]"))}
    assert explain(0, STUCK, "has waited 6 s", shapes, 2)["line"].endswith(
        "rank 1 is in it too, but with float32[1] where rank 0 has float32[3]: every rank must pass the same "
        "shape and dtype")


def counted(rank, counts, **kw):
    return {**answer(rank, [], **kw), "counts": counts}


@pytest.mark.parametrize(("counts", "said"), [
    (({"all_reduce": 9, "backward": 8}, {"all_reduce": 8, "backward": 8}),
     "calls entered so far: rank 0: 9 all_reduce, 8 backward; rank 1: 8 all_reduce, 8 backward (every rank must make "
     "the same calls as often as the others)"),
    (({"backward": 9}, {"all_gather": 1, "backward": 8, "send": 2}),  # uneven data: rank 0 began a 9th step
     "calls entered so far: rank 0: 0 all_gather, 9 backward; rank 1: 1 all_gather, 8 backward (every rank must make "
     "the same calls as often as the others; under DDP each backward all-reduces the gradients, so the ranks must "
     "also run as many batches, or train inside DDP's join())"),
    (({"all_reduce": 2, "send": 1}, {"all_reduce": 2, "recv": 1}), None),  # the same counts but point-to-point
])
def test_the_ranks_counts_of_calls_are_printed_where_they_differ(counts, said):
    answers = {r: counted(r, c, current=call("all_reduce", 2) if r == 0 else None) for r, c in enumerate(counts)}
    report = explain(0, STUCK, "has waited 6 s", answers, 2)
    assert [line for line in report["block"] if line.startswith("calls entered")] == ([said] if said else [])
    assert "calls entered" not in report["line"]  # the one line as before


def test_the_schedule_of_reports_doubles_the_wait():
    assert [rankwatch.report_at(60.0, n) for n in range(5)] == [60, 120, 240, 480, 960]  # 1, 2, 4, 8, 16 min
    assert [rankwatch.duration(s) for s in (61.4, 119, 120, 240)] == ["61 s", "119 s", "2 min", "4 min"]


def test_attach_in_a_world_of_one_changes_nothing(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # plain python: no torchrun variables
    before = dist.all_reduce
    assert hangwatch.attach() is None
    assert dist.all_reduce is before


def test_install_in_a_world_of_one_changes_nothing():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=10))
    try:
        before = dist.all_reduce
        assert hangwatch.install(dist.HashStore()) is None
        assert dist.all_reduce is before
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(("given", "threshold"), [({"timeout": timedelta(seconds=40)}, 10.0),
                                                  ({"timeout": timedelta(seconds=120)}, 30.0),  # the step scripts'
                                                  ({}, 60.0)])
def test_the_default_threshold_is_a_quarter_of_the_timeout_the_script_gives_its_group(monkeypatch, given, threshold):
    """attach (before the script) sees init_process_group's timeout, a quarter of it at most a minute; none given:
    torch's default for gloo, 30 min, so a minute."""
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun tells rank 0 of 2; the group below is a world of one
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv(hangwatch.AFTER_VARIABLE, raising=False)
    original = dist.init_process_group
    watch = hangwatch.attach(poll=0.01)
    try:
        assert dist.init_process_group is not original  # recorded, call-through
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, **given)
        watch.join()
        assert (watch.group_timeout, watch.threshold, watch.saw_group) == (given.get("timeout"), threshold, True)
        assert watch.timeout() == (given.get("timeout") or dist.default_pg_timeout).total_seconds()
    finally:
        hangwatch.detach()
        dist.destroy_process_group()
    assert dist.init_process_group is original and dist.all_reduce.__module__.startswith("torch")


def test_a_watch_that_did_not_see_the_group_made_takes_torchs_default_for_its_backend():
    assert rankwatch.default_threshold(timedelta(seconds=8)) == 5.0  # never below 5 s
    assert rankwatch.default_threshold(timedelta(minutes=10)) == 60.0  # nccl's default: never above a minute
    assert rankwatch.group_timeout() == dist.default_pg_timeout == timedelta(minutes=30)  # no group: gloo's
    assert rankwatch.default_threshold() == 60.0


def test_a_ranks_answer_is_its_record_of_calls_backward_calls_included():
    """Under DDP each backward() all-reduces the gradients: the record holds them in order, for the ranks' sequences,
    and counts every call by name from the entries' own numbers."""
    watch = hangwatch.Watch(threshold=60, poll=60, record=None, store=dist.HashStore())
    x = torch.ones(2)
    for op in ("all_reduce", "backward", "backward", "all_gather"):
        watch.calls.leave(watch.calls.enter(op, (x,), {}), None)
    watch.calls.enter("backward", (), {})  # the third one, still running
    said = json.loads(watch.where(1))
    assert [(c["name"], c.get("seq"), c["n"]) for c in said["history"]] == [
        ("all_reduce", 1, 1), ("backward", None, 1), ("backward", None, 2), ("all_gather", 2, 1), ("backward", None, 3)]
    assert said["current"] == said["history"][-1] and said["last"] == said["history"][3]
    assert said["counts"] == {"all_reduce": 1, "backward": 3, "all_gather": 1}  # every call entered, by name


@pytest.fixture
def group_of_two(monkeypatch):
    """A real gloo group of one that the watch takes for two ranks: its thread serves, with nobody to answer."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=10))
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(rankwatch, "_warned", False)
    try:
        yield
    finally:
        hangwatch.detach()
        dist.destroy_process_group()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("error", "said"), [
    (TypeError("a bug in the watch"), "stopped watching rank 0 (TypeError: a bug in the watch); the job runs on "
                                      "unwatched"),
    (dist.DistNetworkError("Broken pipe"), None),  # the store's host ended first: expected at the end of a job
])
def test_a_watch_that_fails_says_so_in_one_line_except_when_the_store_is_gone(group_of_two, monkeypatch, capsys,
                                                                              error, said):
    def fails(self):
        raise error

    monkeypatch.setattr(hangwatch.Watch, "unfinished_on_gpu", fails)  # called on every poll of the thread
    watch = hangwatch.install(dist.HashStore(), threshold=60, poll=0.01)
    watch.thread.join(timeout=20)  # the thread ends on the failure
    assert not watch.thread.is_alive()
    lines = capsys.readouterr().err.splitlines()
    assert lines == ([hangwatch.WARNING + said] if said else [])


def test_a_recorder_beside_the_watch_keeps_the_watchs_record_the_same_entry_for_both(group_of_two):
    """The checker's runner and the notebooks' ranks run both in a rank: one wrapper, one record, each call's entry
    in the recorder's events and in what the watch answers."""
    from workshop_lib.engine import recorder

    watch = hangwatch.install(dist.HashStore(), threshold=60, poll=60)
    wrapped, rec = dist.all_reduce, recorder.Recorder()
    with recorder.recording(rec):
        assert dist.all_reduce is wrapped  # no second wrapper
        dist.all_reduce(torch.ones(3))
    enters = [e for e in rec.events if e["kind"] == "collective" and e["phase"] == "enter"]
    assert len(enters) == 1 and watch.calls.recent[-1] is enters[0] and enters[0]["before"] == [1.0, 1.0, 1.0]
    assert json.loads(watch.where(1))["history"][-1]["line"] == enters[0]["line"]  # the recorder's line, in the answer


def test_a_record_that_cannot_be_saved_is_one_warning_and_the_block_is_still_printed(group_of_two, tmp_path,
                                                                                     capsys):
    watch = hangwatch.install(dist.HashStore(), threshold=60, poll=60, record=str(tmp_path / "no" / "hang.json"))
    watch.join()  # connected now, whether or not its thread got there first
    watch.world_size = 1  # only this rank's answer to wait for
    watch.explain(STUCK, "has waited 6 s")
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "hangwatch: rank 0 has waited 6 s in all_reduce #2 (float32[3]), called at t.py:9 in train()"
    warnings = [line for line in err if not line.startswith(hangreport.PREFIX)]
    assert len(warnings) == 1 and warnings[0].startswith(f"{hangwatch.WARNING}could not save the hang record to ")


SAVING = call("barrier", 1, "no tensor", "train.py:64 in _save_snapshot()", t=1000.0)
NOT_A_FAILURE = ("a report, not a failure: the call may still complete (a rank that is only slow) or wait until the "
                 "process group's timeout (30 min) makes it fail; the watch reports again at 2 min, 4 min, 8 min ...")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("threshold", "heard"), [
    (None, {61: ["rank 0 has waited 61 s in barrier #1 (no tensor), called at train.py:64 in _save_snapshot()",
                 NOT_A_FAILURE],
            120: ["rank 0 still waits in barrier #1, called at train.py:64 in _save_snapshot(): 2 min so far, of the "
                  "process group's 30 min timeout"],
            240: ["rank 0 still waits in barrier #1, called at train.py:64 in _save_snapshot(): 4 min so far, of the "
                  "process group's 30 min timeout"],
            480: ["rank 0 still waits in barrier #1, called at train.py:64 in _save_snapshot(): 8 min so far, of the "
                  "process group's 30 min timeout"]}),
    (5.0, {6: ["rank 0 has waited 6 s in barrier #1 (no tensor), called at train.py:64 in _save_snapshot()",
               "where each rank is, outermost frame first:"],  # a threshold that was chosen: no note
           10: ["rank 0 still waits in barrier #1, called at train.py:64 in _save_snapshot(): 10 s so far, of the "
                "process group's 30 min timeout"],
           20: ["rank 0 still waits in barrier #1, called at train.py:64 in _save_snapshot(): 20 s so far, of the "
                "process group's 30 min timeout"]}),
])
def test_a_wait_is_reported_in_full_then_in_one_line_each_time_it_doubles(group_of_two, capsys, threshold, heard):
    """Driven by the clock that speak() is given, not waited for: the watch's own threshold (a minute, for a group
    made with gloo's default timeout of 30 min) comes with what a report means; one chosen (``--after``) without."""
    watch = hangwatch.install(dist.HashStore(), threshold=threshold, poll=60)
    watch.join()
    watch.world_size = 1  # only this rank's answer to wait for
    watch.calls.latest[collectives.INIT] = {"kind": "init", "timeout": None}  # the script's init_process_group, seen
    watch.calls.open.append(SAVING)  # the main thread is in it (as the record's enter notes it)
    first, last = min(heard), max(heard)
    for wait in range(1, 2 * last):  # each second's poll, up to the wait before the next report
        watch.speak(SAVING, SAVING["t"] + wait)
        said = hangreport.block(capsys.readouterr().err.splitlines())
        assert said[:len(heard.get(wait, []))] == heard.get(wait, []), wait
        assert bool(said) == (wait in heard), (wait, said)  # nothing in between
        assert len(said) <= 1 or wait == first  # after the full block, one line each
    assert watch.reported == {("barrier", 1, 1000.0)}  # one full block for the wait


def watched(mode: str, timeout: float, after: float | None, **env: str) -> subprocess.CompletedProcess:
    """hang_worker.py MODE on 2 ranks, as a learner would attach the watch: torchrun ... -m workshop_lib.watch."""
    cmd = torchrun_argv(WORKER, 2, watch=["--after", after] if after else True, args=[mode, timeout])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO, env=cpu_env(**env))


def lines_of(done, tag="hangwatch: "):
    return [line.split(tag, 1)[1] for line in (done.stdout + done.stderr).splitlines() if tag in line]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_late_rank_is_diagnosed_and_the_job_still_finishes(tmp_path):
    """Rank 1 comes late, once the watch (threshold 2 s) has printed where it is; both finish with the right sum.

    Where rank 0 hosts the rendezvous store (no agent store, as step 4's restarts need): the watch talks through it
    while the job runs, and no rank finds it gone as it leaves. (Through torchrun's agent store: the hangs of
    test_faults.py and test_hangs_lab.py, and the run that does not hang, below.)"""
    record = tmp_path / "hang.json"
    done = watched("busy", 60, 2, **{hangreport.RECORD_VARIABLE: str(record)}, **RESTARTS)  # no agent store: rank 0's
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "rank 1 sum [4.0, 4.0, 4.0]" in out  # the observed collectives still compute: ones, summed twice over 2
    said = "\n".join(lines_of(done))
    lines = WORKER.read_text().splitlines()
    evaluate = range(next(i for i, text in enumerate(lines, 1) if text.startswith("def evaluate(")),
                     next(i for i, text in enumerate(lines, 1) if text.startswith("def torchs_own(")))
    assert re.search(r"rank 0 has waited \d+ s in all_reduce #2 \(float32\[3\]\)", said), said
    assert "never arrived: rank 1" in said, said
    at = re.search(r"rank 1 never entered all_reduce #2: it is in evaluate\(\) at tests/workers/hang_worker\.py:(\d+)", said)
    assert at and int(at.group(1)) in evaluate, said
    assert said.count("has waited") == 1, said  # one block for the job, not one per rank
    assert not re.search(r"workshop_lib/|runpy", said), said  # the watch's own frames are not the learner's
    assert [b["missing"] for b in hangreport.load(record)] == [[1]]  # and its record, for programs
    assert hangwatch.WARNING not in out and "TCPStore" not in out, out  # no warning, no socket error as they leave


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_run_that_does_not_hang_is_untouched_and_torch_is_its_own_again_after_it():
    """Through torchrun's agent store. Where rank 0 hosts the store, that no rank finds it gone as it leaves is
    test_a_late_rank_is_diagnosed_and_the_job_still_finishes's: a job that ends as cleanly, once its wait is told."""
    done = watched("clean", 30, 2)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert sorted(re.findall(r"rank \d sum \[4\.0, 4\.0, 4\.0\]", out)) == ["rank 0 sum [4.0, 4.0, 4.0]",
                                                                           "rank 1 sum [4.0, 4.0, 4.0]"]
    # destroy_process_group is never replaced; the collectives are observed during the run, torch's own after it
    assert out.count("during the run: destroy_process_group=True all_reduce=False") == 2, out
    assert out.count("at exit: destroy_process_group=True all_reduce=True backward=True") == 2, out
    assert "hangwatch" not in out and "TCPStore" not in out, out  # no block, no warning, no socket error


def test_a_watch_that_cannot_start_says_so_in_one_line_and_leaves_torch_as_it_is(monkeypatch, capsys):
    """What each rank of ``torchrun ... -m workshop_lib.watch`` does first, in this process (as rank 0 of 2): a bad
    WORKSHOP_HANG_AFTER is one line, and nothing is observed, so the job runs as it would unwatched (a run of a job
    with the watch, untouched after it: test_a_run_that_does_not_hang_is_untouched...)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv(hangwatch.AFTER_VARIABLE, "soon")
    monkeypatch.setattr(rankwatch, "_warned", False)
    before = (dist.init_process_group, dist.all_reduce, torch.autograd.backward)
    assert hangwatch.attach() is None
    assert (dist.init_process_group, dist.all_reduce, torch.autograd.backward) == before
    assert capsys.readouterr().err.splitlines() == [
        f"{hangwatch.WARNING}WORKSHOP_HANG_AFTER must be a number of seconds above 0, not 'soon'; the job runs unwatched"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_collective_still_running_on_the_gpu_is_the_one_reported():
    """NCCL returns once a collective is queued: the watch's CUDA event says whether the GPU got through it."""
    watch = hangwatch.Watch(threshold=0.1, poll=0.1, record=None, store=dist.HashStore())
    watch.calls.followers.append(watch)
    x = torch.ones(4, device="cuda")
    token = watch.calls.enter("all_reduce", (x,), {})
    torch.cuda._sleep(2_000_000_000)  # GPU time queued before the event, as a kernel waiting for a peer would be
    watch.calls.leave(token, None)
    assert token[0]["device"] == "cuda" and watch.unfinished_on_gpu() is token[0]
    torch.cuda.synchronize()
    assert watch.unfinished_on_gpu() is None


EXIT_PROBE = """import gc
class Noisy:
    def __del__(self):
        print("finalized", flush=True)
gc.collect()
noisy = Noisy()
noisy.cycle = noisy  # in a reference cycle: only a collection frees it, at the latest the interpreter's exit
print("script ended", flush=True)
raise RuntimeError("on purpose")
"""


def test_a_watched_script_exits_as_it_would_unwatched_its_garbage_finalized(tmp_path):
    """-m workshop_lib.watch leaves the interpreter's exit alone: its last collections finalize the script's cycles,
    and a script that raises ends with its traceback and exit status 1. (One that returns: the watch's code path is
    the same, ``runpy`` in a ``try``/``finally``; its exit status 0 is test_a_run_that_does_not_hang_is_untouched...)"""
    script = tmp_path / "probe.py"
    script.write_text(EXIT_PROBE)
    proc = subprocess.run([sys.executable, "-m", "workshop_lib.watch", str(script)], capture_output=True,
                          text=True, cwd=REPO, env=cpu_env(), timeout=60)
    assert proc.stdout.splitlines() == ["script ended", "finalized"], proc.stderr[-2000:]
    assert proc.returncode == 1 and "RuntimeError: on purpose" in proc.stderr, proc.stderr[-2000:]
