"""The generated scripts and exercise notebooks: up to date, and made correctly from the markers."""

from __future__ import annotations

import re
import subprocess
import sys

import nbformat
import pytest

from tests.conftest import REPO
from tests.unit.authoring.test_scripts import _tiny_notebook
from tests.unit.authoring.test_spans import CELL, DEBUG_CELL
from tools import build
from workshop_lib.authoring import scripts


def test_generated_files_are_up_to_date():
    proc = subprocess.run([sys.executable, "-m", "tools.build", "--check"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "up to date" in proc.stdout


@pytest.fixture
def tiny_repo(tmp_path, monkeypatch):
    for name in ("notebooks", "solutions", "exercises"):
        (tmp_path / name).mkdir()
    nbformat.write(_tiny_notebook(), tmp_path / "notebooks" / "00_tiny.ipynb")
    monkeypatch.setattr(build, "ROOT", tmp_path)
    monkeypatch.setattr(build, "NOTEBOOKS", tmp_path / "notebooks")
    monkeypatch.setattr(build, "SOLUTIONS", tmp_path / "solutions")
    monkeypatch.setattr(build, "EXERCISES", tmp_path / "exercises")
    return tmp_path


def test_build_writes_scripts_and_the_exercise_notebook(tiny_repo):
    written = build.build()
    assert sorted(p.relative_to(tiny_repo).as_posix() for p in written) == [
        "exercises/00_tiny.ipynb", "exercises/tiny_todo.py", "solutions/tiny.py"]
    solution = (tiny_repo / "solutions" / "tiny.py").read_text()
    assert solution.startswith("# Generated from notebooks/00_tiny.ipynb by `python -m tools.build`: do not edit.\n")
    body = solution.split("\n", 2)[2]
    assert body == ('"""Doc."""\n\nfrom __future__ import annotations\n\nimport math\n\n\n'
                    'def f(x):\n    y = x + 1\n    y = 2 * y\n    return y\n\n\n'
                    'if __name__ == "__main__":\n    print(f(1))\n')
    proc = subprocess.run([sys.executable, tiny_repo / "solutions" / "tiny.py"], capture_output=True, text=True, timeout=60)
    assert proc.stdout == "4\n"
    exercise = (tiny_repo / "exercises" / "tiny_todo.py").read_text()
    assert "# TODO: double y" in exercise and "2 * y" not in exercise and "do not edit" in exercise.splitlines()[0]
    compile(exercise, "tiny.py", "exec")

    nb = nbformat.read(tiny_repo / "exercises" / "00_tiny.ipynb", as_version=4)
    assert "[notebooks/00_tiny.ipynb](../notebooks/00_tiny.ipynb)" in nb.cells[0].source
    assert "Your working copy: write your code here." in nb.cells[0].source and "do not edit" not in nb.cells[0].source
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert "2 * y" not in nbformat.writes(nb)
    assert any("print(f(1))" in c.source for c in code)  # the check cells stay


def test_check_names_each_stale_file_and_fails(tiny_repo, capsys):
    build.build()
    assert build.build(check=True) == []
    (tiny_repo / "solutions" / "tiny.py").write_text("# edited by hand\n")
    (tiny_repo / "exercises" / "tiny_todo.py").unlink()
    with pytest.raises(SystemExit) as exit_:
        build.main(["--check"])
    assert exit_.value.code == 1
    out = capsys.readouterr().out
    assert "stale: solutions/tiny.py" in out and "stale: exercises/tiny_todo.py" in out
    assert "00_tiny.ipynb" not in out
    assert (tiny_repo / "solutions" / "tiny.py").read_text() == "# edited by hand\n"  # --check changes nothing


def test_every_solution_notebook_has_stored_outputs_and_a_header_free_source():
    for path in build.source_notebooks():
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert any(c.outputs for c in code), f"{path.name} has no stored outputs: run python -m tools.build --execute"
        assert all(not c.source.startswith("# Generated from") for c in code)


def test_exercise_scripts_leave_the_solutions_out():
    assert not list((REPO / "exercises").glob("step[1-9]*[!o].py")), "a step with TODOs is named *_todo.py"
    for path in sorted((REPO / "exercises").glob("step*.py")):
        solution = (REPO / "solutions" / path.name.replace("_todo", "")).read_text()
        exercise = path.read_text()
        if path.name == "step0_baseline.py":  # the tour of 00: the learner reads the baseline, writes nothing yet
            assert exercise == solution
            continue
        assert exercise.count('raise NotImplementedError("fill in the TODO above")') >= 1, path.name
        assert exercise != solution
        compile(exercise, path.name, "exec")


@pytest.mark.timeout(150)
def test_exercises_are_not_collected_by_pytest():
    # What plain pytest collects outside the test modules (--ignore=tests would not drop its own testpath).
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--ignore=tests/unit",
                           "--ignore=tests/integration", "-n", "0"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "exercises/" not in proc.stdout
    assert "notebooks/00_baseline.ipynb" in proc.stdout


def test_exercise_header_asks_for_todos_only_where_there_are_some():
    with_todo = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "def f():\n    # TODO: return one\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION")])
    without = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])
    header = {name: build.exercise_notebook(nb, "notebooks/x.ipynb").cells[0].source
              for name, nb in (("todo", with_todo), ("none", without))}
    assert "Fill in each `# TODO`" in header["todo"]
    assert "TODO" not in header["none"] and "nothing to fill in" in header["none"]


def test_a_script_gathers_cells_lent_by_other_notebooks(tiny_repo):
    """Steps 2 to 4 share step 1's main: one cell, several script tags, taken as solved into every script."""
    v4 = nbformat.v4
    lender = v4.new_notebook()
    main = v4.new_code_cell("def main():\n    # TODO: call f\n    ### BEGIN SOLUTION\n    print(f(g(1)))\n"
                            "    ### END SOLUTION")
    helper = v4.new_code_cell("def g(x):\n    return x")
    for i, cell in enumerate((main, helper)):
        cell.id, cell.metadata["tags"] = f"l{i}", ["script:tiny", "script:lender"]
    lender.cells = [main, helper]
    nbformat.write(lender, tiny_repo / "notebooks" / "01_lender.ipynb")
    nb = _tiny_notebook()
    nb.cells[5].source = 'if __name__ == "__main__":\n    main()'
    nbformat.write(nb, tiny_repo / "notebooks" / "00_tiny.ipynb")

    build.build()
    solution = (tiny_repo / "solutions" / "tiny.py").read_text()
    assert solution.splitlines()[:2] == ["# Generated from notebooks/00_tiny.ipynb by `python -m tools.build`: "
                                         "do not edit.", "# (and cells of notebooks/01_lender.ipynb)"]
    order = [solution.index(s) for s in ('"""Doc."""', "import math", "def f(", "def g(", "def main(", "if __name__")]
    assert order == sorted(order)  # docstring and imports, the body in notebook order, main, the guard
    exercise = (tiny_repo / "exercises" / "tiny_todo.py").read_text()
    assert "print(f(g(1)))" in exercise and "# TODO: double y" in exercise  # lent cells come solved; home ones not
    proc = subprocess.run([sys.executable, tiny_repo / "solutions" / "tiny.py"], capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout == "4\n"
    assert build.script_homes(scripts.solution_notebooks(build.NOTEBOOKS)) == {"tiny": "notebooks/00_tiny.ipynb",
                                                         "lender": "notebooks/01_lender.ipynb"}


@pytest.mark.parametrize("path", build.source_notebooks(), ids=lambda p: p.name)
def test_each_exercise_notebook_opens_with_where_the_learner_is(path):
    nb = nbformat.read(path, as_version=4)
    lab = nb.metadata.get("lab", {})
    assert lab.get("step") and lab.get("outcome"), f"{path.name}: set metadata lab.step and lab.outcome"
    first = nbformat.read(build.EXERCISES / path.name, as_version=4).cells[0].source
    stated = re.search(r"\*\*Time: about (\d+) minutes", nb.cells[0].source)
    assert stated, f"{path.name}: the first cell states no '**Time: about N minutes.**'"
    assert first.startswith(f"**Where you are:** {lab['step']}. **Time:** about {stated.group(1)} minutes. "
                            f"**At the end you have:** {lab['outcome']}.")


def test_the_exercise_header_says_when_cells_hold_a_bug():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(DEBUG_CELL)])
    header = build.exercise_notebook(nb, "notebooks/x.ipynb").cells[0].source
    assert "hold a bug instead of a TODO" in header
    assert "hold a bug" not in build.exercise_notebook(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        CELL)]), "notebooks/x.ipynb").cells[0].source
