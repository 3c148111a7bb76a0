"""Bad input: one line naming the problem and the fix, no traceback, nothing written.

``InputError`` is a ``SystemExit``: uncaught, Python prints its one line and exits
with status 1; argparse's own errors exit with status 2. The step scripts need no
wrapper around ``main`` for either.
"""

from __future__ import annotations

import re

import pytest
import torch.distributed

from tests.conftest import SOLUTIONS, load_step, raises_in_process, run_python, run_torchrun
from workshop_lib.errors import InputError

CASES = {
    "missing file": (["--data", "{tmp}/nope.csv"], None, "not found"),
    "empty csv": (["--data", "{tmp}/data.csv"], "", "is empty"),
    "header only": (["--data", "{tmp}/data.csv"], "name,p_np,smiles\n", "no rows"),
    "no smiles column": (["--data", "{tmp}/data.csv"], "name,p_np\na,1\nb,0\n", "no SMILES column"),
    "no label column": (["--data", "{tmp}/data.csv"], "name,smiles\na,CCO\nb,CCN\n", "no label column"),
    "labels not 0/1": (["--data", "{tmp}/data.csv"], "p_np,smiles\n1,CCO\n3,CCN\n", "only 0 and 1"),
    "single class": (["--data", "{tmp}/data.csv"], "p_np,smiles\n1,CCO\n1,CCN\n", "single class"),
    "unknown character": (["--data", "{tmp}/data.csv"], "p_np,smiles\n1,CCO\n0,CC&N\n", "character the tokenizer"),
    "blank smiles": (["--data", "{tmp}/data.csv"], "p_np,smiles\n1,CCO\n0,   \n1,CCN\n", "is blank in row 3"),
    "limit too large": (["--limit", "100000"], None, "--limit 100000 is larger"),
    "limit too small to split": (["--limit", "5"], None, "cannot split 5 molecules"),
    "bad dropout": (["--dropout", "1.5"], None, "--dropout must be in [0, 1)"),
}


def test_input_error_is_a_system_exit_with_its_line():
    err = InputError("x is bad; do y")
    assert isinstance(err, SystemExit) and not isinstance(err, Exception)  # `except Exception` lets it through
    assert (err.code, err.message) == ("error: x is bad; do y", "x is bad; do y")


@pytest.mark.timeout(60)
def test_uncaught_it_is_one_line_and_exit_status_1():
    proc = run_python(["-c", "from workshop_lib.errors import InputError; raise InputError('x is bad; do y')"])
    assert (proc.returncode, proc.stderr, proc.stdout) == (1, "error: x is bad; do y\n", "")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, world_of_one, case):
    """Step 3's main in a world of one: every bad input is an InputError, raised before anything is written."""
    args, csv_text, message = CASES[case]
    if csv_text is not None:
        (tmp_path / "data.csv").write_text(csv_text)
    out = tmp_path / "out"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    with raises_in_process(InputError) as raised:
        load_step("step3_ddp").main([*argv, "--out", str(out)])
    assert message in raised.value.message and "\n" not in raised.value.message, raised.value.message
    assert not out.exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("step", ["step0_baseline", "step3_ddp"])
def test_unwritable_output_directory(tmp_path, world_of_one, step):
    """Rank 0's Reporter tries --out before any work; step 3 then still leaves its group (the finally)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    with raises_in_process(InputError, match=r"^error: cannot write to --out .*; choose a writable directory$"):
        load_step(step).main(["--limit", "200", "--out", str(blocker / "sub")])
    assert not torch.distributed.is_initialized()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_real_process_prints_one_line(tmp_path):
    """An argparse error, in a step script's real process: its one line (with the script's name), exit status 2.

    The other argparse errors take the same path (their lines: test_config.py's
    test_argparse_errors_are_one_line_and_exit_2); an InputError's one line and exit status 1 in real processes:
    test_uncaught_it_is_one_line_and_exit_status_1 above and, from a step script, the torchrun test below."""
    proc = run_python([SOLUTIONS / "step0_baseline.py", "--epocs", "3", "--out", tmp_path / "out"], timeout=50)
    assert (proc.returncode, proc.stderr) == (2, "error: unrecognized arguments: --epocs 3 (see step0_baseline.py "
                                                 "--help)\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_under_torchrun_every_rank_prints_its_line_and_torchrun_exits_1(tmp_path):
    """Each rank stops before joining the group with its one line; torchrun's summary lists exit code 1 (no traceback:
    none is due). Once one rank has exited, torchrun stops the others (SIGTERM): a rank a moment behind may be
    stopped before it gets to its line (or after it, while it exits): each rank printed it or is listed as stopped."""
    proc = run_torchrun(SOLUTIONS / "step3_ddp.py", ["--data", "missing.csv", "--out", tmp_path / "out"], timeout=100)
    line = "error: data file missing.csv not found; pass --data PATH to a CSV with SMILES and 0/1 labels"
    assert proc.returncode == 1
    printed, stopped = proc.stderr.count(line + "\n"), len(re.findall(r"exitcode  : -15 .*\(SIGTERM\)", proc.stderr))
    assert printed == 2 or (printed, stopped) == (1, 1), proc.stderr[-3000:]
    assert proc.stderr.count("Traceback") == 1, proc.stderr[-3000:]  # torchrun's own ChildFailedError, no rank's
    assert "exitcode  : 1" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_workshop_error_shows_in_a_notebook_as_its_one_line():
    """IPython calls _render_traceback_ in place of printing the traceback: the learner reads the cause, not our frames."""
    from workshop_lib.errors import WorkshopError

    try:
        raise WorkshopError("the run printed nothing: run the torchrun cell above first, then this one")
    except WorkshopError as err:
        assert err._render_traceback_() == [
            "WorkshopError: the run printed nothing: run the torchrun cell above first, then this one"]
