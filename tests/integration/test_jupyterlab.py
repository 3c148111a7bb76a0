"""The notebooks run in JupyterLab itself: Run All Cells in a headless Chromium, no errors, widgets and plots shown.

nbval runs the notebooks through a bare kernel; this runs them the way a learner
does, through the JupyterLab UI, so a widget that does not render or a cell that
only fails under the front end is caught too. A second walk starts JupyterLab
with the lab's environment off PATH (issue 41) and runs 01 through the cell
after its ``!torchrun``. A screenshot of each walk goes to test-artifacts/.
Needs Chromium (``apt-get install chromium``) and the ``playwright`` package
(never ``playwright install``: the system Chromium is used); without them the
test skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from tests.conftest import REPO, cpu_env
from tools import jupyter_settings
from workshop_lib.launching.launch import free_port

# 02 has both kinds of rich output: launch.torchrun's epoch bar (a widget) and matplotlib figures.
# (Each notebook adds ~15 s; nbval already runs all of them.)
NOTEBOOKS = ("02_distributed_sampler.ipynb",)
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
RUN_TIMEOUT_S = 150  # one notebook, Run All Cells to the last output
# The system's PATH, without the lab environment's bin/: a server started as .venv/bin/jupyter lab, not activated.
OFF_PATH = "/usr/bin:/bin"
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook on show
NOT_FOUND = re.compile(r"torchrun.*not found|not found.*torchrun")  # each shell's words (sh, bash, zsh)

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
NEWS_PROMPT = "Would you like to get notified about official Jupyter news?"
IMAGE_MIMES = ("image/png", "image/svg+xml", "image/jpeg")

# Run All has ended: some cell ran ([n]), none is still queued ([*]), the kernel is idle. (After an
# error, the cells below it keep [ ]: the test then reports the error instead of waiting for them.)
RUN_FINISHED = """() => {
  const prompts = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt')]
    .map(p => p.textContent);
  const status = document.querySelector('#jp-main-statusbar')?.textContent || '';
  return prompts.some(t => /\\[\\d+\\]/.test(t)) && !prompts.some(t => t.includes('*')) && status.includes('Idle');
}"""


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("Chromium not found (apt-get install -y chromium chromium-driver)")
    return path


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            children.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _get(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


class Lab:
    """A JupyterLab server on 127.0.0.1 with its own root, settings and token; ``shell_path``: its PATH, else ours."""

    def __init__(self, root: Path, home: Path, shell_path: str | None = None):
        self.root, self.port, self.token = root, free_port(), secrets.token_hex(16)
        settings = home / "settings"
        # Every cell in the DOM (no windowing), and no autosave races. No news prompt nor update check: that comes
        # from the lab's own settings, as a learner gets them (tools/jupyter_settings.py), not from here.
        jupyter_settings.install(home / "lab-config")
        for name, value in {
            "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
            "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
        }.items():
            path = settings / f"{name}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(value))
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={root}", f"--LabApp.user_settings_dir={settings}",
               f"--LabApp.workspaces_dir={home / 'workspaces'}", "--LabApp.news_url=None"]
        env = cpu_env(JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_CONFIG_PATH=str(home / "lab-config"),
                      JUPYTER_RUNTIME_DIR=str(home / "runtime"),
                      JUPYTER_DATA_DIR=str(home / "data"),
                      IPYTHONDIR=str(home / "ipython"), MPLBACKEND="module://matplotlib_inline.backend_inline")
        if shell_path is not None:  # started by the environment's python by absolute path, the environment not activated
            env.update(PATH=shell_path)
            env.pop("VIRTUAL_ENV", None)
        self.log = home / "jupyterlab.log"
        self.proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self._wait_ready(timeout=90)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"JupyterLab exited with {self.proc.returncode}:\n{self.tail()}")
            with contextlib.suppress(OSError, ValueError):
                _get(self.url("api/status"))
                return
            time.sleep(0.5)
        raise AssertionError(f"JupyterLab did not answer within {timeout}s:\n{self.tail()}")

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def shutdown_kernels(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            for kernel in _get(self.url("api/kernels")):
                req = urllib.request.Request(self.url(f"api/kernels/{kernel['id']}"), method="DELETE")
                urllib.request.urlopen(req, timeout=30).close()

    def stop(self) -> None:
        """Shut the kernels down, then the server; SIGKILL whatever is left (kernels, forked ranks)."""
        leftovers = _descendants(self.proc.pid)
        self.shutdown_kernels()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def lab_and_browser(request, tmp_path):
    """(lab, browser): a JupyterLab server with copies of the notebooks, and a headless Chromium.

    Parametrized indirectly, the parameter is the server's PATH (:class:`Lab`'s ``shell_path``).
    """
    chromium = _chromium()
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the package only)")
    root = tmp_path / "course" / "notebooks"  # a course folder: steps 2 to 4 borrow cells of the other notebooks
    root.mkdir(parents=True)
    for name in NOTEBOOKS:
        if not (REPO / "notebooks" / name).is_file():
            pytest.skip(f"notebooks/{name} is not in this checkout")
    for source in (REPO / "notebooks").glob("*.ipynb"):
        shutil.copy(source, root / source.name)
    lab = Lab(root, tmp_path / "home", shell_path=getattr(request, "param", None))
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
            try:
                yield lab, browser
            finally:
                browser.close()
    finally:
        lab.stop()


def _expected_outputs(path: Path) -> set[str]:
    """What the stored (nbval-checked) outputs of a notebook contain: 'widget', 'image'."""
    kinds = set()
    for cell in nbformat.read(path, as_version=4).cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_MIME in data:
                kinds.add("widget")
            if any(m in data for m in IMAGE_MIMES):
                kinds.add("image")
    return kinds


def _menu(page, menu: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=menu).first.click()
    page.get_by_role("menuitem", name=item, exact=True).click()


def _open(lab: Lab, page, name: str) -> None:
    """Open ``name``: the first one by URL (loads JupyterLab), later ones by double-click in the file browser."""
    if page.url.startswith(lab.url("lab").split("?")[0]):
        _menu(page, "File", "Close All Tabs")
        page.wait_for_timeout(300)
        if page.locator(".jp-Dialog").count():  # "save your changes?": the run was saved already
            page.locator(".jp-Dialog").get_by_role("button", name="Discard").click()
        page.locator(".jp-DirListing-item", has_text=name).first.dblclick()
    else:
        page.goto(lab.url(f"lab/workspaces/uitest/tree/{name}"))  # a workspace of its own: only this notebook open
    page.locator(f"{PANEL} .jp-CodeCell").first.wait_for(timeout=60_000)
    page.locator("#jp-main-statusbar", has_text="Idle").wait_for(timeout=60_000)  # its kernel started


def _run_in_ui(lab: Lab, page, name: str, above: int | None = None) -> float:
    """Open ``name`` in JupyterLab, clear it, Run > Run All Cells, wait until the run ends; the seconds it took.

    Given ``above`` (a cell's index), Run > Run All Above Selected Cell with that cell selected instead.
    """
    opened = time.monotonic()
    _open(lab, page, name)
    _menu(page, "Edit", "Clear Outputs of All Cells")  # so [n] prompts and outputs can only come from this run
    page.wait_for_function("() => ![...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
                           ".some(p => /\\[\\d+\\]/.test(p.textContent))", timeout=10_000)
    if above is not None:  # a click on its prompt selects the cell (command mode), as a learner's does
        page.locator(f"{PANEL} .jp-Cell").nth(above).locator(".jp-InputPrompt").click()
        page.wait_for_function(f"i => document.querySelectorAll('{PANEL} .jp-Cell')[i]"
                               ".classList.contains('jp-mod-active')", arg=above, timeout=10_000)
    start = time.monotonic()
    print(f"{name}: opened with an idle kernel in {start - opened:.1f}s")
    _menu(page, "Run", "Run All Cells" if above is None else "Run All Above Selected Cell")
    page.wait_for_function(RUN_FINISHED, timeout=RUN_TIMEOUT_S * 1000, polling=500)
    return time.monotonic() - start


def _save_and_read(lab: Lab, page, name: str):
    """Save from the UI (Ctrl+S) and read back what JupyterLab wrote: the outputs as the front end has them."""
    before = (lab.root / name).stat().st_mtime_ns
    page.locator(f"{PANEL} .jp-Notebook").first.click()
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 30
    while True:  # saved: the file changed, the tab is clean again (the server answered), and it reads whole
        assert time.monotonic() < deadline, "JupyterLab did not save the notebook within 30 s"
        if (lab.root / name).stat().st_mtime_ns != before and \
                page.locator(".lm-TabBar-tab.jp-mod-current.jp-mod-dirty").count() == 0:
            try:
                return nbformat.read(lab.root / name, as_version=4)
            except (ValueError, nbformat.reader.NotJSONError):  # a write still in progress
                pass
        time.sleep(0.2)


def _check_notebook(lab: Lab, page, name: str) -> set[str]:
    """Run ``name`` through the UI, check it, screenshot it; what rendered: 'widget', 'image'."""
    expected = _expected_outputs(REPO / "notebooks" / name)
    seconds = _run_in_ui(lab, page, name)
    panel = page.locator(PANEL)

    # No cell shows an error, in the page or in what the UI saves (a cell tagged raises-exception may, on purpose).
    # JupyterLab draws an error as stderr output (data-mime-type application/vnd.jupyter.stderr) with its traceback.
    errors = panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                           has_text="Traceback (most recent call last)")
    saved = _save_and_read(lab, page, name)
    on_purpose = [i for i, c in enumerate(saved.cells) if "raises-exception" in c.metadata.get("tags", [])]
    failed = [f"cell {i}: {out.get('ename')}: {out.get('evalue')}" for i, cell in enumerate(saved.cells)
              for out in cell.get("outputs", []) if out.get("output_type") == "error" and i not in on_purpose]
    assert not failed, f"{name}: {failed}\n{lab.tail()}"
    assert errors.count() <= len(on_purpose), f"{name}: {errors.first.inner_text()}"
    not_run = [i for i, c in enumerate(saved.cells) if c.cell_type == "code" and not c.get("execution_count")]
    assert not not_run, f"{name}: cells {not_run} did not run"

    # Widgets are drawn (no "Error displaying widget"); matplotlib figures arrive as images the browser decoded.
    assert panel.get_by_text("Error displaying widget").count() == 0, f"{name}: a widget failed to render"
    bars = panel.locator(".jp-OutputArea-output .widget-hprogress")
    images = panel.locator(".jp-OutputArea-output img")
    rendered = {kind for kind, found in (("widget", bars), ("image", images)) if found.count() > 0}
    assert rendered >= expected, f"{name}: its stored outputs have {sorted(expected)}, the UI showed {sorted(rendered)}"
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"jupyterlab_{Path(name).stem}"
    if "widget" in rendered:
        bars.first.scroll_into_view_if_needed()
        page.screenshot(path=f"{shot}_progress.png")
    if "image" in rendered:
        images.last.scroll_into_view_if_needed()
        assert images.last.evaluate("img => img.complete && img.naturalWidth > 100"), f"{name}: a plot did not decode"
        page.screenshot(path=f"{shot}_plot.png")
    print(f"{name}: Run All Cells took {seconds:.1f}s in JupyterLab; rendered {sorted(rendered)}")
    return rendered


@pytest.mark.slow  # a JupyterLab server, a browser and a kernel that forks ranks
@pytest.mark.timeout(420)
def test_notebooks_run_in_jupyterlab_with_progress_bar_and_plot(lab_and_browser):
    lab, browser = lab_and_browser
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    rendered = set()
    for name in NOTEBOOKS:
        rendered |= _check_notebook(lab, page, name)
        lab.shutdown_kernels()  # the next notebook gets the CPUs
    # The announcements plugin asks once the app is restored, long before a notebook has run to its end.
    assert page.get_by_text(NEWS_PROMPT).count() == 0, "JupyterLab asked about Jupyter news: lab settings not applied"
    assert rendered >= {"widget", "image"}, f"{NOTEBOOKS} showed only {sorted(rendered)}: a tqdm bar and a plot expected"


def _text(outputs) -> str:
    """What a cell's saved outputs say: streams, text, and errors as IPython rendered them (colours dropped)."""
    parts = [out.get("text") or out.get("data", {}).get("text/plain") or "\n".join(out.get("traceback", []))
             for out in outputs]
    return re.sub(r"\x1b\[[0-9;]*m", "", "".join(parts))


@pytest.mark.slow  # a JupyterLab server, a browser and a kernel
@pytest.mark.timeout(240)
@pytest.mark.parametrize("lab_and_browser", [OFF_PATH], indirect=True, ids=["environment-off-PATH"])
def test_01_with_the_environment_off_path_names_the_missing_torchrun_in_one_line(lab_and_browser):
    """Issue 41: JupyterLab started as .venv/bin/jupyter lab (its kernel's PATH without the environment's bin/).
    01's `!torchrun` cell says the shell found no torchrun, and the cell after it says why, and the fix, in one line
    (not that the learner's workers printed no record). Run from the top through that cell, no further."""
    lab, browser = lab_and_browser
    name = "01_process_group.ipynb"
    cells = nbformat.read(REPO / "notebooks" / name, as_version=4).cells
    code = [i for i, c in enumerate(cells) if c.cell_type == "code"]
    shell = next(i for i in code if cells[i].source.startswith("!") and "torchrun" in cells[i].source)
    verdict = next(i for i in code if i > shell)
    (lab.root.parent / "solutions").mkdir()  # a clone's layout: lab_root() is the course folder, as a learner's
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    seconds = _run_in_ui(lab, page, name, above=verdict + 1)
    saved = _save_and_read(lab, page, name)

    ran = [i for i in code if saved.cells[i].get("execution_count")]
    assert ran == [i for i in code if i <= verdict], f"cells {ran} ran; those up to {verdict} expected\n{lab.tail()}"
    said = _text(saved.cells[shell].outputs)
    assert NOT_FOUND.search(said), f"the !torchrun cell said {said!r}"
    told = _text(saved.cells[verdict].outputs)
    assert told.startswith("WorkshopError: the run printed nothing, and this kernel's shell finds no torchrun on its "
                           "PATH"), told
    assert len(told.splitlines()) == 1 and "Traceback" not in told and "worker record" not in told, told
    assert "(the cell above says torchrun was not found)" in told  # true of what this kernel's $SHELL printed
    assert f"{sys.executable} -m torch.distributed.run" in told and ". .venv/bin/activate && jupyter lab" in told

    # The UI shows the same: the shell's words under the !torchrun cell, the one line under the next.
    ui_cells = page.locator(f"{PANEL} .jp-Cell")
    assert NOT_FOUND.search(ui_cells.nth(shell).locator(".jp-OutputArea").inner_text())
    shown = ui_cells.nth(verdict).locator(".jp-OutputArea-output")
    assert shown.count() == 1 and shown.inner_text().strip() == told, shown.all_inner_texts()
    ARTIFACTS.mkdir(exist_ok=True)
    shown.scroll_into_view_if_needed()
    page.screenshot(path=f"{ARTIFACTS}/jupyterlab_{Path(name).stem}_environment_off_path.png")
    print(f"{name}: cells {ran} ran in {seconds:.1f}s in JupyterLab with PATH={OFF_PATH}; the cell after "
          f"!torchrun said: {told}")
