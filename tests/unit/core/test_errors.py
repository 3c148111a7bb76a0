"""Bad input: one line naming the problem, exit code 2, no traceback, nothing written."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import SOLUTIONS, run_python
from workshop_lib.cli import run_cli

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


def load_step(name: str):
    spec = importlib.util.spec_from_file_location(name, SOLUTIONS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, case):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    args, csv_text, message = CASES[case]
    if csv_text is not None:
        (tmp_path / "data.csv").write_text(csv_text)
    out = tmp_path / "out"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code = run_cli(load_step("step3_ddp").main, [*argv, "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize(("args", "message"), [
    (["--epocs", "3"], "error: unrecognized arguments: --epocs 3 (see step3_ddp.py --help)"),
    (["--epochs", "0"], "error: argument --epochs: must be >= 1, got 0"),
    (["--data", "missing.csv"], "error: data file missing.csv not found"),
])
def test_the_real_process_exits_2_with_one_line(tmp_path, args, message):
    proc = run_python([SOLUTIONS / "step3_ddp.py", *args, "--out", tmp_path / "out"], timeout=50)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith(message), proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(60)
def test_unwritable_output_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = run_cli(load_step("step0_baseline").main, ["--limit", "200", "--out", str(blocker / "sub")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: cannot write to --out") and err.count("\n") == 1
