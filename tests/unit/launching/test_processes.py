"""kill_tree: the one way the tools stop a process and what it started."""


from __future__ import annotations

import signal
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_kill_tree_ends_a_process_and_the_child_it_started_in_another_session():
    import psutil

    from workshop_lib.launching.processes import kill_tree

    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], "
            "start_new_session=True); print('ready', flush=True); time.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"  # the grandchild exists now
    tree = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    assert len(tree) == 2
    kill_tree(proc, grace=5, first=signal.SIGTERM)
    assert proc.returncode == -signal.SIGTERM  # reaped through the Popen: its code is readable
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in tree)
