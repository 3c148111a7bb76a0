"""The figures the prose quotes agree with the stored outputs and with benchmarks/results/.

Each claim names a cell (by notebook and cell id) or a page (README.md, docs/...md), a pattern whose
group is the number as the prose writes it, and where the number comes from.
When a benchmark is re-run or a notebook re-executed and a figure moves, the
test names the sentence to update. The stored outputs themselves must hold no
absolute path of the machine they ran on, and no progress bar frozen at 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cache

import nbformat
import pytest

from tests.conftest import REPO

NOTEBOOKS = REPO / "notebooks"
RESULTS = REPO / "benchmarks" / "results"


@cache
def notebook(name: str):
    return nbformat.read(NOTEBOOKS / name, as_version=4)


def cell(name: str, cell_id: str):
    found = [c for c in notebook(name).cells if c.get("id") == cell_id]
    assert found, f"{name} has no cell {cell_id!r}: update the claim in tests/integration/test_content.py"
    return found[0]


def output_text(c) -> str:
    parts = []
    for out in c.get("outputs", []):
        parts.append("".join(out.get("text", "")))
        parts.append("".join(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


@cache
def results() -> dict:
    return json.loads((RESULTS / "results.json").read_text())


def recipe(name: str, dataset: str) -> dict:
    """The summary of one recipe job of the benchmark ("original"/"workshop", "B3DB (shipped)"/"BBBP.csv")."""
    jobs = [j for j in results()["jobs"] if j["group"] == "recipe" and j["name"] == name and j["dataset"] == dataset]
    assert len(jobs) == 1, f"results.json has {len(jobs)} '{name}' recipe jobs on {dataset}"
    return jobs[0]["summary"]


def ratio(start: str) -> float:
    found = [v for k, v in results()["ratios"].items() if k.startswith(start)]
    assert len(found) == 1, f"results.json has {len(found)} ratios starting {start!r}"
    return found[0]


def ddp_2x1_over_1x1(global_batch: int | None = None) -> float:
    suffix = f" at global batch {global_batch}" if global_batch else ""
    keys = [k for k in results()["ratios"]
            if k.startswith("2 procs x 1 thread / 1 proc x 1 thread") and k.split(" (target")[0].endswith(suffix)]
    return results()["ratios"][min(keys, key=len)] if keys else float("nan")


@cache
def lr_runs() -> dict:
    return json.loads((RESULTS / "lr_scaling.json").read_text())


def lr_minutes() -> str:
    """Wall minutes of the distinct runs (rules that give the same lr share a run)."""
    seen = {(r["nprocs"], round(r["lr"], 12)): sum(r["wall_seconds"]) for r in lr_runs()["runs"]}
    return f"{sum(seen.values()) / 60:.0f}"


BENCHMARKS_PAGE = "docs/reference/benchmarks.md"  # the site's page that quotes the benchmark's figures

# (where, pattern with one group: the number as written, the true value formatted as the prose should write it)
Claim = tuple[str, str, Callable[[], str]]
CLAIMS: list[Claim] = [
    ("04b_memory_and_scaling.ipynb#nb04b-ring-md",
     r"(\d\.\d\d)x the throughput of 1 process at the default global batch of 128",
     lambda: f"{ddp_2x1_over_1x1():.2f}"),
    ("04b_memory_and_scaling.ipynb#nb04b-ring-md", r"global batch of 128, (\d\.\d\d)x at 256",
     lambda: f"{ddp_2x1_over_1x1(256):.2f}"),
    ("04b_memory_and_scaling.ipynb#nb04b-ring-md", r"x at 256 and (\d\.\d\d)x at 512",
     lambda: f"{ddp_2x1_over_1x1(512):.2f}"),
    ("04b_memory_and_scaling.ipynb#nb04b-ring-md", r"the benchmark measured 2 processes at (\d\.\d\d)x",
     lambda: f"{ratio('2 procs x 1 thread / 1 proc x 2 threads (target'):.2f}"),
    ("04b_memory_and_scaling.ipynb#nb04b-seconds-md", r"trains on BBBP for about (\d+) minutes",
     lambda: f"{recipe('original', 'BBBP.csv')['wall_seconds'] / 60:.0f}"),
    ("04a_patterns.ipynb#nb04a-lr-runs-md", r"That took about (\d+) minutes of runs", lr_minutes),
    (BENCHMARKS_PAGE, r"with the defaults in ~(\d+) s, heldout ROC AUC",
     lambda: f"{recipe('workshop', 'B3DB (shipped)')['wall_seconds']:.0f}"),
    (BENCHMARKS_PAGE, r"with the defaults in ~\d+ s, heldout ROC AUC (0\.\d+)",
     lambda: f"{recipe('workshop', 'B3DB (shipped)')['heldout_roc_auc']:.3f}"),
    (BENCHMARKS_PAGE, r"reproduced, takes (\d+) s on its own BBBP file",
     lambda: f"{recipe('original', 'BBBP.csv')['wall_seconds']:.0f}"),
    (BENCHMARKS_PAGE, r"on its own BBBP file where step 3 takes (\d+) s",
     lambda: f"{recipe('workshop', 'BBBP.csv')['wall_seconds']:.0f}"),
    (BENCHMARKS_PAGE, r"2 x 1 / 1 x 2 was (\d\.\d\d) \(target above 1\.1\)",
     lambda: f"{ratio('2 procs x 1 thread / 1 proc x 2 threads (target'):.2f}"),
    (BENCHMARKS_PAGE, r"2 x 1 / 1 x 1 was (\d\.\d\d) \(target 1\.8 or more\)", lambda: f"{ddp_2x1_over_1x1():.2f}"),
    (BENCHMARKS_PAGE, r"went from 1\.63 to (\d\.\d\d) at the default", lambda: f"{ddp_2x1_over_1x1():.2f}"),
    (BENCHMARKS_PAGE, r"met at a global batch of 512 \((\d\.\d\d) and", lambda: f"{ddp_2x1_over_1x1(512):.2f}"),
    (BENCHMARKS_PAGE, r"met at a global batch of 512 \(\d\.\d\d and (\d\.\d\d)\)",
     lambda: f"{ratio('2 procs x 1 thread / 1 proc x 2 threads at global batch 512'):.2f}"),
]


def prose(where: str) -> str:
    if where.endswith(".md"):
        return (REPO / where).read_text()
    name, cell_id = where.split("#")
    return cell(name, cell_id).source


@pytest.mark.parametrize(("where", "pattern", "truth"), CLAIMS, ids=[f"{w} {p[:40]}" for w, p, _ in CLAIMS])
def test_prose_figure_matches_its_source(where, pattern, truth):
    found = re.findall(pattern, prose(where))
    assert len(found) == 1, (f"{where}: the sentence /{pattern}/ is gone or repeated; "
                             f"update tests/integration/test_content.py")
    assert found[0] == truth(), (f"{where} says {found[0]} where the source of truth gives {truth()}: "
                                 f"update the sentence /{pattern}/")


def test_claim_patterns_would_catch_a_drift():
    """The check is not vacuous: a sentence with another number fails it."""
    where, pattern, truth = CLAIMS[0]
    drifted = re.sub(pattern, lambda m: m.group(0).replace(m.group(1), "9.99"), prose(where))
    assert re.findall(pattern, drifted) == ["9.99"] != [truth()]


def _stored_outputs():
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb")):
        for c in notebook(path.name).cells:
            if c.cell_type == "code":
                yield path.name, c.get("id"), output_text(c)


ABSOLUTE_PATH = re.compile(r"(?<![\w.~<>])/(?:home|Users|work|root|tmp|private|var/folders|mnt)/[^\s'\"]+")


def test_stored_outputs_hold_no_absolute_paths():
    found = [f"{name} cell {cid}: {m.group(0)}" for name, cid, text in _stored_outputs()
             for m in ABSOLUTE_PATH.finditer(text)]
    assert not found, ("stored outputs show paths of the machine they ran on (print paths relative to the repository, "
                       "then re-execute the notebook):\n" + "\n".join(found[:10]))


def test_stored_progress_bars_show_their_final_state():
    frozen = [f"{name} cell {cid}: {line.strip()}" for name, cid, text in _stored_outputs()
              for line in text.splitlines() if re.search(r"\|\s*0/\d+\s*\[", line)]
    assert not frozen, "progress bars stored before they moved (re-execute these notebooks):\n" + "\n".join(frozen)
