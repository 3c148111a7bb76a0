"""python -m workshop_lib.watch SCRIPT ARGS: the script runs as `python SCRIPT ARGS` would, its own arguments and
messages its own; a script that cannot run is one line and a non-zero exit, with no frame of the watch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, cpu_env
from workshop_lib import watch

ELSEWHERE = REPO / "tests" / "workers" / "elsewhere" / "train.py"  # the tutorials' form: argparse positionals


@pytest.mark.parametrize(("name", "content", "said", "status"), [
    ("train.py", "def main():\n    x = (1,\n", "train.py:2: SyntaxError: '(' was never closed; fix it", 1),
    ("train.py", "if True:\n    x = 1\n      y = 2\n", "train.py:3: IndentationError: unexpected indent; fix it", 1),
    ("run.sh", "#!/bin/bash\necho starting\n", "run.sh is not a Python script (its first line, #!/bin/bash, runs "
                                              "another program): pass the .py file it starts, with its arguments", 2),
    ("run.sh", "echo starting\n", "run.sh:1: SyntaxError: invalid syntax (is it a Python script?); fix it", 1),
    ("snapshot.pt", b"PK\x03\x04\x00\x00\x08\xff", "snapshot.pt is not a Python script (binary data, not text): pass "
                                                   "the .py file that trains", 2),
    ("missing.py", None, "missing.py: no such file; pass the path of the Python script that trains", 2),
])
def test_a_script_that_cannot_run_is_one_line(tmp_path, monkeypatch, capsys, name, content, said, status):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    if isinstance(content, str):
        (tmp_path / name).write_text(content)
    elif content is not None:
        (tmp_path / name).write_bytes(content)
    with pytest.raises(SystemExit) as stopped:
        watch.main([name, "4", "2"])
    assert stopped.value.code == status
    out = capsys.readouterr()
    assert (out.out, out.err.splitlines()) == ("", [said])


@pytest.mark.timeout(60)
def test_under_python_a_syntax_error_is_one_line_without_the_watchs_frames(tmp_path):
    """The whole of stderr, as a learner sees it (python's own would be a traceback through runpy and the watch)."""
    (tmp_path / "train.py").write_text("import os\n\nclass Trainer\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "workshop_lib.watch", "train.py", "4", "2"], capture_output=True,
                          text=True, cwd=tmp_path, env=cpu_env(PYTHONPATH=str(REPO)), timeout=50)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "train.py:3: SyntaxError: expected ':'; fix it\n")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("args", "status", "stream", "said"), [
    ([], 2, "stderr", "train.py: error: the following arguments are required: total_epochs, save_every"),
    (["4", "2", "--after", "5"], 2, "stderr", "train.py: error: unrecognized arguments: --after 5"),  # the script's
    (["--help"], 0, "stdout", "  --snapshot_path SNAPSHOT_PATH"),  # the script's own help, not the watch's
])
def test_the_scripts_own_arguments_and_messages_pass_through(args, status, stream, said):
    """A script written elsewhere takes its own argparse arguments after it, and its messages are its own."""
    done = subprocess.run([sys.executable, "-m", "workshop_lib.watch", ELSEWHERE, *args], capture_output=True,
                          text=True, cwd=REPO, env=cpu_env(), timeout=100)
    text = getattr(done, stream)
    assert done.returncode == status, done.stderr[-2000:]
    assert text.startswith("usage: train.py [-h] [--batch_size BATCH_SIZE]"), text
    assert said in text.splitlines(), text
    assert "workshop_lib" not in done.stdout + done.stderr and "Traceback" not in done.stderr
