"""Run a script with the hang watch attached, as `python -m cProfile` runs one with the profiler.

    python -m workshop_lib.watch [--after SECONDS] [--record FILE] SCRIPT [ARGS...]
    torchrun --standalone --nproc_per_node=2 -m workshop_lib.watch solutions/step3_ddp.py --epochs 2

SCRIPT runs as ``__main__`` with ``sys.argv = [SCRIPT, *ARGS]`` and its folder first on ``sys.path``, as
``python SCRIPT ARGS`` runs it, unchanged: it holds no line of the watch. When a collective has waited SECONDS
(default: the environment's WORKSHOP_HANG_AFTER, else a quarter of the process group's timeout, at most a minute),
the rank prints who never arrived and where each rank is, then one line each time the wait doubles
(:mod:`workshop_lib.debug.hangwatch`); ``--record`` (or WORKSHOP_HANG_RECORD) also saves that block as JSON.
Under plain python, a world of one, nothing is watched. A SCRIPT that is missing or does not compile is one line
on stderr and a non-zero exit.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from collections.abc import Sequence

from workshop_lib.debug.scriptfile import refused
from workshop_lib.errors import WorkshopError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workshop_lib.watch", description=__doc__.splitlines()[0],
                                usage="%(prog)s [--after SECONDS] [--record FILE] SCRIPT [ARGS...]")
    p.add_argument("--after", type=float, default=None, metavar="SECONDS",
                   help="seconds a collective may wait before the diagnosis (default: $WORKSHOP_HANG_AFTER, "
                        "else a quarter of the process group's timeout, at most 60)")
    p.add_argument("--record", default=None, metavar="FILE",
                   help="also save the diagnosis to this JSON file (default: $WORKSHOP_HANG_RECORD)")
    p.add_argument("script", help="the Python script to run, as `python SCRIPT ARGS` would")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return p


def _fail(text: str, status: int) -> None:
    """One line on stderr (from one rank a node: each has the same to say), and the exit ``status``."""
    from workshop_lib.debug.launchenv import read_launch_env

    try:
        first = read_launch_env().local_rank == 0
    except WorkshopError:  # an incomplete torchrun environment: the watch's own warning says so, where it runs
        first = True
    if first:
        print(text, file=sys.stderr, flush=True)
    sys.exit(status)


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    opts = parser.parse_args(argv)
    if opts.after is not None and not opts.after > 0:
        parser.error(f"--after {opts.after:g}: give a number of seconds above 0")
    if why := refused(opts.script):  # a script that cannot run is one line, before the watch
        _fail(*why)
    from workshop_lib.debug import hangwatch

    sys.argv = [opts.script, *opts.args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(opts.script)))  # as `python SCRIPT` puts it first
    hangwatch.attach(threshold=opts.after, record=opts.record)
    try:
        runpy.run_path(opts.script, run_name="__main__")
    finally:
        hangwatch.detach()


if __name__ == "__main__":
    main()
