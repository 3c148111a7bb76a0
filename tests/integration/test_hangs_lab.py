"""The hang labs of notebook 05, run for real: the broken lab that 05 does not replay stops where its record says,
the free fix and the costly one pass, a learner's wrong fix is named in one line, the terminal version's watch
explains the hang, and what 05 quotes of torch is what torch 2.13 does.

The labs 05 runs itself (run_broken, and hang3 in the terminal) are not run again here: nbval replays them in this
suite, comparing the watch's lines, each rank's stack and torch's error with the stored output, and 05's check cells
compare each record with the stored reading."""

from __future__ import annotations

import difflib
import re
import textwrap

import nbformat
import pytest

from tools import build
from workshop_lib.checks import hang_labs, hang_runs
from workshop_lib.debug import hangreport
from workshop_lib.engine.common import CheckFailed
from workshop_lib.figures import sequences
from workshop_lib.launching import forklaunch
from workshop_lib.launching.launch import LaunchError, torchrun

# Where each rank of each broken lab stops, {rank: (call, line of train())}: what a learner reads.
HANGS = {
    "hanglab1": {0: ("all_reduce", 24), 1: ("all_gather", 26)},
    "hanglab2": {0: ("backward", 19), 1: ("all_gather", 22)},
    "hanglab3": {0: ("all_reduce", 26), 1: ("all_reduce", 26)},
    "hanglab4": {0: ("forward", 26), 1: ("all_gather", 29)},
}
FROZEN = "    model.embed.requires_grad_(False)  # the embedding stays as it is: fewer weights to train\n"
WRAP = "    model = DDP(model.to(device))\n"
FROZEN_LATE = WRAP + FROZEN.replace("model.embed", "model.module.embed")  # the bug: frozen after the wrap


def notebook_text(cell_id: str) -> str:
    nb = nbformat.read(build.NOTEBOOKS / hang_labs.NOTEBOOK, as_version=4)
    return next(c.source for c in nb.cells if c.get("id") == cell_id)


@pytest.mark.parametrize("name", list(hang_labs.BATCH))
def test_each_labs_exercise_script_is_its_solution_with_the_bug_put_back(name):
    """The learner gets the broken code and no hint (no comment that names it); the solution has the fix in its place."""
    solution = (build.SOLUTIONS / f"{name}.py").read_text().splitlines()[2:]
    exercise = (build.EXERCISES / f"{name}.py").read_text().splitlines()[2:]
    changed = [line for line in difflib.ndiff(solution, exercise) if line[:2] in ("- ", "+ ")]
    added = [line[2:] for line in changed if line.startswith("+ ")]
    assert added and len(changed) <= 12, changed  # the bug, a few lines of one place
    assert not re.search(r"TODO|NotImplementedError|BROKEN", "\n".join(exercise))
    assert not [x for x in added if re.search(r"#.*\b(only rank|rank 0 (logs|prints)|every rank takes part)", x)], added
    compile("\n".join(exercise), f"exercises/{name}.py", "exec")


def replayed_in_05() -> set[str]:
    """The labs 05 runs with ``hang_labs.run_broken``: nbval replays them, comparing the watch's lines with the
    stored ones, and the check cell after each compares the record with the stored reading."""
    nb = nbformat.read(build.NOTEBOOKS / hang_labs.NOTEBOOK, as_version=4)
    return {name for c in nb.cells if c.cell_type == "code" for name in re.findall(r'run_broken\("(\w+)"\)', c.source)}


def test_05_replays_each_broken_lab_or_this_module_runs_it():
    assert set(HANGS) - replayed_in_05() == {"hanglab3"}  # 05 runs lab 3 in the terminal version instead


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(set(HANGS) - replayed_in_05()))
def test_each_broken_lab_stops_where_its_record_says(name, capsys, monkeypatch):
    monkeypatch.setattr(hang_labs, "_predictions", {})
    hang_labs.predict(name, HANGS[name])
    run = hang_labs.run_broken(name)
    out = capsys.readouterr().out
    assert run.record and hang_runs.deadlocked(run.record), out
    assert "never arrived: rank" in out and "where each rank is" in out, out
    # the threshold 05 states (twice or four times it where a first report found a rank only slow to come)
    assert re.search(r"has waited (1|2|4) s in ", out), out
    hang_labs.check(run, HANGS[name])  # raises CheckFailed, naming the rank, if the record says otherwise
    assert sequences.describe(run.record).startswith("the ranks' calls first differ at call ")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_unused_parameter_lab_fails_with_ddps_whole_error(capsys, monkeypatch):
    monkeypatch.setattr(hang_labs, "_predictions", {})
    hang_labs.predict("hanglab5", {0: ("forward", 17), 1: ("forward", 17)})
    run = hang_labs.run_broken("hanglab5")
    out = capsys.readouterr().out
    assert not run.record and set(run.raised) == {0, 1}, out
    assert all(code.startswith("loss = F.binary_cross_entropy") for _, code, _ in run.raised.values()), run.raised
    # whole, not cut to its first line: torch's hint and the parameters' indices are read
    assert "find_unused_parameters=True" in out and "Parameter indices which did not receive grad for rank 0: 0" in out
    assert "Parameters which did not receive grad for rank 0: embed.weight" in out  # under DEBUG=INFO, as 05 says
    assert "names the parameter that got no gradient, `embed.weight`" in _squeeze(notebook_text("nb05-58"))
    assert 'File "torch/nn/parallel/distributed.py", line ' in out  # torch's own traceback, from train() down
    hang_labs.check(run, {0: ("forward", 17), 1: ("forward", 17)})


def swap(*pairs: tuple[str, str]):
    """An edit of the train() cell: each (old, new) replaced once (the old text must be there)."""
    def edit(text: str) -> str:
        for old, new in pairs:
            assert text.count(old) == 1, old
            text = text.replace(old, new)
        return text
    return edit


LOOP = "        for tokens, lengths, labels in loader:\n"


def inside(context: str):
    """An edit of the train() cell: the training loop (the ``for`` over the loader and its body) in ``with context:``."""
    def edit(text: str) -> str:
        before, rest = text.split(LOOP)
        body = rest.splitlines(keepends=True)
        n = next(i for i, line in enumerate(body) if not line.startswith(" " * 12))  # the first line after the loop
        return before + f"        with {context}:\n    " + LOOP + "".join("    " + line for line in body[:n]) + \
            "".join(body[n:])
    return edit


def both(*edits):
    def edit(text: str) -> str:
        for e in edits:
            text = e(text)
        return text
    return edit


WRONG_FIXES = {
    # the error is gone, and so is the averaging: no_sync() skips the reduction that the frozen embedding stalled
    "replicas differ": ("hanglab5", both(swap((FROZEN + WRAP, FROZEN_LATE)), inside("model.no_sync()"))),
    # uneven shares kept, and join() lets the rank that runs out shadow the other's all-reduces: it ends
    "steps differ": ("hanglab2", both(swap(
        ("train_set = splits.train  # to train on",
         "train_set = torch.utils.data.Subset(splits.train, range(rank, len(splits.train), world_size))")),
        inside("model.join()"))),
    # no more hang (no buffer broadcast), but rank 0 still evaluates through the wrapper
    "through the wrapper": ("hanglab4", swap(
        ("model = DDP(model.to(device))", "model = DDP(model.to(device), forward_sync_buffers=False)"),
        ("evaluate(model.module,", "evaluate(model,"))),
    # the bug left in place: the check's run is stopped by the watch
    "still hangs": ("hanglab1", swap(("loss {loss:.4f}", "loss {global_mean(total / steps, device):.4f}"))),
}
SAID = {
    "replicas differ": r"it ends, but the replicas differ by [\d.e-]+ after training: the ranks' gradients were not "
                       r"averaged in every step",
    "steps differ": r"it ends, but the ranks ran different numbers of optimizer steps \(rank 0: 6, rank 1: 5\)",
    "through the wrapper": r"it trains, but evaluate\(\) still gets the DDP wrapper",
    "still hangs": r"it still hangs: rank \d waits in (all_gather|all_reduce) #\d+ \(called at .*train-cell:\d+",
}


def test_the_loop_edit_puts_the_whole_loop_in_the_block():
    text = "    x\n" + LOOP + "            a\n            b\n        after\n"
    assert inside("model.join()")(text) == ("    x\n        with model.join():\n            for tokens, lengths, labels "
                                            "in loader:\n                a\n                b\n        after\n")


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("mistake", list(WRONG_FIXES))
def test_a_wrong_fix_is_named_in_one_line(mistake, monkeypatch):
    name, edit = WRONG_FIXES[mistake]
    if mistake == "still hangs":  # it waits out the threshold of a fixed lab: 8 s for a learner, 3 s here
        monkeypatch.setattr(forklaunch, "HANG_AFTER", 3.0)
    with pytest.raises(CheckFailed) as err:
        hang_labs.check_fix(name, edit=edit)
    said = str(err.value)
    assert "\n" not in said and re.match(SAID[mistake], said), said


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_frozen_late_lab_accepts_find_unused_parameters_and_names_its_cost(capsys):
    """Frozen after the wrap, found unused in every step: it trains, at a cost. A free fix passes without the note:
    05 checks its solution (frozen before the wrap) with check.hang_fix("hanglab5"), and nbval compares that ✓ line
    with the stored one; another free fix (nothing frozen) takes the same path, so it is not run here too."""
    fix = swap((FROZEN + WRAP, FROZEN_LATE.replace("DDP(model.to(device))",
                                                   "DDP(model.to(device), find_unused_parameters=True)")))
    hang_labs.check_fix("hanglab5", edit=fix)
    said = capsys.readouterr().out.strip().splitlines()[-1]
    assert said.startswith("✓ both ranks ran 6 optimizer steps") and "find_unused_parameters=True pays" in said, said


def _all_reduces_a_step(env) -> dict[str, int]:
    """On each rank: the Gloo all-reduces of 3 steps (after 2 that build the buckets), a head frozen or found unused."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workshop_lib.config import TrainConfig
    from workshop_lib.data import collate, load_splits
    from workshop_lib.model import SmilesLSTM

    cfg = TrainConfig(limit=447, batch_size=32)
    splits = load_splits(cfg)
    batches = [collate([splits.train[i] for i in range(j, j + 32)]) for j in range(0, 32 * 5, 32)]
    counted = {}
    for mode in ("frozen", "find_unused"):
        torch.manual_seed(0)
        m = SmilesLSTM(len(splits.tokenizer), cfg.embed_dim, cfg.hidden, cfg.layers, cfg.dropout)
        m.aux = torch.nn.Linear(2 * cfg.hidden, 1).requires_grad_(mode != "frozen")
        model = DDP(m, find_unused_parameters=mode == "find_unused")
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

        def step(tokens, lengths, labels, model=model, opt=opt):
            loss = F.binary_cross_entropy_with_logits(model(tokens, lengths), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()

        for batch in batches[:2]:  # the first steps build the buckets
            step(*batch)
        with torch.profiler.profile() as prof:
            for batch in batches[2:]:
                step(*batch)
        counted[mode] = sum(1 for e in prof.events() if e.name == "gloo:all_reduce")
    return counted


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_find_unused_parameters_adds_an_all_reduce_to_every_step():
    """05's lab 5 says: measured with torch.profiler, 2 Gloo all-reduces a step instead of 1. What DDP and gloo do
    on 2 ranks, whoever started them: forked ranks (notebook_launch), not a torchrun of its own."""
    counted = forklaunch.notebook_launch(_all_reduces_a_step, 2, timeout=150)
    assert counted == [{"frozen": 3, "find_unused": 6}] * 2, counted  # in 3 steps, on each rank
    assert "2 Gloo all-reduces a step instead of 1" in _squeeze(notebook_text("nb05-58"))


def test_05_quotes_gloos_timeout_as_the_terminal_lab_prints_it():
    """05 runs the terminal lab itself (cell nb05 with run_in_terminal("hanglab3")): nbval compares each rank's
    stack and gloo's "Timed out waiting 3000ms ... unbound_buffer.cc" with the stored output. Its prose quotes the
    default timeout's message in the same words."""
    assert 'run_in_terminal("hanglab3")' in "".join(c.source for c in nbformat.read(
        build.NOTEBOOKS / hang_labs.NOTEBOOK, as_version=4).cells)
    assert "Timed out waiting 1800000ms for recv operation to complete" in _squeeze(notebook_text("nb05-02"))


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_terminal_version_of_a_broken_lab_hangs_and_its_watch_explains(monkeypatch, tmp_path, capsys):
    """exercises/hanglab1.py under torchrun with the watch attached, as its docstring says to run it."""
    record = tmp_path / "hang.json"
    monkeypatch.setenv(hangreport.RECORD_VARIABLE, str(record))  # the ranks' watch saves its block there too
    with pytest.raises(LaunchError) as err:  # the group's 8 s timeout ends it, well before the launch's limit
        torchrun(build.EXERCISES / "hanglab1.py", 2, ["--limit", "447", "--epochs", "1", "--timeout", "8",
                                                              "--batch-size", "32", "--no-tensorboard"],
                 out=False, timeout=150, progress=False, show=None)  # -m workshop_lib.watch, as the docstring says
    shown = capsys.readouterr().out
    assert "$ torchrun --standalone --nproc_per_node=2 -m workshop_lib.watch exercises/hanglab1.py " in shown
    typed = "torchrun --standalone --nproc_per_node=2 -m workshop_lib.watch exercises/hanglabN.py"
    assert typed in build.EXERCISES.joinpath("hanglab1.py").read_text()  # what its docstring tells a learner to type
    said = hangreport.block(err.value.output)
    text = "\n".join(said)
    saved = hangreport.load(record)
    assert saved and saved[0]["block"] == said[:len(saved[0]["block"])], (saved, text)
    assert saved[0]["waiting_for"] and "the ranks' collectives first differ" in text, text
    for rank in (0, 1):  # each rank's stack, down to a line of the lab script
        line = next(x for x in said if x.strip().startswith(f"rank {rank}: "))
        assert re.search(r"exercises/hanglab1\.py:\d+ train\(\)", line), text
    assert not re.search(r"workshop_lib/(debug|lab|checks|scaling)/", text), text  # the tools' frames are not shown


MISMATCH = textwrap.dedent("""
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    x = torch.ones(2 if dist.get_rank() == 0 else 1)
    dist.all_reduce(x)
    dist.destroy_process_group()
""")


def _squeeze(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_what_05_quotes_of_torch_distributed_debug_detail_is_what_torch_does(tmp_path):
    """On a bare all_reduce of mismatched shapes DETAIL names both, as 05's note (cell nb05-38) quotes.

    That DDP itself crashes under DETAIL on CPU, as the note says, is test_upstream's reproduction (run on each torch).
    """
    detail = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    script = tmp_path / "mismatch.py"
    script.write_text(MISMATCH)
    with pytest.raises(LaunchError) as err:
        torchrun(script, 2, out=False, watch=False, progress=False, show=None, timeout=150, env=detail)
    said = next(x for x in err.value.output if "[rank0]: RuntimeError: Detected mismatch" in x).split("]: ", 1)[1]
    said = re.sub(r"TensorDeviceTypes=TensorOptions\(.*?memory_format=\(nullopt\)\)", "TensorDeviceTypes=...", said)
    quoted = notebook_text("nb05-38").split("    RuntimeError: Detected mismatch", 1)[1].split("\n\n", 1)[0]
    assert _squeeze("RuntimeError: Detected mismatch" + quoted) == _squeeze(said)
    assert "segmentation fault" in _squeeze(notebook_text("nb05-38"))


# ------------------------------------------------------------------ what a learner sees before a lab's run

# Words that name a lab's bug or how it hangs: none may reach a learner before the run that shows it.
CAUSES = ("rank0", "rank 0 only", "only rank 0", "only on rank 0", "skip", "uneven", "a batch more", "one batch more",
          "more batches", "fewer batches", "shape", "batchnorm", "batch norm", "buffer", "unused", "no gradient",
          "second head", "find_unused", "different collectives", "frozen", "requires_grad", "after the wrap",
          "before the wrap", "one message")


def _named(text: str) -> list[str]:
    return [word for word in CAUSES if re.search(rf"\b{re.escape(word)}", text.lower())]


def _comments(source: str) -> str:
    """What a code cell says in words: its comments (the code itself is the bug to find)."""
    return "\n".join(line.split("#", 1)[1] for line in source.splitlines() if "#" in line)


def test_no_lab_name_or_script_names_its_cause():
    names = list(hang_labs.BATCH) + [p.stem for folder in (build.EXERCISES, build.SOLUTIONS) for p in
                                     folder.glob("hang*.py")]
    assert names and not [n for n in names if _named(n.replace("_", " ")) or _named(n)], names


def test_no_exercise_cell_before_a_labs_run_names_a_cause():
    """In the exercise notebook, everything above each lab's run: markdown, raw cells, the prediction calls, and the
    comments of the code cells (the train() cells hold the bugs; their words must not point at them)."""
    nb = nbformat.read(build.EXERCISES / hang_labs.NOTEBOOK, as_version=4)
    runs = [i for i, c in enumerate(nb.cells) if re.search(r"run_(broken|in_terminal)\(", c.source)]
    assert len(runs) == len(hang_labs.BATCH)
    said = {}
    for i, cell in enumerate(nb.cells[:runs[-1]]):
        text = _comments(cell.source) if cell.cell_type == "code" and "check.predict_hang(" not in cell.source \
            else cell.source
        if _named(text):
            said[cell.get("id", i)] = _named(text)
    assert not said, said
    ids = {c.get("id") for c in nb.cells}
    assert {"nb05-19", "nb05-29", "nb05-38", "nb05-48", "nb05-58", "nb05-80"} <= {
        c.get("id") for c in nbformat.read(build.NOTEBOOKS / hang_labs.NOTEBOOK, as_version=4).cells} - ids  # worked only


def test_each_prediction_of_05_is_a_call_and_an_exact_line():
    """The stored predictions are the record's answers ({rank: (call, line)}); a line one off, or a piece of code,
    is refused: the line check is exact."""
    nb = nbformat.read(build.NOTEBOOKS / hang_labs.NOTEBOOK, as_version=4)
    found = {}
    for cell in nb.cells:
        m = re.search(r'check\.predict_hang\("(\w+)", waits\)', cell.source)
        if m:
            found[m.group(1)] = eval(re.search(r"^waits = (\{.*\})$", cell.source, re.M).group(1))  # the cell's literal
    assert set(found) == set(hang_labs.BATCH)
    assert {name: found[name] for name in HANGS} == HANGS
    frames = {0: (24, "print(...)", "all_reduce"), 1: (26, "x", "all_gather")}
    run = hang_labs.Run("hanglab1", ends=[{"rank": r, "how": "raised", "frames": [["train-cell", line, "train", code],
                                                                                  ["torch/x.py", 1, call, "y"]]}
                                          for r, (line, code, call) in frames.items()])
    assert not any(wrong for wrong, _ in hang_labs._compare(run, found["hanglab1"]))
    off = {0: ("all_reduce", 25), 1: ("all_gather", 26)}
    assert [wrong is None for wrong, _ in hang_labs._compare(run, off)] == [False, True]
    with pytest.raises(CheckFailed, match=r"as \{rank: \(call, line\)\}"):
        hang_labs._valid({0: ("all_reduce", "print("), 1: ("all_gather", 26)})


def _source(where: str, lab: str | None) -> list[str] | None:
    """The lines a stored output quotes from: a lab's train() cell or shared cell (as the exercise gives them), a lab
    script, or a file of the repository; None for torch's own files."""
    from workshop_lib.authoring.spans import exercise_source

    if where in ("train-cell", "shared-cell"):
        nb = nbformat.read(build.NOTEBOOKS / hang_labs.NOTEBOOK, as_version=4)
        cells = [c for c in nb.cells if f"script:{lab}" in c.metadata.get("tags", []) and c.cell_type == "code"]
        cell = next(c for c in cells if ("def train(" in c.source) == (where == "train-cell"))
        return exercise_source(cell.source).splitlines()
    path = build.EXERCISES / where if re.fullmatch(r"hanglab\d\.py", where) else build.ROOT / where
    return path.read_text().splitlines() if path.is_file() and "torch/" not in where else None


QUOTES = [  # a place, and the code an output quotes at it
    re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in \w+\n(?:\[rank\d\]:)?\s+(?P<code>.+)'),
    re.compile(r"(?P<file>train-cell|shared-cell|[\w/]+\.py):(?P<line>\d+): (?P<code>.+)"),
    re.compile(r"line (?P<line>\d+) of train\(\): (?P<code>.+)"),  # the check's words: a line of the train() cell
]
IN_FUNCTION = re.compile(r"(?P<file>hanglab\d\.py):(?P<line>\d+) (?P<fn>\w+)\(\)")


def test_the_line_numbers_quoted_in_05s_stored_outputs_are_the_scripts_and_cells():
    """Every `file:line` or `File "...", line N` of a stored output shows that line's code, and a stack's
    `hanglab3.py:N train()` is a line inside train(): the outputs come from the scripts as they are."""
    nb = nbformat.read(build.NOTEBOOKS / hang_labs.NOTEBOOK, as_version=4)
    lab, checked, wrong = None, 0, []
    for cell in nb.cells:
        lab = next((t[7:] for t in cell.metadata.get("tags", []) if t.startswith("script:hanglab") and
                    "def train(" in cell.source), lab)
        text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        for pattern in QUOTES:
            for m in pattern.finditer(text):
                lines = _source(m.groupdict().get("file") or "train-cell", lab)
                if lines is None:
                    continue
                quoted, n = m.group("code").strip(), int(m.group("line"))
                here = lines[n - 1].strip() if n <= len(lines) else ""
                checked += 1
                if not (here == quoted or here.split("  # ")[0] == quoted.split("  # ")[0]):
                    wrong.append((m.group(0), here))
        for m in IN_FUNCTION.finditer(text):
            lines, n = _source(m.group("file"), lab), int(m.group("line"))
            start = max(i for i, x in enumerate(lines[:n]) if re.match(r"(def \w+|if __name__)", x))
            if m.group("fn") != "<module>" and not lines[start].startswith(f"def {m.group('fn')}("):
                wrong.append((m.group(0), lines[start]))
            checked += 1
    assert checked >= 20 and not wrong, wrong
