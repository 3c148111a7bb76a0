"""A notebook becomes an episode page: its time, objectives, checkpoints, exercise boxes, folded solutions and key points."""

from __future__ import annotations

import copy
import dataclasses
import itertools

import nbformat
import pytest

from tools import budget, site
from tools.site import episodes, lab_site

EXERCISE = '''def make_sampler(dataset, env):
    # TODO: return a sampler that gives this rank its own shard.
    #       Read: section 1 above.
    ### BEGIN SOLUTION
    return DistributedSampler(dataset, num_replicas=env.world_size, rank=env.rank)
    ### END SOLUTION
'''


def tiny_notebook(tmp_path, first: str = "# 07 — A tiny lab\n\n**Time: about 9 minutes.**\n\nYou will shard data."):
    nb = nbformat.v4.new_notebook()
    nb.metadata["lab"] = {"step": "an optional part", "outcome": "a sampler"}
    nb.cells = [nbformat.v4.new_markdown_cell(first, id="first"),
                nbformat.v4.new_raw_cell('"""Step 7."""', id="doc", metadata={"tags": ["script:step7_tiny"]}),
                nbformat.v4.new_markdown_cell("## 1. Sharding (5 min)\n\nText.", id="s1"),
                nbformat.v4.new_code_cell(EXERCISE, id="ex", metadata={"tags": ["script:step7_tiny"]}),
                nbformat.v4.new_code_cell("check.shards(make_sampler)", id="check"),
                nbformat.v4.new_markdown_cell("## Recap (1 min)\n\n* one\n* two\n\nNext: 08.", id="recap")]
    path = tmp_path / "07_tiny.ipynb"
    nbformat.write(nb, path)
    return path


def test_a_notebook_is_described_by_what_it_states(tmp_path):
    ep = episodes.describe(tiny_notebook(tmp_path))
    assert (ep.name, ep.title, ep.stated, ep.exercises, ep.scripts) == ("07_tiny", "A tiny lab", 9, 1, ["step7_tiny"])
    assert ep.sections == [("1. Sharding (5 min)", 5), ("Recap (1 min)", 1)]
    assert not ep.core and ep.exercise_notebook == "exercises/07_tiny.ipynb" and ep.outcome == "a sampler"


def test_the_page_holds_the_boxes_and_folds_the_solution(tmp_path):
    ep = episodes.describe(tiny_notebook(tmp_path))
    nb = episodes.episode_notebook(ep, ["Why a shard?"])
    text = [c.source for c in nb.cells]
    assert text[0] == "# 07 — A tiny lab\n\n**Time: about 9 minutes.**\n"
    assert text[1] == ":::{objectives}\nYou will shard data.\n:::\n"
    card = text[2]
    assert "**Time:** about 9 minutes" in card
    assert "{download}`exercises/07_tiny.ipynb <../../exercises/07_tiny.ipynb>`" in card
    assert ":::{questions}\n- Why a shard?\n:::" in card and "| 1. Sharding (5 min) | 5 min |" in card
    assert text[3] == '```python\n"""Step 7."""\n```'  # the raw cell, shown as Python
    box = next(c for c in nb.cells if c.get("id") == "ex-exercise")
    assert box.source.startswith(":::{exercise} Exercise: `make_sampler`\nReturn a sampler that gives this rank its own "
                                 "shard. Read: section 1 above.")
    solution = next(c for c in nb.cells if c.get("id") == "ex")
    assert "hide-input" in solution.metadata["tags"]
    assert solution.metadata["mystnb"]["code_prompt_show"] == "Show the solution"
    assert text[-1] == "## Recap (1 min)\n\n:::{keypoints}\n* one\n* two\n:::\n\nNext: 08."
    assert nbformat.read(ep.path, as_version=4).cells[3].metadata["tags"] == ["script:step7_tiny"]  # source untouched


def test_what_follows_the_time_is_the_objectives_else_the_outcome():
    head, goals = episodes.objectives("# 07 — X\n\n**Time: about 9 minutes.**", "a trained model")
    assert (head, goals) == ("# 07 — X\n\n**Time: about 9 minutes.**\n", "At the end you have a trained model.")
    head, goals = episodes.objectives("# 07 — X\n\n**Time: about 9 minutes.** A tour of it.\n\n* a\n* b")
    assert (head, goals) == ("# 07 — X\n\n**Time: about 9 minutes.**\n", "A tour of it.\n\n* a\n* b")


def test_every_span_of_a_cell_has_its_hint():
    two = EXERCISE + "    # TODO: and leave the group.\n    ### BEGIN SOLUTION\n    pass\n    ### END SOLUTION\n"
    assert episodes.hints(two) == ["Return a sampler that gives this rank its own shard. Read: section 1 above.",
                                   "And leave the group."]


def test_pages_of_notebooks_that_are_gone_are_removed(tmp_path, monkeypatch):
    source = tiny_notebook(tmp_path)
    monkeypatch.setattr(episodes.build, "source_notebooks", lambda: [source])
    dest = tmp_path / "episodes"
    dest.mkdir()
    (dest / "04_beyond.ipynb").write_text("{}")
    written = episodes.write_episodes({}, dest)
    assert [p.name for p in written] == ["07_tiny.ipynb"] and sorted(p.name for p in dest.iterdir()) == ["07_tiny.ipynb"]
    before = (dest / "07_tiny.ipynb").stat().st_mtime_ns
    episodes.write_episodes({}, dest)
    assert (dest / "07_tiny.ipynb").stat().st_mtime_ns == before  # unchanged: not rewritten, Sphinx skips it


def test_the_schedule_and_the_readme_rows_come_from_the_notebooks(tmp_path, monkeypatch):
    source = tiny_notebook(tmp_path)
    monkeypatch.setattr(episodes.build, "source_notebooks", lambda: [source])
    table = lab_site.schedule("all")  # no room minutes in its metadata: said so, not made up
    assert "| {doc}`07_tiny </episodes/07_tiny>`: A tiny lab | not stated | not stated | ~9 min | a sampler |" in table
    assert table.endswith("| **total**: 1 notebook(s) | **0 min** | **0 min** | **9 min** | |")
    assert lab_site.schedule("core").splitlines()[-1] == "| **total**: 0 notebook(s) | **0 min** | **0 min** | **0 min** | |"
    assert "| &nbsp;&nbsp;&nbsp;&nbsp;1. Sharding | not stated | not stated | 5 min | |" in lab_site.schedule(
        "all", sections=True)
    assert lab_site.readme_rows() == ("| `07_tiny` | A tiny lab | not stated | not stated | ~9 min | "
                                      "`solutions/step7_tiny.py` |")
    nb = nbformat.read(source, as_version=4)
    nb.metadata["lab"].update(teaching=6, exercises=8)  # the room's minutes, as tools.build --times --restate writes
    nbformat.write(nb, source)
    assert lab_site.readme_rows().startswith("| `07_tiny` | A tiny lab | 6 min | 8 min | ~9 min |")
    assert episodes.hours(130) == "2 h 10 min"


def test_a_debugging_lab_is_labelled_as_one_not_as_an_exercise(tmp_path):
    ep = episodes.describe(tiny_notebook(tmp_path))
    broken = ("def train(cfg):\n    ### BEGIN BROKEN\n    # spread = spread_of(model) if rank == 0 else None\n"
              "    ### END BROKEN\n    ### BEGIN SOLUTION\n    spread = spread_of(model)\n    ### END SOLUTION\n")
    box = episodes.exercise_box(broken, ep)
    assert box.startswith(":::{exercise} Debugging lab: `train`") and "holds the broken code" in box
    assert "TODO" not in box and "NotImplementedError" not in box and "The fix is folded" in box
    assert episodes.exercise_box(EXERCISE, ep).startswith(":::{exercise} Exercise: `make_sampler`")


def test_a_build_is_fresh_when_the_generated_pages_changed(tmp_path):
    pages = ["episodes/00_baseline", "episodes/04a_patterns", "solutions/step0_baseline.py"]
    assert site.needs_fresh(tmp_path, pages)  # no build recorded yet
    (tmp_path / site.STAMP).write_text("\n".join(pages) + "\n")
    assert not site.needs_fresh(tmp_path, pages)  # the same episodes: incremental
    assert site.needs_fresh(tmp_path, [*pages[:1], "episodes/04_beyond", *pages[2:]])  # one renamed
    assert site.needs_fresh(tmp_path, pages[:2])  # a script is gone: its copy in _downloads must go too


def test_the_generated_pages_name_every_episode_and_its_scripts(tmp_path, monkeypatch):
    source = tiny_notebook(tmp_path)
    monkeypatch.setattr(episodes.build, "source_notebooks", lambda: [source])
    assert site.generated_pages() == ["episodes/07_tiny", "solutions/step7_tiny.py"]


def test_the_plan_fills_the_session_with_the_stated_times_a_break_and_a_buffer(tmp_path, monkeypatch):
    sources = []
    for name in ("00_a", "01_b", "02_c", "03_d"):
        (tmp_path / name).mkdir()
        path = tiny_notebook(tmp_path / name)
        nb = nbformat.read(path, as_version=4)
        nb.metadata["lab"].update(teaching=10, exercises=8)
        nbformat.write(nb, path)
        sources.append(path.rename(path.with_name(f"{name}.ipynb")))
    monkeypatch.setattr(episodes.build, "source_notebooks", lambda: sources)
    session = budget.Plan("test session", 120, ((5, "welcome"), "00_", "01_", (10, "break"), "02_", "03_",
                                                (5, "wrap-up")))
    rows = lab_site.plan(session)
    assert sum(m for _, m, _ in rows) == 120 and rows[0][0] == 0
    assert all(start + m == after for (start, m, _), (after, _, _) in itertools.pairwise(rows))  # no gap, no overlap
    names = [what for _, _, what in rows]
    assert names.index("break") == 3 and "01_b" in names[2]  # the break after 01
    # 4 notebooks of 10 + 8 min: 120 - 5 - 10 - 5 - 4 x 18 = 28 min of buffer, shared out evenly
    assert [m for _, m, what in rows if "episodes" in what] == [25, 25, 25, 25]
    assert budget.plan_sums(session, {n: (10, 8) for n in ("00_a", "01_b", "02_c", "03_d")}) == (40, 32, 28)
    assert budget.stretches(session, {n: (10, 8) for n in ("00_a", "01_b", "02_c", "03_d")}) == [(0, 55), (65, 55)]
    assert lab_site.plan_table(session).splitlines()[-1] == "| 2:00 | | end |"
    # 180 min: the shares that would keep a stretch over an hour without a break go where a stretch has room
    long = budget.Plan("long session", 180, ((5, "welcome"), "00_", (10, "break"), "01_", "02_", (10, "break"),
                                             "03_", (5, "wrap-up")))
    room = {n: (10, 8) for n in ("00_a", "01_b", "02_c", "03_d")}
    (_, first), (_, middle), (_, last) = budget.stretches(long, room)
    assert middle == 60 and first <= 60 and last <= 60 and budget.plan_faults(long, room) == []
    assert sum(int(what.split(", ")[-1].split()[0]) for _, _, what in budget.plan_rows(long, room)
               if "buffer" in what) == budget.plan_sums(long, room)[2] == 78  # all of it, shared
    with pytest.raises(ValueError, match="do not fit"):
        lab_site.plan(budget.Plan("too short", 60, ("00_", "01_", "02_", "03_", (10, "break"))))


# ---- the instructor's kit on every page: measurable objectives, timing checkpoints (issue 47) -------------------

def timed_notebook(tmp_path):
    """The tiny notebook with a room's minutes stated: 2 before the first heading, then 4 + 8 and 1 + 0."""
    path = tiny_notebook(tmp_path)
    nb = nbformat.read(path, as_version=4)
    nb.metadata["lab"].update(teaching=7, exercises=8)
    for cell in nb.cells:
        if cell.get("id") == "s1":
            cell.metadata["lab"] = {"teaching": 4, "exercises": 8, "board": 2}
        if cell.get("id") == "recap":
            cell.metadata["lab"] = {"teaching": 1, "exercises": 0}
    nbformat.write(nb, path)
    return path


def test_the_checkpoints_are_the_sections_start_and_end_from_their_room_minutes(tmp_path):
    ep = episodes.describe(timed_notebook(tmp_path))
    assert episodes.checkpoints(ep) == [
        episodes.Checkpoint(2, 14, "1. Sharding", 4, 8, ("make_sampler",), 2),  # 7 + 8 - (4 + 8 + 1 + 0) = 2 before it
        episodes.Checkpoint(14, 15, "Recap", 1, 0, ())]
    table = episodes.checkpoint_table(ep)
    assert "| 2 to 14 | 1. Sharding | 4 (2 at the board) + 8 | `make_sampler` |" in table
    assert "| 14 to 15 | Recap | 1 + 0 | (no exercise) |" in table
    (tmp_path / "untimed").mkdir()
    assert episodes.checkpoints(episodes.describe(tiny_notebook(tmp_path / "untimed"))) == []  # nothing to compute from


def test_the_page_shows_the_measurable_objectives_and_the_checkpoints(tmp_path):
    ep = episodes.describe(timed_notebook(tmp_path))
    nb = episodes.episode_notebook(ep, ["Why a shard?"], ["write a sampler that shards the data.", "explain padding."],
                                   "§1: the indices dealt like cards.")
    text = {c.get("id"): c.source for c in nb.cells}
    assert text["first"] == "# 07 — A tiny lab\n\n**Time: about 9 minutes.**\n\nYou will shard data.\n"  # the lead stays
    assert text["first-objectives"] == (":::{objectives}\nAfter this episode learners can:\n\n"
                                        "- write a sampler that shards the data.\n- explain padding.\n:::\n")
    box = text["first-checkpoints"]
    assert box.startswith(":::{checklist} Timing checkpoints\n") and "| 2 to 14 | 1. Sharding |" in box
    assert "7 min teaching, 8 min exercises, 15 min in all" in box
    assert text["first-board"] == ":::{instructor-note} At the board\n§1: the indices dealt like cards.\n:::\n"
    (tmp_path / "untimed").mkdir()
    untimed = episodes.episode_notebook(episodes.describe(tiny_notebook(tmp_path / "untimed")), [], [])
    assert not any(c.get("id", "").endswith("-checkpoints") for c in untimed.cells)


def real_about() -> dict:
    import yaml

    return yaml.safe_load((episodes.DOCS / "episodes.yaml").read_text())


def test_every_episode_has_questions_measurable_objectives_board_notes_and_checkpoints():
    eps = episodes.episodes()
    assert {e.name for e in eps} <= set(real_about())
    assert episodes.problems(episodes.read_about(real_about()), eps) == []
    for e in eps:
        assert len(episodes.read_about(real_about())[e.name].objectives) >= 3, f"{e.name}: fewer than 3 objectives"
        assert episodes.checkpoints(e), f"{e.name} has no timing checkpoints"


@pytest.mark.parametrize("name", ["00_baseline", "03_ddp", "06_beyond_ddp"])
def test_an_episode_without_objectives_board_notes_or_checkpoints_is_named(name):
    """A copy of the real data with one episode's objectives removed, its board notes removed, an objective made
    vague, and the episode's room minutes gone: each problem is named (the site's build warns with it, and so
    fails)."""
    eps = episodes.episodes()
    data = copy.deepcopy(real_about())
    del data[name]["objectives"]
    assert episodes.problems(episodes.read_about(data), eps) == [
        f"docs/episodes.yaml has no objectives for {name}: add what learners can do after it"]
    data = copy.deepcopy(real_about())
    data[name]["board"] = ""
    assert episodes.problems(episodes.read_about(data), eps) == [
        f"docs/episodes.yaml has no board notes for {name}: say what the instructor draws"]
    data = copy.deepcopy(real_about())
    data[name]["objectives"][0] = "understand DDP."  # not measurable: nobody can see a learner understand
    assert episodes.problems(episodes.read_about(data), eps)[0].startswith(
        f"docs/episodes.yaml: {name}'s objective 'understand DDP.' does not start with an action verb")
    data = copy.deepcopy(real_about())
    data[name]["objectives"][0] = {"write the loop": "and more"}  # YAML's reading of an unquoted "a: b"
    assert "is not text: put it in quotes" in episodes.problems(episodes.read_about(data), eps)[0]
    timed = next(e for e in eps if e.name == name)
    untimed = dataclasses.replace(timed, room=[(title, None, x) for title, _, x in timed.room])
    assert episodes.problems(episodes.read_about(real_about()), [untimed]) == [
        f"{name} has no timing checkpoints: a section states no room minutes (python -m tools.build --times --restate "
        "writes them)"]


def test_the_build_warns_of_an_episode_without_objectives(tmp_path, caplog):
    """The site's build (warnings are errors) reads docs/episodes.yaml and warns of what a page would lack."""
    import types

    import yaml

    data = real_about()
    del data["02_distributed_sampler"]["objectives"]
    (tmp_path / lab_site.QUESTIONS).write_text(yaml.safe_dump(data, allow_unicode=True))
    app = types.SimpleNamespace(confdir=str(tmp_path), srcdir=str(tmp_path), outdir=str(tmp_path / "html"))
    with caplog.at_level("WARNING"):
        lab_site._write_episodes(app, None)
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == ["docs/episodes.yaml has no objectives for 02_distributed_sampler: add what learners can do after it"]
    page = nbformat.read(tmp_path / "episodes" / "03_ddp.ipynb", as_version=4)
    assert any(c.source.startswith(":::{checklist} Timing checkpoints") for c in page.cells)
