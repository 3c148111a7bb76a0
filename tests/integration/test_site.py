"""The lesson site builds from the repository, warning-free and offline; its links resolve; a browser shows it.

One build (``python -m tools.site``, as a user runs it, into a temporary folder) serves every test
here. The browser test uses the headless Chromium and playwright of tests/integration/test_jupyterlab.py
(the system's Chromium, never ``playwright install``); without them it skips.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from tests.conftest import REPO
from tests.integration.test_jupyterlab import ARTIFACTS, CHROMIUM_ARGS, _chromium, _expected_outputs
from tools import sitelinks
from tools.site import episodes

pytestmark = pytest.mark.slow  # a Sphinx build in a child process, a browser
BUILD_LIMIT_S = 90  # about a minute on 2 cores, with room for a loaded machine


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The built site's folder (the build's output is kept in site.log beside it)."""
    out = tmp_path_factory.mktemp("site") / "html"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tools.site", "--out", str(out), "--fresh"],
                          capture_output=True, text=True, timeout=180, cwd=REPO)
    seconds = time.monotonic() - start
    (out.parent / "site.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"the site did not build:\n{proc.stderr[-4000:]}"
    out.parent.joinpath("seconds").write_text(f"{seconds:.1f}")
    return out


@pytest.mark.timeout(200)
def test_the_site_builds_warning_free_offline_within_a_minute(site):
    log = (site.parent / "site.log").read_text()
    seconds = float((site.parent / "seconds").read_text())
    assert "WARNING" not in log and "ERROR" not in log, log[-4000:]
    assert seconds < BUILD_LIMIT_S, f"the site took {seconds:.0f} s to build, more than {BUILD_LIMIT_S}"
    print(f"site built in {seconds:.1f} s")


@pytest.mark.timeout(200)
def test_every_notebook_is_an_episode_with_its_stated_time_and_its_exercise_notebook(site):
    eps = episodes.episodes()
    pages = {p.stem for p in (site / "episodes").glob("*.html")}
    assert pages == {e.name for e in eps}, f"episode pages {sorted(pages)}, notebooks {[e.name for e in eps]}"
    for e in eps:
        html = (site / "episodes" / f"{e.name}.html").read_text()
        assert e.stated is not None, f"notebooks/{e.path.name} states no time in its first cell"
        assert f"about {e.stated} minutes" in html, f"{e.name}'s page does not show its time ({e.stated} min)"
        assert re.search(rf'href="[^"]*_downloads/\w+/{re.escape(e.path.name)}"', html), \
            f"{e.name}'s page does not link its exercise notebook"
        for box in ("objectives", "questions", "keypoints", "instructor-note"):
            assert f'class="admonition-{box} {box} admonition' in html, f"{e.name}'s page has no {box} box"
        cells = [c for c in nbformat.read(e.path, as_version=4).cells if "### BEGIN SOLUTION" in c.source]
        assert html.count(' exercise important admonition"') == len(cells), f"{e.name}: not one box per exercise cell"
        assert html.count("Show the solution") == len(cells), f"{e.name}: not every solution is folded"


@pytest.mark.timeout(200)
def test_the_home_page_schedule_states_each_notebooks_time(site):
    html = (site / "index.html").read_text()
    for e in episodes.episodes():
        assert e.stated is not None, f"notebooks/{e.path.name} states no time in its first cell"
        row = [r for r in re.findall(r"<tr.*?</tr>", html, re.S) if f'href="episodes/{e.name}.html"' in r]
        assert len(row) == 1, f"the home page's schedule has {len(row)} rows for {e.name}, not 1"
        assert f"~{e.stated} min" in row[0], f"the home page gives {e.name} another time than {e.stated} min"


@pytest.mark.timeout(200)
def test_every_link_and_every_file_the_pages_name_resolves(site):
    problems = sitelinks.check_html(site) + sitelinks.check_sources()
    assert not problems, "\n".join(problems)


@pytest.mark.timeout(200)
def test_the_home_page_and_an_episode_open_in_a_browser_with_their_figures(site):
    chromium = _chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the package only)")
    with_figures = next(e for e in episodes.episodes() if "image" in _expected_outputs(e.path))
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            page.goto((site / "index.html").as_uri())
            assert "Data-parallel training with PyTorch DDP" in page.title()
            page.screenshot(path=str(ARTIFACTS / "site_home.png"))

            page.locator(f'table a[href="episodes/{with_figures.name}.html"]').first.click()  # from the schedule
            page.wait_for_load_state("load")
            assert page.url.endswith(f"episodes/{with_figures.name}.html")
            figures = page.locator(".cell_output img")
            assert figures.count() > 0, f"{with_figures.name}'s page shows no figure"
            loaded = figures.evaluate_all("imgs => imgs.map(i => i.complete && i.naturalWidth > 0)")
            assert all(loaded), f"{with_figures.name}: figures {[i for i, ok in enumerate(loaded) if not ok]} did not load"

            toggle = page.get_by_text("Show the solution").first  # a folded solution opens
            if toggle.count():
                toggle.click()
                assert page.get_by_text("Hide the solution").first.is_visible()
            figures.last.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / f"site_{with_figures.name}.png"))
            print(f"{with_figures.name}: {len(loaded)} figure(s) loaded")
        finally:
            browser.close()


@pytest.mark.timeout(200)
def test_the_instructor_guide_shows_both_plans_and_each_episode_its_room_minutes(site):
    from tools import budget

    html = (site / "instructor.html").read_text()
    room = {e.name: (e.teaching, e.practice) for e in episodes.episodes()}
    for plan in budget.PLANS:
        for _, minutes, what in budget.plan_rows(plan, room):
            shown = re.search(r"\d+ min teaching, \d+ min exercises, \d+ min of buffer", what)
            row = shown.group(0) if shown else f"<td><p>{minutes}</p></td>"
            assert row in html, f"the instructor guide's {plan.name} lacks the row {what!r}"
    assert "17:30" in html and "3:00" in html, "the instructor guide does not end both plans at their hour"
    assert html.count('class="verdict ') >= 8, \
        "the instructor guide shows no quoted verdicts ({verdict} role)"
    for e in episodes.episodes():
        page = (site / "episodes" / f"{e.name}.html").read_text()
        assert f"{e.teaching} min teaching, {e.practice} min exercises" in page, \
            f"{e.name}'s page does not show a room's minutes ({e.teaching} teaching, {e.practice} exercises)"


KIT = ("kit/episodes", "kit/routines", "kit/learners", "kit/glossary", "kit/conduct", "kit/feedback")


def _text(html: str) -> str:
    """A page's characters, as a reader sees them, without spaces (the markup puts them anywhere): tags dropped,
    entities read."""
    import html as entities

    return "".join(entities.unescape(re.sub(r"<[^>]+>", " ", html)).split())


def _words(markdown: str) -> str:
    """Markdown as a page shows it, without spaces: no backticks or emphasis, quotes as Sphinx curls them."""
    return "".join(markdown.replace("`", "").replace("*", "").replace("'", "\N{RIGHT SINGLE QUOTATION MARK}").split())


@pytest.mark.timeout(200)
def test_every_episode_page_shows_its_objectives_and_its_timing_checkpoints(site):
    """Issue 47: each page states what learners can do after it, where a room should be at which minute, and (for
    instructors) what to draw on the board."""
    import yaml

    about = episodes.read_about(yaml.safe_load((REPO / "docs" / "episodes.yaml").read_text()))
    for e in episodes.episodes():
        html = (site / "episodes" / f"{e.name}.html").read_text()
        box = re.search(r'<div class="admonition-objectives objectives admonition.*?</ul>', html, re.S)
        assert box and "After this episode learners can:" in box.group(0), f"{e.name}'s page has no objectives box"
        goals = about[e.name].objectives
        assert goals, f"docs/episodes.yaml states no objectives for {e.name}"
        for goal in goals:
            assert _words(goal) in _text(box.group(0)), f"{e.name}'s objectives box lacks {goal!r}"
        assert 'class="admonition-at-the-board instructor-note admonition' in html, f"{e.name}'s page has no board notes"
        found = re.search(r'<div class="admonition-timing-checkpoints checklist admonition.*?</table>', html, re.S)
        assert found, f"{e.name}'s page has no timing checkpoints"
        shown = _text(found.group(0))
        marks = episodes.checkpoints(e)
        assert marks, f"{e.name} has no checkpoints to show"
        for mark in marks:
            assert _words(f"{mark.start} to {mark.end} {mark.title}") in shown, \
                f"{e.name}'s checkpoints lack minute {mark.start} to {mark.end}, {mark.title!r}"


@pytest.mark.timeout(200)
def test_the_instructors_kit_is_in_the_site_and_linked_from_the_instructor_guide(site):
    guide = (site / "instructor.html").read_text()
    home = (site / "index.html").read_text()
    for page in KIT:
        assert (site / f"{page}.html").is_file(), f"the site has no {page}.html"
        assert f'href="{page}.html' in guide, f"the instructor guide does not link {page}"
        assert f'href="{page}.html' in home, f"{page} is not in the site's table of contents"
    notes = (site / "kit" / "episodes.html").read_text()
    for e in episodes.episodes():
        table = _text(notes)
        first = episodes.checkpoints(e)[0]
        assert _words(f"{first.start} to {first.end} {first.title}") in table, f"the kit lacks {e.name}'s checkpoints"
    assert notes.count('class="verdict ') >= 30, "the kit's episode notes quote fewer than 30 of the checks' verdicts"
    glossary = (site / "kit" / "glossary.html").read_text()
    for term in ("rank", "local rank", "world size", "process group", "backend", "collective", "all-reduce", "bucket",
                 "DistributedSampler", "set_epoch", "DDP", "torchrun", "rendezvous", "store"):
        assert f'id="term-{term.replace(" ", "-")}"' in glossary, f"the glossary lacks {term!r}"
