"""The lab's checks under one name: ``from workshop_lib import check`` in a notebook, then ``check.shards(...)``;
and the command ``python -m workshop_lib.check``, the script checker (:mod:`workshop_lib.checks.script`).

Each check lives in the module of its idea (:data:`CHECKS` says which); this module imports it when a cell first
uses it, so importing the facade costs nothing.
"""

from __future__ import annotations

import importlib

# check name -> (module of workshop_lib.checks, its function)
CHECKS = {
    # every notebook
    "predict_first": ("common", "predict_first"),  # the gate before a run that shows the answer
    "script": ("script", "check"),  # the learner's step script, run on 2 ranks and judged
    # 01
    "all_reduce": ("group", "all_reduce"),
    "collectives_prediction": ("group", "collectives_prediction"),
    "process_group": ("made_up_rank", "process_group"),
    # 02
    "shards": ("sampler", "shards"),
    "spread_prediction": ("sampler", "spread_prediction"),
    # 03
    "speedup_prediction": ("ddp", "speedup_prediction"),
    "token_rates": ("ddp", "token_rates"),
    "terminal_run": ("ddp", "terminal_run"),
    # 04a
    "accumulation": ("patterns", "accumulation"),
    "allreduce_count": ("patterns", "allreduce_count"),
    "autocast": ("patterns", "autocast"),
    "recording_allreduces": ("patterns", "recording_allreduces"),
    "two_node_command": ("nodes", "two_node_command"),
    # 04b
    "by_hand": ("by_hand", "by_hand"),
    # 05
    "run_broken": ("hang_labs", "run_broken"),
    "run_in_terminal": ("hang_labs", "run_in_terminal"),
    "predict_hang": ("hang_labs", "predict"),
    "hang": ("hang_labs", "check"),
    "hang_fix": ("hang_labs", "check_fix"),
    # 06
    "compiled_ddp": ("beyond", "compiled_ddp"),
    "counting_backend": ("beyond", "counting_backend"),
    "share_prediction": ("beyond", "share_prediction"),
    "fsdp": ("beyond", "fsdp"),
    "resume": ("beyond", "resume"),
}

# what a check cell names besides the checks -> (module of workshop_lib.checks, its name)
NAMES = {
    "SAME_GLOBAL": ("ddp", "SAME_GLOBAL"),  # 03's speed-up: the three runs speedup_prediction compares
    "SAME_PER_RANK": ("ddp", "SAME_PER_RANK"),
    "DDP_RUN": ("ddp", "DDP_RUN"),
    "MLP": ("beyond", "MLP"),  # 06: the model that compiles whole and fills four buckets
}


def __getattr__(name: str):
    found = CHECKS.get(name) or NAMES.get(name)
    if found is None:
        raise AttributeError(f"workshop_lib.check has no check {name!r}; the checks are {', '.join(sorted(CHECKS))}")
    module, attribute = found
    return getattr(importlib.import_module(f"workshop_lib.checks.{module}"), attribute)


def __dir__() -> list[str]:
    return sorted([*CHECKS, *NAMES, "CHECKS", "NAMES"])


if __name__ == "__main__":
    from workshop_lib.checks.script import _exit_with_verdict
    from workshop_lib.lab.cli import run_cli

    raise SystemExit(run_cli(_exit_with_verdict))
