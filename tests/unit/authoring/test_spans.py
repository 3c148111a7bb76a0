"""Solution spans: the solution and exercise versions of a cell, nbgrader-style markers, a debugging lab's bug."""

from __future__ import annotations

import pytest

from workshop_lib.authoring import spans
from workshop_lib.errors import WorkshopError

CELL = """def f(x):
    y = x + 1
    # TODO: double y
    ### BEGIN SOLUTION
    y = 2 * y
    ### END SOLUTION
    return y"""


DEBUG_CELL = """def f(x, rank):
    ### BEGIN BROKEN
    # y = x + 1 if rank == 0 else None  # only rank 0 needs it
    #
    #     # an indented comment stays a comment
    ### END BROKEN
    ### BEGIN SOLUTION
    y = x + 1
    ### END SOLUTION
    return y"""


def test_solution_drops_the_hint_and_the_markers():
    assert spans.solution_source(CELL) == "def f(x):\n    y = x + 1\n    y = 2 * y\n    return y"


def test_a_hint_may_run_over_several_comment_lines():
    cell = ("def f(x):\n    # TODO: double x\n    #       (read: the docs)\n    ### BEGIN SOLUTION\n    x = 2 * x\n"
            "    ### END SOLUTION\n    return x")
    assert spans.solution_source(cell) == "def f(x):\n    x = 2 * x\n    return x"
    assert spans.exercise_source(cell) == ("def f(x):\n    # TODO: double x\n    #       (read: the docs)\n"
                                           '    raise NotImplementedError("fill in the TODO above")\n    return x')
    with pytest.raises(WorkshopError, match=r"needs a '# TODO: \.\.\.' hint just above"):
        spans.solution_source("# a comment, not a hint\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n")


def test_exercise_keeps_the_hint_and_raises_at_its_indent():
    ex = spans.exercise_source(CELL)
    assert ex == ('def f(x):\n    y = x + 1\n    # TODO: double y\n'
                  '    raise NotImplementedError("fill in the TODO above")\n    return y')
    namespace = {}
    exec(ex, namespace)
    with pytest.raises(NotImplementedError):
        namespace["f"](1)


@pytest.mark.parametrize(("source", "message"), [
    ("# TODO: x\n### BEGIN SOLUTION\nx = 1\n", "never closed"),
    ("x = 1\n### END SOLUTION\n", "has no '### BEGIN SOLUTION'"),
    ("### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n", "needs a '# TODO: ...' hint"),
    ("# TODO: x\n### BEGIN SOLUTION\n# TODO: y\n### BEGIN SOLUTION\n", "inside another span"),
    # a debugging lab's bug: commented out (the solution notebook must not run it), in a whole block
    ("### BEGIN BROKEN\ny = None\n### END BROKEN\n### BEGIN SOLUTION\ny = 1\n### END SOLUTION", "not commented out"),
    ("# y = None\n### END BROKEN\n### BEGIN SOLUTION\ny = 1\n### END SOLUTION", "has no '### BEGIN BROKEN'"),
])
def test_broken_markers_are_errors_naming_the_cell(source, message):
    with pytest.raises(WorkshopError, match=message):
        spans.exercise_source(source, "nb.ipynb cell 3")


def test_a_debugging_lab_gives_the_learner_the_bug_and_no_hint():
    """The exercise holds the broken code (uncommented) and nothing of the fix; the solution holds only the fix."""
    ex = spans.exercise_source(DEBUG_CELL)
    assert ex == ("def f(x, rank):\n    y = x + 1 if rank == 0 else None  # only rank 0 needs it\n\n"
                  "        # an indented comment stays a comment\n    return y")
    assert "TODO" not in ex and "NotImplementedError" not in ex and "BROKEN" not in ex
    assert spans.solution_source(DEBUG_CELL) == "def f(x, rank):\n    y = x + 1\n    return y"
    namespace: dict = {}
    exec(ex, namespace)
    assert namespace["f"](1, rank=1) is None  # the bug runs in the exercise
    exec(DEBUG_CELL, namespace)
    assert namespace["f"](1, rank=1) == 2  # the solution notebook runs its cell as it is: the bug is a comment


PREDICTED = "guess = None  # your prediction\n### BEGIN PREDICTION\nguess = 0.01\n### END PREDICTION\ncheck(guess)"


def test_a_prediction_block_runs_in_the_solution_and_is_gone_from_the_exercise():
    assert spans.solution_source(PREDICTED) == "guess = None  # your prediction\nguess = 0.01\ncheck(guess)"
    assert spans.exercise_source(PREDICTED) == "guess = None  # your prediction\ncheck(guess)"
    assert spans.has_spans(PREDICTED)
