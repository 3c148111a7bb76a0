"""The site's link checker names each broken link, missing anchor, network resource and missing file."""

from __future__ import annotations

from tools import ROOT, sitelinks


def test_broken_links_anchors_and_network_resources_are_named(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "index.html").write_text(
        '<a href="sub/page.html#there">ok</a> <a href="sub/page.html#nowhere">x</a> <a href="gone.html">y</a>'
        '<a href="#top" id="top">z</a> <a href="https://pytorch.org/docs">a link out is fine</a>'
        '<script src="https://cdn.example.org/mathjax.js"></script><img src="sub/fig.png">')
    (tmp_path / "sub" / "page.html").write_text('<h1 id="there">T</h1><a href="../index.html">back</a>')
    (tmp_path / "sub" / "fig.png").write_bytes(b"png")
    assert sitelinks.check_html(tmp_path) == [
        "index.html: sub/page.html#nowhere: no #nowhere on page.html",
        "index.html: gone.html leads nowhere",
        "index.html: <script> loads https://cdn.example.org/mathjax.js from the network (the site must work offline)",
    ]


def test_files_notebooks_and_tests_the_text_names_must_exist():
    page = ROOT / "docs" / "reference" / "faults.md"
    text = ("`solutions/step3_ddp.py`, `solutions/step9_gone.py`, `03_ddp.ipynb` and `04_gone.ipynb`, "
            "`test_faults.py::test_master_port_in_use`, `test_faults.py::test_nothing_like_it`, "
            "[results](../../benchmarks/results/results.md), [old](../../benchmarks/results/old.md)")
    assert sitelinks.references(text, page) == [
        "`solutions/step9_gone.py` is not a file of the repository",
        "`04_gone.ipynb` is not a file of the repository",
        "`test_faults.py::test_nothing_like_it`: test_faults.py has no test test_nothing_like_it",
        "`../../benchmarks/results/old.md` is not a file of the repository",
    ]


def test_what_runs_write_and_placeholders_are_not_the_repositorys():
    text = ("`runs/mine/step2_sampler.py`, `OUT/snapshot.pt`, `script.py`, `BBBP.csv`, `exercises/NN_*.ipynb`, "
            "`stepN_*.py`, `/tmp/notebook-launch-.../all.log`, `python solutions/stepN_*.py`")
    assert sitelinks.references(text, ROOT / "README.md") == []
