"""Every link of the lesson site, and every file of the repository its sources name, resolves.

Two checks, each returning one line per problem (none: all is well):

* :func:`check_html` reads the built pages: every relative ``href`` and ``src`` names a file that is there,
  and a ``#fragment`` an id on that page; nothing is loaded from the network (the site works offline).
* :func:`check_sources` reads what the pages are written from (``docs/*.md``, ``README.md``, the
  notebooks' markdown): a path of the repository (``solutions/step3_ddp.py``, ``../../benchmarks/...``), a
  notebook (``03_ddp.ipynb``) or a test (``test_faults.py::test_master_port_in_use``) must exist.

``python -m tools.site --check`` runs both after building.

Sphinx's own checks come first: the build is nitpicky with warnings as errors, so a ``{doc}``, ``{ref}`` or
``{download}`` target or an image that is missing fails it. Sphinx's ``linkcheck`` builder adds nothing here
(tried on Sphinx 8.2 with http(s) ignored: it collected no link at all). It takes only reference nodes with a
URL, checks a local one as a file path beside its source (never an anchor), and never reads the built pages, the ``<script>``
and ``<img>`` sources, or the paths and test names that the prose writes in code.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tools import ROOT

EXTENSIONS = "py|ipynb|md|sh|sbatch|json|csv|png|toml|yml|yaml|cfg|txt"
_PATH = re.compile(rf"(?<![\w/.$-])((?:\.\.?/)*(?:[\w.-]+/)*[\w-][\w.-]*\.(?:{EXTENSIONS}))(?:::(\w+))?(?![\w/])")
_NOTEBOOK = re.compile(r"^\d\d\w?_\w+\.ipynb$")
NOT_IN_THE_REPOSITORY = ("runs", "build", ".venv")  # what runs and builds write: named, never shipped


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[tuple[str, str]] = []  # (tag, url)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key) and (key == "id" or tag == "a"):
                self.ids.add(attrs[key])
        for key in ("href", "src"):
            if attrs.get(key):
                self.links.append((tag, attrs[key]))


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(errors="replace"))
    return page


def check_html(root: Path) -> list[str]:
    """Problems of the built site in ``root``: broken relative links and anchors, resources from the network."""
    root = root.resolve()
    pages = {p: _parse(p) for p in sorted(root.rglob("*.html")) if "_static" not in p.relative_to(root).parts}
    problems = []
    for path, page in pages.items():
        where = path.relative_to(root).as_posix()
        for tag, url in page.links:
            parts = urlsplit(url)
            if parts.scheme in ("http", "https") or url.startswith("//"):
                if tag in ("script", "img", "link", "iframe"):
                    problems.append(f"{where}: <{tag}> loads {url} from the network (the site must work offline)")
                continue
            if parts.scheme in ("mailto", "data", "javascript") or parts.scheme:
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path.resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                problems.append(f"{where}: {url} leads nowhere")
                continue
            if parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    problems.append(f"{where}: {url}: no #{parts.fragment} on {target.name}")
    return problems


def _tests() -> dict[str, Path]:
    return {p.name: p for p in (ROOT / "tests").rglob("test_*.py")}


def references(text: str, source: Path) -> list[str]:
    """The repository files ``text`` (from ``source``) names that are not there, one line each."""
    top = {p.name for p in ROOT.iterdir()} - set(NOT_IN_THE_REPOSITORY)
    problems = []
    for match in _PATH.finditer(text):
        token, test = match.group(1), match.group(2)
        first = token.split("/", 1)[0]
        if first in (".", ".."):
            path = (source.parent / token).resolve()
        elif "/" in token and first in top:
            path = ROOT / token
        elif "/" not in token and token.startswith("test_") and token.endswith(".py"):
            path = _tests().get(token, ROOT / "tests" / token)
        elif "/" not in token and _NOTEBOOK.match(token):
            path = ROOT / "notebooks" / token
        else:
            continue  # a file of the learner's (runs/...), a placeholder, a file outside the repository
        if not path.is_file():
            problems.append(f"`{token}` is not a file of the repository")
        elif test and not re.search(rf"^(?:async )?def {test}\(", path.read_text(), re.M):
            problems.append(f"`{token}::{test}`: {token} has no test {test}")
    return problems


def check_sources(docs: Path | None = None) -> list[str]:
    """Problems of the site's sources: the pages, the README and the notebooks' markdown."""
    import nbformat

    docs = docs or ROOT / "docs"
    sources = [p for p in sorted(docs.rglob("*.md")) if not {"_build", "episodes"} & set(p.relative_to(docs).parts)]
    problems = []
    for path in [*sources, ROOT / "README.md"]:
        name = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text().splitlines(), 1):
            problems += [f"{name}:{n}: {p}" for p in references(line, path)]
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                problems += [f"notebooks/{path.name} cell {cell.get('id')}: {p}" for p in references(cell.source, path)]
    return problems


def check(html_root: Path) -> list[str]:
    return check_html(html_root) + check_sources()
