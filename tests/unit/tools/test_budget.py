"""The count every stated time comes from: words/150 + code lines/15 + 8 per exercise + reading + run time."""

from __future__ import annotations

import nbformat
import pytest

from tools import budget

EXERCISE = "x = 1\n\n# TODO: set y\n### BEGIN SOLUTION\ny = 2\n### END SOLUTION\n"


def _notebook(tmp_path, section_time: int = 3, total: int = 5):
    v4 = nbformat.v4
    nb = v4.new_notebook()
    ran = v4.new_code_cell("print(1)")
    ran.metadata["execution"] = {"iopub.execute_input": "2026-12-03T10:00:00.000000Z",
                                 "shell.execute_reply": "2026-12-03T10:00:30.000000Z"}
    nb.cells = [v4.new_markdown_cell(f"# Title\n\n**Time: about {total} minutes.**\n\n" + "word " * 144),
                v4.new_code_cell("import os\n\n# a comment a learner reads\n"),
                v4.new_markdown_cell(f"## 1. A section ({section_time} min)\n\n" + "word " * 145),
                v4.new_code_cell(EXERCISE), ran,
                v4.new_raw_cell("not shown as such: " + "word " * 100),
                v4.new_markdown_cell("## Recap (1 min)\n\nDone.")]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    return path


def test_the_count_of_a_notebook_and_its_sections(tmp_path):
    c = budget.count(_notebook(tmp_path))
    assert (c.title, c.stated, c.exercises) == ("nb", 5, 1)
    assert c.words == 150 + 151 + 5  # title and intro; heading and section prose; the recap
    assert c.code_lines == 2 + 3 + 1  # blank lines left out; comments and hints counted; the span as the learner gets it
    assert c.run_s == pytest.approx(30)
    assert c.minutes == pytest.approx(306 / 150 + 6 / 15 + 8 + 0.5)
    section, recap = c.parts
    assert (section.title, section.stated) == ("1. A section (3 min)", 3)
    assert section.minutes == pytest.approx(151 / 150 + 4 / 15 + 8 + 0.5)  # the set-up cell belongs to the notebook only
    assert recap.stated == 1 and recap.words == 5


def test_a_stated_time_off_by_more_than_a_third_is_named(tmp_path):
    c = budget.count(_notebook(tmp_path, section_time=5, total=11))
    section = c.parts[0]  # counts 9.8 min: 5 is off by more than a third, 11 is not
    assert section.off() == "'1. A section (5 min)' states 5 min; the count says 10 min"
    assert c.off() is None
    assert budget.count(_notebook(tmp_path, section_time=10)).parts[0].off() is None
    assert "states no time" in budget.Count("Recap").off()
    short = budget.Count("Recap", stated=1, words=45)  # counts 0.3 min: no section states 0 min
    assert short.off() is None
    assert budget.Count("Recap", stated=2, words=45).off() == "'Recap' states 2 min; the count says 0 min"


def test_the_table_has_a_row_per_notebook_and_section(tmp_path):
    rows = budget.table([budget.count(_notebook(tmp_path))]).splitlines()
    assert len(rows) == 1 + 3 and rows[1].startswith("nb ") and rows[2].startswith("  1. A section")


def test_reading_a_cell_sends_the_learner_to_counts_its_stated_minutes(tmp_path):
    path = _notebook(tmp_path)
    nb = nbformat.read(path, as_version=4)
    nb.cells[2].source += "\n\nRead (5 min): the DistributedSampler docs."
    nbformat.write(nb, path)
    c = budget.count(path)
    assert c.reading == 5 and c.parts[0].reading == 5
    assert c.minutes == pytest.approx((306 + 6) / 150 + 6 / 15 + 8 + 5 + 0.5)


def test_figures_shell_commands_and_the_projector_count_as_a_room_spends_them(tmp_path):
    v4 = nbformat.v4
    nb = v4.new_notebook()
    drawn = v4.new_code_cell("plot()")
    drawn.outputs = [v4.new_output("display_data", data={"image/png": "iVBOR", "text/plain": "<Figure>"})]
    shown = v4.new_code_cell("plot()")
    shown.outputs = [v4.new_output("display_data", data={"image/png": "iVBOR"})]
    nb.cells = [v4.new_markdown_cell("# T\n\n**Time: about 3 minutes.**"),
                v4.new_markdown_cell("## 1. Runs (3 min)"), drawn,
                v4.new_code_cell("!cd {root} && torchrun --standalone --nproc_per_node=2 a.py\nx = 1"),
                v4.new_markdown_cell("## 2. On the projector: three jobs (2 min)"), shown]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    c = budget.count(path)
    runs, projector = c.parts
    assert (runs.figures, runs.commands) == (1, 1) and runs.minutes == pytest.approx(5 / 150 + 3 / 15 + 1 + 1)
    assert projector.figures == 1 and c.figures == 1  # the instructor's section is left out of the notebook's count
    assert c.projector == pytest.approx(projector.minutes) and "on the projector" in budget.table([c])


def test_a_terminal_step_a_markdown_cell_gives_to_type_counts_as_a_command(tmp_path):
    text = ("Try it in a terminal:\n\n```bash\nTORCH_X=1 torchrun --standalone --nproc_per_node=2 a.py --out runs/x\n"
            "ps -ef | grep '[a].py'   # in a second terminal\nkill -9 <PID>\n```\n\nThen:\n\n"
            "    python -m workshop_lib.diagnose\n\nwhich prints, say:\n\n    RuntimeError: a timeout\n\n"
            "```python\nimport torch\npython = 1\n```\n\nand `torchrun --standalone a.py` inline is prose.")
    assert budget.terminal_steps(text) == 4  # three fenced lines, one indented; not the error, the Python, the prose
    v4 = nbformat.v4
    nb = v4.new_notebook()
    nb.cells = [v4.new_markdown_cell("# T\n\n**Time: about 5 minutes.**"), v4.new_markdown_cell("## 1. Typed (5 min)"),
                v4.new_markdown_cell(text)]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    c = budget.count(path)
    assert c.commands == c.parts[0].commands == 4
    assert c.minutes == pytest.approx(c.words / 150 + 4 * budget.MIN_PER_COMMAND)
