"""A learner's script, written from the notebook as they ran it: the text the generator writes, their edits in it."""

from __future__ import annotations

import nbformat
import pytest

from tests.conftest import REPO
from tests.unit.authoring.test_spans import CELL
from workshop_lib.authoring import scripts, spans
from workshop_lib.errors import WorkshopError

STEPS = {"01_process_group.ipynb": "step1_process_group", "02_distributed_sampler.ipynb": "step2_sampler",
         "03_ddp.ipynb": "step3_ddp", "04a_patterns.ipynb": "step4_snapshots"}


def _tiny_notebook():
    v4 = nbformat.v4
    nb = v4.new_notebook()
    cells = [v4.new_markdown_cell("# Tiny\n\nIntro."),
             v4.new_raw_cell('"""Doc."""\n\nfrom __future__ import annotations'),
             v4.new_code_cell("import math"),
             v4.new_code_cell(CELL),
             v4.new_code_cell("print(f(1))", outputs=[v4.new_output("stream", name="stdout", text="4\n")]),
             v4.new_raw_cell('if __name__ == "__main__":\n    print(f(1))')]
    for i, cell in enumerate(cells):
        cell.id = f"c{i}"
    for i in (1, 2, 3, 5):
        cells[i].metadata["tags"] = ["script:tiny"]
    nb.cells = cells
    return nb


@pytest.fixture
def course(tmp_path):
    """A course folder: one solution notebook in notebooks/, the kernel in exercises/ (as a learner's is)."""
    for name in ("notebooks", "exercises"):
        (tmp_path / name).mkdir()
        nbformat.write(_tiny_notebook(), tmp_path / name / "00_tiny.ipynb")
    return tmp_path


def test_write_script_uses_the_cells_as_run(course, monkeypatch, capsys):
    monkeypatch.chdir(course / "exercises")
    monkeypatch.setattr(scripts, "_ran", {"c3": "def f(x):\n    # TODO: double y\n    return 3 * x"})
    path = scripts.write_script("00_tiny.ipynb")
    assert path == course / "runs" / "mine" / "tiny.py"  # in the course folder, whichever folder the kernel is in
    assert capsys.readouterr().out.startswith("wrote runs/mine/tiny.py (")
    text = path.read_text()
    assert text.startswith("# Your tiny, written from 00_tiny.ipynb") and "return 3 * x" in text
    assert "do not edit" not in text
    with pytest.raises(WorkshopError, match="not found"):
        scripts.write_script("nope.ipynb")


def test_a_notebook_outside_a_course_folder_is_one_line_not_a_script_that_fails_later(tmp_path, monkeypatch):
    (tmp_path / "alone").mkdir()
    nbformat.write(_tiny_notebook(), tmp_path / "alone" / "00_tiny.ipynb")
    monkeypatch.chdir(tmp_path / "alone")
    with pytest.raises(WorkshopError, match=r"which is not there: open 00_tiny\.ipynb from the course's notebooks/"):
        scripts.write_script("00_tiny.ipynb")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("notebook", "name"), STEPS.items())
def test_a_solution_notebook_as_saved_writes_the_generated_script(notebook, name, monkeypatch, tmp_path):
    """The cells lent by earlier notebooks (step 1's main, step 2's loader) sit where the generator puts them."""
    monkeypatch.setattr(scripts, "_ran", {})
    mine = scripts.write_script(REPO / "notebooks" / notebook, name, to=tmp_path / f"{name}.py").read_text()
    generated = (REPO / "solutions" / f"{name}.py").read_text()
    header = ("# Generated from", "# (and cells of", "# Edit the cells")
    assert mine.splitlines()[1:] == [line for line in generated.splitlines() if not line.startswith(header)]


def _lending_course(tmp_path, learners_f: str):
    """notebooks/ and exercises/: 00_lend lends ``def f`` to 01_home's script; the learner's 00_lend holds ``learners_f``."""
    v4 = nbformat.v4

    def notebook(f_source: str, home: bool):
        nb = v4.new_notebook()
        cells = [v4.new_code_cell(f_source)] if not home else [v4.new_raw_cell('"""Doc."""'),
                                                                v4.new_code_cell("print(f(1))")]
        for i, cell in enumerate(cells):
            cell.id = f"{'h' if home else 'l'}{i}"
            cell.metadata["tags"] = ["script:tiny"]
        nb.cells = cells
        return nb
    for folder, f_source in (("notebooks", CELL), ("exercises", learners_f)):
        (tmp_path / folder).mkdir(parents=True)
        nbformat.write(notebook(f_source, False), tmp_path / folder / "00_lend.ipynb")
        nbformat.write(notebook("", True), tmp_path / folder / "01_home.ipynb")
    return tmp_path


def test_a_learners_script_borrows_their_own_earlier_cells_and_says_which_came_from_the_solutions(tmp_path,
                                                                                                   monkeypatch):
    monkeypatch.setattr(scripts, "_ran", {})
    course = _lending_course(tmp_path / "filled", "def f(x):\n    return 5 * x  # the learner's own")
    text = scripts.write_script(course / "exercises" / "01_home.ipynb", "tiny").read_text()
    assert "return 5 * x  # the learner's own" in text and "From the solutions" not in text
    course = _lending_course(tmp_path / "open", spans.exercise_source(CELL))
    text = scripts.write_script(course / "exercises" / "01_home.ipynb", "tiny").read_text()
    assert text.splitlines()[1] == ("# From the solutions, as yours still raise NotImplementedError: "
                                    "def f (00_lend.ipynb).")
    assert "NotImplementedError" not in "\n".join(text.splitlines()[2:])


def test_a_line_of_a_written_script_is_pointed_at_its_cell_and_line(tmp_path, monkeypatch):
    """The verdicts of a script written from cells name the cell and its line, hints and markers counted."""
    monkeypatch.setattr(scripts, "_ran", {})
    monkeypatch.setattr(scripts, "_written", {})
    notebook = REPO / "notebooks" / "04a_patterns.ipynb"
    path = scripts.write_script(notebook, "step4_snapshots", to=tmp_path / "step4_snapshots.py")
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines, 1) if "os.replace(" in line)
    cell = next(c.source for c in nbformat.read(notebook, as_version=4).cells if "def save_snapshot(" in c.source)
    in_cell = next(i for i, line in enumerate(cell.splitlines(), 1) if "os.replace(" in line)
    assert in_cell > at - next(i for i, line in enumerate(lines, 1) if line.startswith("def save_snapshot")) + 1
    assert scripts.where_in_cells(path, at) == f"cell `def save_snapshot` line {in_cell}"
    setup = next(i for i, line in enumerate(lines, 1) if line.startswith("def setup("))
    assert scripts.where_in_cells(path, setup) == "01_process_group.ipynb's cell `def setup` line 1"  # lent
    assert scripts.in_cells(path, f"step4_snapshots.py: rank 0 wrote it (line {at}): a kill") == (
        f"step4_snapshots.py: rank 0 wrote it (cell `def save_snapshot` line {in_cell}): a kill")
    path.write_text(path.read_text() + "# edited by hand\n")  # no longer what the cells wrote: its own lines
    assert scripts.in_cells(path, f"(line {at})") == f"(line {at})"


class _Ran:
    """What IPython's post_run_cell passes: the cell's id and source, and whether it ran."""

    def __init__(self, cell_id: str, source: str, success: bool = True):
        self.info = type("Info", (), {"cell_id": cell_id, "raw_cell": source})()
        self.success = success


def test_running_a_cell_of_a_written_script_again_rewrites_it_for_the_terminal(course, monkeypatch, capsys):
    monkeypatch.chdir(course / "exercises")
    monkeypatch.setattr(scripts, "_ran", {})
    monkeypatch.setattr(scripts, "_written", {})
    scripts._record(_Ran("c3", "def f(x):\n    return 3 * x"))  # before any write_script: nothing written
    assert not (course / "runs").exists()
    path = scripts.write_script("00_tiny.ipynb")
    capsys.readouterr()
    scripts._record(_Ran("c3", "def f(x):\n    return 5 * x"))  # the learner edits the cell and runs it again
    assert "return 5 * x" in path.read_text()
    assert capsys.readouterr().out == "(rewrote runs/mine/tiny.py from this cell, as the terminal will run it)\n"
    scripts._record(_Ran("c4", "print(f(1))"))  # a cell that is not the script's: nothing
    scripts._record(_Ran("c3", "def f(x):\n    return 7 * x", success=False))  # a cell that failed: not written
    assert "return 5 * x" in path.read_text() and capsys.readouterr().out == ""


def test_the_notebooks_script_check_names_the_cell_and_its_line(tmp_path, monkeypatch):
    """check.script in a notebook: the checker's verdict on a line of the written script, pointed at the cell."""
    from workshop_lib.engine import script
    from workshop_lib.engine.common import CheckFailed

    monkeypatch.setattr(scripts, "_ran", {})
    monkeypatch.setattr(scripts, "_written", {})
    path = scripts.write_script(REPO / "notebooks" / "04a_patterns.ipynb", to=tmp_path / "step4_snapshots.py")
    at = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if "torch.save(snapshot, tmp)" in line)
    said = f"step4_snapshots.py: rank 0 wrote snapshot.pt with torch.save straight into place (line {at}): a kill"
    monkeypatch.setattr(script, "check_scripts", lambda paths, steps: [("wrong", said)])  # the checker's verdict
    with pytest.raises(CheckFailed) as err:
        script.check(path)
    assert str(err.value) == said.replace(f"(line {at})", "(cell `def save_snapshot` line 7)")
