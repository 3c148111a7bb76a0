"""The checker's pair of ranks: forked from this process where fork is safe, fresh Pythons elsewhere.

Both kinds run an item the same way: here a script of one line, so that what is tested is the start, what
each rank is given (its rank, the folder, one thread) and how it ends, not a training run.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from workshop_lib.checks import runner
from workshop_lib.lab.spawning import START_METHOD

SCRIPT = ('import json, os, torch\n'
          'print(json.dumps({"rank": os.environ["RANK"], "threads": torch.get_num_threads(), "cwd": os.getcwd()}))\n')


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("method", "kind"), [("fork", runner._Forked), ("spawn", subprocess.Popen)])
def test_each_rank_runs_the_item_as_given_and_the_pair_ends(method, kind, monkeypatch, tmp_path):
    monkeypatch.setenv(START_METHOD, method)
    script = tmp_path / "one_line.py"
    script.write_text(SCRIPT)
    item = runner.Item(script, [], tmp_path / "item")
    started = []
    real_start = runner._start
    monkeypatch.setattr(runner, "_start", lambda *a: started.append(real_start(*a)) or started[-1])
    [run] = runner.run([item], tmp_path)
    assert [type(p) for p in started[0]] == [kind, kind]
    assert run.stopped is None, run.output
    said = [json.loads(line) for line in run.output.splitlines() if line.startswith("{")]
    assert sorted(s["rank"] for s in said) == ["0", "1"] and {s["threads"] for s in said} == {1}, said
    assert [e[-1]["kind"] + " " + e[-1]["how"] for e in run.ranks.values()] == ["end ok", "end ok"], run.ranks
    assert [p.poll() for p in started[0]] == [0, 0]


@pytest.mark.timeout(30)
def test_a_rank_other_than_0_calls_init_once_rank_0s_store_listens(monkeypatch):
    """torch's store client retries only after ~0.5 s: rank 1 waits for the port instead, then calls init as given."""
    import socket
    import threading
    import time
    from datetime import timedelta

    from workshop_lib.checks import rank

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    calls = []
    arrive = rank._after_the_host(lambda *a, **kw: calls.append((time.monotonic(), a, kw)) or "joined")
    server = socket.socket()

    def listen_later():
        time.sleep(0.3)
        server.bind(("127.0.0.1", port))
        server.listen()
        listening.append(time.monotonic())

    listening: list[float] = []
    threading.Thread(target=listen_later, daemon=True).start()
    try:
        assert arrive("gloo", timeout=timedelta(seconds=10)) == "joined"
    finally:
        server.close()
    assert listening and listening[0] <= calls[0][0] < listening[0] + 0.2  # once it listened, at once
    assert calls[0][1:] == (("gloo",), {"timeout": timedelta(seconds=10)})  # as given
    start = time.monotonic()  # nothing ever listens: the wait ends with the group's timeout, and init is called
    arrive("gloo", timeout=timedelta(seconds=0.3))
    assert 0.25 < time.monotonic() - start < 2 and len(calls) == 2
    monkeypatch.setenv("RANK", "0")  # rank 0 hosts the store: no wait
    start = time.monotonic()
    arrive("gloo", timeout=timedelta(seconds=5))
    assert time.monotonic() - start < 0.1 and len(calls) == 3
