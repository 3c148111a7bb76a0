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


# ---- the core path teaches in pictures (issue 41) ------------------------------------------------------------------

CORE_FIGURES = 8  # images stored among 00-03's outputs, at least: the figures cut to fit an old count came back
# The cells that draw the figures cut from 00-02 once: (notebook, the call), each one cell storing its image.
RESTORED = [("00_baseline.ipynb", "plots.length_histogram(lengths)"),
            ("00_baseline.ipynb", 'plots.training_curves(RUNS / "nb00")'),
            ("01_process_group.ipynb", "proctree.two_nodes(nnodes=2, nproc_per_node=2)"),
            ("02_distributed_sampler.ipynb", "plots.shard_picture(frozen, 24")]


def figures(c) -> int:
    """The images a code cell stores, as tools/budget.py counts them (a room spends a minute on each)."""
    from tools import budget

    return budget.cell_count(c).figures if c.cell_type == "code" else 0


def test_the_core_path_holds_its_figures():
    core = sorted(NOTEBOOKS.glob("0[0-3]_*.ipynb"))
    assert [p.name[:3] for p in core] == ["00_", "01_", "02_", "03_"]
    drawn = {p.name: sum(figures(c) for c in notebook(p.name).cells) for p in core}
    assert sum(drawn.values()) >= CORE_FIGURES, (f"00-03 store {sum(drawn.values())} figures ({drawn}), fewer than "
                                                 f"{CORE_FIGURES}: a figure's cell stores no image (re-execute it)")


@pytest.mark.parametrize(("name", "call"), RESTORED, ids=[f"{n[:2]} {c.split('(')[0]}" for n, c in RESTORED])
def test_each_restored_figure_is_drawn_by_its_cell(name, call):
    cells = [c for c in notebook(name).cells if c.cell_type == "code" and call in c.source]
    assert len(cells) == 1, f"{name}: {len(cells)} cells call {call}, not 1"
    assert figures(cells[0]) == 1, f"{name} cell {cells[0].get('id')}: {call} stored no image (re-execute {name})"


# ---- torchrun as it is typed: --standalone on one node ------------------------------------------------------------

# A torchrun command: torchrun, its flags, and what it runs (a script, a module, a placeholder), to the end of the
# code span, the table cell or the line. Several nodes (a rendezvous of their own, or a static one) keep their form.
_TORCHRUN = re.compile(r"\btorchrun\s+(?P<rest>-[^`\n|]*)")
_RUNS_SOMETHING = re.compile(r"--nproc[_-]per[_-]node|(?:^|\s)-m\s|\.py\b|\bPATH\b|\bSCRIPT\b")
_SEVERAL_NODES = re.compile(r"--nnodes|--rdzv|--node[_-]rank|--master[_-]addr")


def single_node_torchruns(text: str) -> list[tuple[int, str]]:
    """(line number, command) of each single-node torchrun command in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for m in _TORCHRUN.finditer(line):
            rest = m.group("rest")
            if _RUNS_SOMETHING.search(rest) and not _SEVERAL_NODES.search(rest):
                found.append((number, "torchrun " + rest.strip()))
    return found


def _docstrings(path) -> str:
    """The docstrings of a Python file (module, classes, functions), each at its own line numbers; blank elsewhere."""
    import ast

    source = path.read_text()
    lines = [""] * len(source.splitlines())
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                for i in range(first.lineno - 1, first.end_lineno):
                    lines[i] = source.splitlines()[i]
    return "\n".join(lines)


def _texts(area: str):
    """(where, text) of each file of an area: "pages" (README.md, docs/**/*.md), "notebooks" (every cell's source),
    "docstrings" (solutions/*.py and workshop_lib/**/*.py)."""
    if area == "pages":
        for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
            if "_build" not in path.parts and "episodes" not in path.parts:
                yield str(path.relative_to(REPO)), path.read_text()
    elif area == "notebooks":
        for path in sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb")):
            for c in notebook(path.name).cells:
                yield f"notebooks/{path.name} cell {c.get('id')}", c.source
    else:
        for path in [*sorted((REPO / "solutions").glob("*.py")), *sorted((REPO / "workshop_lib").rglob("*.py"))]:
            yield str(path.relative_to(REPO)), _docstrings(path)


@pytest.mark.parametrize("area", ["pages", "notebooks", "docstrings"])
def test_every_single_node_torchrun_typed_says_standalone(area):
    """--standalone: one node's rendezvous on a free port, whatever port is named, on every torch release."""
    lacking = [f"{where}:{number}: {command}" for where, text in _texts(area)
               for number, command in single_node_torchruns(text) if "--standalone" not in command]
    assert not lacking, (f"{len(lacking)} single-node torchrun line(s) of the {area} lack --standalone:\n"
                         + "\n".join(lacking))


def test_the_torchrun_finder_tells_one_node_from_several():
    text = ("`torchrun --nproc_per_node=2 solutions/step3_ddp.py`\n"
            "| `torchrun --standalone --nproc_per_node=2 -m workshop_lib.watch SCRIPT` | the watch |\n"
            "torchrun --nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=HOST:29400 x.py\n"
            "torchrun's flags; `torchrun --max-restarts=K` restarts every rank\n"
            "!cd {root} && torchrun --nproc-per-node=gpu -m workshop_lib.watch a.py --limit 1000")
    assert single_node_torchruns(text) == [
        (1, "torchrun --nproc_per_node=2 solutions/step3_ddp.py"),
        (2, "torchrun --standalone --nproc_per_node=2 -m workshop_lib.watch SCRIPT"),
        (5, "torchrun --nproc-per-node=gpu -m workshop_lib.watch a.py --limit 1000")]


# ---- the checker's verdicts the pages quote -----------------------------------------------------------------------

# A page quotes a line the checker (or any part of workshop_lib) prints as {verdict}`...` (docs/_ext/lab_site.py
# renders it as code). "..." stands where the line holds a name, a value or a clause that varies.
_VERDICT = re.compile(r"\{verdict\}`([^`]+)`")
_ELLIPSIS = re.compile(r"\.\.\.|…")
_VALUE = re.compile(r"\S*\d\S*")  # a word with a digit: a value the checker fills in
DISTINCTIVE = 15  # characters: a fragment of a quote at least this long must be printed as written


@cache
def printable() -> tuple[str, ...]:
    """The literal text of every string workshop_lib's code holds (an f-string's constant parts, each on its own),
    docstrings left out: what it can print, where the placeholders' values fall between the parts."""
    import ast

    parts = []
    for path in sorted((REPO / "workshop_lib").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and n.body and isinstance(n.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                parts.append(node.value)
    return tuple(parts)


def fragments(quote: str) -> list[str]:
    """The runs of a quote that hold no value: split at "..." and at every word with a digit (rank 2, line 57)."""
    runs = [run.strip() for piece in _ELLIPSIS.split(" ".join(quote.split())) for run in _VALUE.split(piece)]
    return [r for r in runs if len(r) >= DISTINCTIVE]


def unprintable(quote: str) -> list[str]:
    """The fragments of ``quote`` that no string of workshop_lib holds as written."""
    return [f for f in fragments(quote) if not any(f in part for part in printable())]


def quoted_verdicts() -> list[tuple[str, str]]:
    return [(f"{where}:{text[:m.start()].count(chr(10)) + 1}", m.group(1)) for where, text in _texts("pages")
            for m in _VERDICT.finditer(text)]


@pytest.mark.parametrize(("where", "quote"), quoted_verdicts(), ids=[w for w, _ in quoted_verdicts()])
def test_every_verdict_a_page_quotes_is_one_the_checker_can_print(where, quote):
    assert fragments(quote), f"{where}: the quote {quote!r} has no fragment of {DISTINCTIVE}+ characters to look for"
    missing = unprintable(quote)
    assert not missing, (f"{where} quotes {{verdict}}`{quote}`, but workshop_lib prints none of {missing}: the "
                         "checker's line changed; quote it as it is now (or \"...\" where it varies), or restore it")


KIT_NOTES = "docs/kit/episodes.md"  # the instructor's kit: each episode's mistakes and the check's verdict for each


def test_the_kit_quotes_the_checks_of_every_episode_with_exercises():
    """The kit's episode notes quote real verdicts (each held by the test above), several for each core episode."""
    quoted = [where for where, _ in quoted_verdicts() if where.startswith(KIT_NOTES + ":")]
    assert len(quoted) >= 30, f"{KIT_NOTES} quotes {len(quoted)} verdicts, fewer than 30"
    text = (REPO / KIT_NOTES).read_text()
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        name = part.split()[0]
        if name in ("01", "02", "03"):
            assert len(_VERDICT.findall(part)) >= 5, f"{KIT_NOTES}: episode {name} quotes fewer than 5 verdicts"


def test_the_verdict_finder_finds_the_quotes_and_a_stale_one_fails():
    assert len(quoted_verdicts()) >= 8
    assert fragments("rank 2 (local rank 0) got the same indices as rank 0: pass the global rank, rank=env.rank") \
        == ["got the same indices as rank", "pass the global rank, rank=env.rank"]
    assert unprintable("rank 2 (local rank 0) got the same indices as rank 0: pass the global rank, rank=env.rank")
    assert not unprintable("rank 1 evaluated too ...: every rank scored the same model on the dev set, N times the "
                           "work; evaluate on global rank 0 only (dist.get_rank() == 0)")


# ---- statements about torch, kept true (issue 48): each rule fails on the sentence it replaced -----------------------
# torch's behaviour itself is reproduced in tests/integration/test_upstream.py; these keep the old sentences out.


def _clauses(text: str) -> list[str]:
    """Sentences, table cells and clauses after a semicolon, each on one line."""
    return [" ".join(c.split()) for c in re.split(r"(?<=[.;|])\s+|\n\s*\n", text) if c.strip()]


# (what the sentence must not say, the rule): a clause matching all of ``needs`` and none of ``unless`` is wrong.
STATEMENT_RULES = {
    "port": ("without --standalone, one node's torchrun meets on port 29500 / the static rendezvous: on torch 2.13 it "
             "picks a free port (c10d on localhost:0) unless a port is named (test_upstream.py)",
             [r"\b(?:without|no) (?:it\b|`--standalone`)", r"29500|static"],
             r"older|port is named|names its port|`--master-port` named"),
    "root": ("FSDP frees the gathered weights after forward: every unit but the root does (reshard_after_forward=None "
             "means False for the root; test_upstream.py)",
             [r"\bfree[sd]?\b", r"forward|gathered"], r"\broot\b"),
    "traffic": ("FSDP sends about 1.5 times DDP's bytes: only with units per block; the root alone sends DDP's",
                [r"1\.5 times DDP"], r"block"),
    "optimizer": ("the optimizer is built after fully_shard (for its sharded state): the reason is that fully_shard "
                  "replaces the parameters, and an optimizer built before trains nothing (test_upstream.py)",
                  [r"optimizer", r"after `?fully_shard"], r"replac|new `?nn\.Parameter"),
}
OLD_SENTENCES = {  # the sentences the rules replaced, as they were
    "port": ["`--standalone` runs the rendezvous on a free port of this machine: without it torchrun uses port 29500, "
             "and two\njobs on one shared node collide.",
             "| the static rendezvous instead (torchrun's default without `--standalone`): each node says its own rank |",
             "torchrun's\ndefault rendezvous without `--standalone` is the static one (`--master-addr`/`--master-port`, "
             "29500 by default),\nand it keeps one store for the whole job",
             "| `--max-restarts` without `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`, or with the static rendezvous (no "
             "`--standalone`) |"],
    "root": ["logits = model(b.tokens, b.lengths)  # all-gathers the parameters, computes, frees the gathered copy",
             "Before a unit computes, FSDP all-gathers its weights, and by default frees them again after its forward; "
             "in backward it reduce-scatters its gradients."],
    "traffic": ["in backward it *reduce-scatters* the unit's gradients (sums them over the ranks and leaves each rank "
                "its 1/N of the sum): about 1.5 times DDP's traffic."],
    "optimizer": ["3. The optimizer is built after `fully_shard`, on the sharded parameters, so that its state is "
                  "sharded too."],
}


def breaking(rule: str, text: str) -> list[str]:
    _, needs, unless = STATEMENT_RULES[rule]
    units = text.splitlines() if rule == "optimizer" else _clauses(text)  # the reason may follow in the next sentence
    return [u for u in units if all(re.search(n, u) for n in needs) and not re.search(unless, u)]


@pytest.mark.parametrize("rule", sorted(STATEMENT_RULES))
def test_no_page_or_notebook_repeats_a_corrected_statement(rule):
    found = [f"{where}: {u[:160]}" for area in ("pages", "notebooks", "docstrings") for where, text in _texts(area)
             for u in breaking(rule, text)]
    assert not found, f"{STATEMENT_RULES[rule][0]}; said again:\n" + "\n".join(found)


@pytest.mark.parametrize("rule", sorted(STATEMENT_RULES))
def test_the_statement_rules_catch_the_sentences_they_replaced(rule):
    for old in OLD_SENTENCES[rule]:
        assert breaking(rule, old), f"rule {rule!r} lets through: {old}"


def test_the_small_bucket_cap_sentence_counts_the_parameters_it_exceeds():
    """04b §4: bucket_cap_mb=0.005 is less than some of the model's parameters and more than the others."""
    from workshop_lib.config import TrainConfig
    from workshop_lib.data import load_splits
    from workshop_lib.figures.timeline import SMALL_CAP_MB
    from workshop_lib.model import SmilesLSTM

    cap = int(SMALL_CAP_MB * 2**20)
    model = SmilesLSTM(len(load_splits(TrainConfig(limit=200)).tokenizer))  # the vocabulary: the whole table's
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    said = re.findall(r"\(([\d,]+) bytes: less than (\d+) of our (\d+) parameters[^)]*more than the (\d+) others",
                      cell("04b_memory_and_scaling.ipynb", "nb04b-timeline-md").source)
    assert said == [(f"{cap:,}", str(sum(s > cap for s in sizes)), str(len(sizes)), str(sum(s <= cap for s in sizes)))]


def test_the_quick_reference_quotes_the_model_line_as_the_reporter_prints_it(tmp_path, capsys):
    """docs/quickref.md's sample of step 3's output: its header line is the Reporter's, for 2 processes."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workshop_lib.config import TrainConfig
    from workshop_lib.data import load_splits
    from workshop_lib.model import SmilesLSTM
    from workshop_lib.report import Reporter

    cfg = TrainConfig(limit=200, out=tmp_path, tensorboard=False)
    splits = load_splits(cfg)
    model = SmilesLSTM(len(splits.tokenizer), cfg.embed_dim, cfg.hidden, cfg.layers, cfg.dropout)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=10))
    try:
        Reporter(cfg, "step3_ddp", splits, DDP(model), 2)  # step 3's Reporter takes the wrapper
    finally:
        dist.destroy_process_group()
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("model: ")]
    sample = [line for line in (REPO / "docs" / "quickref.md").read_text().splitlines() if line.startswith("model: ")]
    assert len(printed) == 1 and sample == printed, f"docs/quickref.md shows {sample}; step 3 prints {printed}"


def test_the_quick_reference_quotes_the_step_scripts_own_guard():
    """Plain python: the step script's guard answers before torch's env:// could ('RANK expected, but not set')."""
    from tests.conftest import run_python

    page = (REPO / "docs" / "quickref.md").read_text()
    proc = run_python([REPO / "solutions" / "step1_process_group.py"], timeout=60)
    assert proc.returncode == 1 and proc.stderr.strip() in page and "RANK expected" not in page, proc.stderr[-500:]
