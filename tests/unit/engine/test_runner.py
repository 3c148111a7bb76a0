"""The checker's pair of ranks: the lab's one launcher, forked from this process where fork is safe, else spawned.

Both kinds run an item the same way: here a script of a few lines, so that what is tested is the start, what
each rank is given (its rank, the folder, one thread) and how it ends, not a training run.
"""

from __future__ import annotations

import json

import pytest

from workshop_lib.engine import recorder, rules, runner
from workshop_lib.launching.spawning import START_METHOD
from workshop_lib.paths import lab_root

SCRIPT = ('import json, os, torch\n'
          'print(json.dumps({"rank": os.environ["RANK"], "threads": torch.get_num_threads(), "cwd": os.getcwd()}))\n')


@pytest.mark.timeout(90)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_each_rank_runs_the_item_as_given_and_the_pair_ends(method, monkeypatch, tmp_path):
    monkeypatch.setenv(START_METHOD, method)
    script = tmp_path / "one_line.py"
    script.write_text(SCRIPT)
    item = runner.Item(script, [], tmp_path / "item")
    started = []
    real = runner.Ranks
    monkeypatch.setattr(runner, "Ranks", lambda *a: started.append(real(*a)) or started[-1])
    run = runner.run(item)
    assert [r.method for r in started] == [method]
    assert run.stopped is None, run.output
    said = [json.loads(line) for line in run.output.splitlines() if line.startswith("{")]
    assert sorted(s["rank"] for s in said) == ["0", "1"] and {s["threads"] for s in said} == {1}, said
    assert {s["cwd"] for s in said} == {str(lab_root())}
    assert [e[-1]["kind"] + " " + e[-1]["how"] for e in run.ranks.values()] == ["end returned", "end returned"], run.ranks
    assert [p.exitcode for p in started[0]._processes] == [0, 0]


SEVERAL_GROUPS = ('import torch.distributed as dist\n'
                  'dist.init_process_group("gloo")\n'
                  'dist.new_group([0]) if dist.get_rank() == 0 else None\n'  # rank 0 alone numbers one group more
                  'dist.barrier()\n'
                  'dist.destroy_process_group()\n')


@pytest.mark.timeout(90)
def test_each_run_gets_fresh_ranks_so_one_scripts_groups_never_reach_the_next(tmp_path):
    """Group names are numbered per process: a run that left the two ranks' counts apart must not hang the next."""
    script = tmp_path / "groups.py"
    script.write_text(SEVERAL_GROUPS)
    first, second = (runner.Item(script, [], tmp_path / name) for name in ("first", "second"))
    runs = [runner.run(first), runner.run(second)]
    assert [r.stopped for r in runs] == [None, None], runs[-1].output
    assert [r.ranks[0][-1]["how"] for r in runs] == ["returned", "returned"], runs[-1].output


DIES = ('import os, signal, torch.distributed as dist\n'
        'dist.init_process_group("gloo")\n'
        'if dist.get_rank() == 1:\n'
        '    os.kill(os.getpid(), signal.SIGKILL)\n'
        'dist.barrier()\n'
        'dist.destroy_process_group()\n')


@pytest.mark.timeout(90)
def test_a_rank_whose_process_died_ends_in_a_killed_record_with_its_signal(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text(DIES)
    run = runner.run(runner.Item(script, [], tmp_path / "item"))
    died = run.ranks[1][-1]
    assert (died["kind"], died["how"], died["signal"], died["code"]) == ("end", "killed", "SIGKILL", -9), run.ranks[1]
    assert recorder.how(run.ranks[1]) == "killed"
    # rank 0 waited in the barrier: gloo says its peer went away, or the runner stopped it at rank 1's death
    assert recorder.how(run.ranks[0]) in ("lost", "timed out", "waiting"), run.ranks[0][-1]
    assert run.ranks[0][-1].get("stopped") in (None, "another rank died"), run.ranks[0][-1]


HANGS = ('import time, torch.distributed as dist\n'
         'dist.init_process_group("gloo")\n'
         'if dist.get_rank() == 0:\n'
         '    dist.barrier()\n'
         'else:\n'
         '    time.sleep(60)\n')


@pytest.mark.timeout(90)
def test_ranks_the_runner_stopped_in_a_hang_end_in_waiting_records_with_the_call_and_line(tmp_path):
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    run = runner.run(runner.Item(script, [], tmp_path / "item", hang_after=1.0))
    assert run.stopped == "hang", run.output
    found = {r: (e[-1]["how"], e[-1]["call"], e[-1]["line"], e[-1]["stopped"]) for r, e in run.ranks.items()}
    assert found == {0: ("waiting", "barrier #1", 4, "hang"), 1: ("waiting", None, 6, "hang")}, run.ranks
    assert {recorder.how(e) for e in run.ranks.values()} == {"waiting"}


def test_the_stop_policy_reads_what_each_rank_appended_once_and_its_end_from_the_record(tmp_path):
    """A poll parses only the lines appended since the last one (a line still being written waits for its newline),
    and a rank has ended when an ``end`` event was recorded, not where a field's text reads like one."""
    path, progress = tmp_path / "item.rank0.jsonl", runner.Records(tmp_path / "item", 1)
    progress.update()  # no record yet
    step = json.dumps({"kind": "step", "numel": 0, "said": {"kind": "end"}}) + "\n"
    path.write_text(step + step[:10])
    progress.update()
    assert [e["kind"] for e in progress.events[0]] == ["step"] and not progress.ended
    path.write_text("#" * len(step) + step + json.dumps({"kind": "end", "how": "returned"}) + "\n")  # the old line
    progress.update()  # overwritten: a poll that read the file again would fail on it
    assert [e["kind"] for e in progress.events[0]] == ["step", "step", "end"] and progress.ended == {0}
    assert progress.read[0] == path.stat().st_size


@pytest.mark.timeout(90)
def test_a_script_that_exits_with_a_message_is_quoted_by_that_message_not_its_last_print(tmp_path):
    """sys.exit("...") prints its text on the way out, as Python does; the verdict quotes it, not the line before."""
    text = 'print("epoch 0: loss 1.23")\nraise SystemExit("--epochs must be positive")\n'
    script = tmp_path / "exits.py"
    script.write_text(text)
    run = runner.run(runner.Item(script, [], tmp_path / "item"))
    assert rules.started(rules.Case(run, None, source=text, name="exits.py")) == (
        "rank 0 exited with code 1 (line 2): --epochs must be positive")
