"""tests/no_exit_gc: the Pythons the run starts freeze the collector once the program's own exit handlers have run."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import NO_EXIT_GC, REPO

PROGRAM = """
import atexit, gc, sys
print(sys.modules["sitecustomize"].__file__)
atexit.register(lambda: print("the program's handler ran; frozen:", gc.get_freeze_count() > 0, flush=True))
"""


def _run(pythonpath: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, env=env,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_run_puts_the_hook_on_the_path_of_every_python_it_starts():
    assert str(NO_EXIT_GC) in os.environ["PYTHONPATH"].split(os.pathsep)
    first, last = _run(os.environ["PYTHONPATH"])
    assert first == str(NO_EXIT_GC / "sitecustomize.py")
    assert last == "the program's handler ran; frozen: False"  # the freeze comes after it


def test_a_sitecustomize_of_the_environment_still_runs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("print('theirs ran')\n")
    lines = _run(os.pathsep.join([str(NO_EXIT_GC), str(tmp_path)]))
    assert lines[:2] == ["theirs ran", str(NO_EXIT_GC / "sitecustomize.py")]
