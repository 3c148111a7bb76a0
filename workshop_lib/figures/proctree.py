"""The torchrun process tree as a figure: the agent, its workers, what each worker was told, and the store.

In each worker of the learner's run, ``print(proctree.worker_record())``; then :func:`one_node` reads those lines
from the run's output, prints what they show and draws it. :func:`two_nodes` draws several nodes, computed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from workshop_lib.errors import WorkshopError

MARK = "proctree "  # starts a worker's record in the output
# What torchrun's agent puts in each worker's environment (and what the figure shows, in this order).
SHOWN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
         "TORCHELASTIC_RESTART_COUNT", "OMP_NUM_THREADS")
AGENT, WORKER, STORE = "#dbe9f6", "#fdebd3", "#e3f1dc"  # box colours


def worker_record() -> str:
    """One line for :func:`one_node`: this process, its parent (torchrun's agent) and torchrun's variables, as set."""
    import os

    import psutil

    parent = psutil.Process().parent()
    listening = sorted({c.laddr.port for c in parent.net_connections("tcp") if c.status == psutil.CONN_LISTEN})
    command = " ".join(os.path.basename(part) for part in parent.cmdline()[:3])  # python -m torch.distributed.run
    return MARK + json.dumps({"pid": os.getpid(), "parent": parent.pid, "parent_command": command,
                              "parent_listens": listening, "env": {k: os.environ.get(k) for k in SHOWN}})


def read_records(output: Sequence[str]) -> list[dict]:
    """The workers' records in a run's output lines, in rank order."""
    text, decoder = "\n".join(output), json.JSONDecoder()
    # by occurrence, not by line: two ranks printing at once may share a line of a plain shell's output
    records = [decoder.raw_decode(part)[0] for part in text.split(MARK)[1:]]
    if not records:
        raise WorkshopError(_no_record(output))
    return sorted(records, key=lambda r: int(r["env"]["RANK"]))


def _no_record(output: Sequence[str]) -> str:
    """Why a run's output holds no worker record: torchrun never ran (not on the shell's PATH), or nothing printed one.

    Each shell says "not found" in its own words (sh: "torchrun: not found", bash: "torchrun: command not found",
    zsh: "command not found: torchrun"; ``!`` runs $SHELL), so the line quotes none of them.
    """
    import shlex
    import shutil
    import sys

    if not any(line.strip() for line in output) and shutil.which("torchrun") is None:
        return ("the run printed nothing, and this kernel's shell finds no torchrun on its PATH (the cell above says "
                "torchrun was not found): JupyterLab was started outside the lab's environment; start it from the "
                f"activated environment (. .venv/bin/activate && jupyter lab), or type {shlex.quote(sys.executable)} "
                "-m torch.distributed.run where the cell says torchrun")
    if not any(line.strip() for line in output):
        return "the run printed nothing: run the torchrun cell above first, then this one"
    return "the run printed no worker record; print proctree.worker_record() in each worker"


def _box(ax, x: float, y: float, w: float, h: float, text: str, color: str, size: float = 8) -> None:
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08", fc=color, ec="#555"))
    ax.text(x + 0.1, y + h - 0.1, text, va="top", ha="left", fontsize=size, family="monospace")


def _arrow(ax, start: tuple[float, float], end: tuple[float, float], dashed: bool = False) -> None:
    ax.annotate("", end, start, arrowprops={"arrowstyle": "->", "color": "#555", "ls": "--" if dashed else "-"})


def one_node(output: Sequence[str]):
    """The learner's run: torchrun (the agent) hosting the store, and each worker with the variables it got."""
    from workshop_lib.figures.plots import _new_figure

    workers = read_records(output)
    agents = {w["parent"] for w in workers}
    port = int(workers[0]["env"]["MASTER_PORT"])
    assert len(agents) == 1, f"the workers have several parents {sorted(agents)}: not one torchrun"
    assert all(port in w["parent_listens"] for w in workers), "the workers' parent does not host MASTER_PORT"
    assert any(name in workers[0]["parent_command"] for name in ("torchrun", "torch.distributed.run")), \
        f"the workers' parent is {workers[0]['parent_command']!r}, not torchrun"
    print(f"torchrun is the agent: pid {workers[0]['parent']} started all {len(workers)} workers and hosts the store "
          f"they joined at MASTER_PORT")
    for w in workers:
        print(f"rank {w['env']['RANK']}: " + " ".join(f"{k}={w['env'][k]}" for k in SHOWN[:5]))
    n, w_box = len(workers), 3.9
    width = (w_box + 0.6) * n
    fig, (ax,) = _new_figure(width=width * 0.85, height=4.2)
    ax.set(xlim=(0, width), ylim=(0, 5.0))
    ax.axis("off")
    mid = width / 2
    _box(ax, mid - 3.0, 3.8, 2.8, 1.0, f"torchrun = the agent\npid {workers[0]['parent']}: starts, watches\n"
         "and restarts the workers", AGENT)
    _box(ax, mid + 0.2, 3.8, 2.8, 1.0, f"the store, in the agent\nport {port}: where the\nworkers meet", STORE)
    for i, w in enumerate(workers):
        x = 0.3 + (w_box + 0.6) * i
        env = "\n".join(f"{k}={w['env'][k]}" for k in SHOWN if w["env"][k] is not None)
        _box(ax, x, 0.2, w_box, 2.5, f"worker, pid {w['pid']}\n{env}", WORKER, size=7)
        _arrow(ax, (mid - 1.6, 3.8), (x + 1.2, 2.7))
        _arrow(ax, (x + w_box - 1.0, 2.7), (mid + 1.6, 3.8), dashed=True)
    ax.text(mid - 3.0, 3.1, "starts, with\nthis environment", fontsize=7, ha="right", color="#333")
    ax.text(mid + 3.0, 3.1, "init_process_group:\nmeet at the store", fontsize=7, ha="left", color="#333")
    if n > 1:
        ax.annotate("", (0.3 + w_box + 0.6, 1.2), (0.3 + w_box, 1.2), arrowprops={"arrowstyle": "<->", "color": "#555"})
        ax.text(mid, 0.05, "then direct connections, rank to rank", fontsize=7, ha="center", color="#333")
    ax.set_title(f"torchrun --nproc_per_node={n}: your run", fontsize=10)
    return fig


def two_nodes(nnodes: int = 2, nproc_per_node: int = 2):
    """Several nodes, computed: each a torchrun (an agent) with the same ``--nproc_per_node``, numbered node after node."""
    from matplotlib.patches import Rectangle

    from workshop_lib.figures.plots import _new_figure

    world = nnodes * nproc_per_node
    ranks = [list(range(node * nproc_per_node, (node + 1) * nproc_per_node)) for node in range(nnodes)]  # node by node
    print(f"{nproc_per_node} workers a node, so RANK = GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK: "
          + "; ".join(f"node {node} holds ranks {', '.join(map(str, r))}" for node, r in enumerate(ranks)))
    width = nnodes * (1.9 * nproc_per_node + 0.6)
    fig, (ax,) = _new_figure(width=width, height=3.4)
    ax.set(xlim=(0, width), ylim=(0, 4.2))
    ax.axis("off")
    for node in range(nnodes):
        x0 = node * (1.9 * nproc_per_node + 0.6) + 0.2
        ax.add_patch(Rectangle((x0 - 0.1, 0.1), 1.9 * nproc_per_node + 0.2, 4.0, fc="none", ec="#999", ls=":"))
        ax.text(x0, 3.85, f"node {node} (GROUP_RANK={node})", fontsize=8, weight="bold")
        agent = "torchrun (agent)" + ("\nhosts the workers' store" if node == 0 else "")
        _box(ax, x0 + 0.3, 2.6, 1.9 * nproc_per_node - 0.6, 0.9, agent, AGENT)
        for local in range(nproc_per_node):
            x = x0 + 1.9 * local
            _box(ax, x, 0.6, 1.7, 1.0, f"LOCAL_RANK={local}\nRANK={node}x{nproc_per_node}+{local}"
                 f"={ranks[node][local]}", WORKER, size=7.5)
            _arrow(ax, (x0 + 0.95 * nproc_per_node, 2.6), (x + 0.85, 1.6))
        if node:
            _arrow(ax, (x0 + 0.3, 3.05), (x0 - 0.6, 3.05), dashed=True)
            ax.text(x0 - 0.25, 2.2, "rendezvous:\nthe agents\nnumber\nthe nodes", fontsize=7, ha="center")
    ax.set_title(f"{nnodes} nodes x --nproc_per_node={nproc_per_node}: WORLD_SIZE={world}", fontsize=10)
    return fig
