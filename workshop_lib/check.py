"""The lab's checks under one name: ``from workshop_lib import check`` in a notebook, then ``check.shards(...)``;
and the command ``python -m workshop_lib.check``, the script checker (:mod:`workshop_lib.engine.script`).

Each check lives in the module of its idea (:data:`CHECKS` says which); this module imports it when a cell first
uses it, so importing the facade costs nothing.
"""

from __future__ import annotations

import importlib

# check name -> (its module, under workshop_lib, and its function)
CHECKS = {
    # every notebook
    "predict_first": ("engine.common", "predict_first"),  # the gate before a run that shows the answer
    "script": ("engine.script", "check"),  # the learner's step script, run on 2 ranks and judged
    # 01
    "all_reduce": ("checks.group", "all_reduce"),
    "collectives_prediction": ("checks.group", "collectives_prediction"),
    "process_group": ("engine.made_up_rank", "process_group"),
    # 02
    "shards": ("checks.sampler", "shards"),
    "spread_prediction": ("checks.sampler", "spread_prediction"),
    # 03
    "speedup_prediction": ("checks.ddp", "speedup_prediction"),
    "token_rates": ("checks.ddp", "token_rates"),
    "terminal_run": ("checks.ddp", "terminal_run"),
    # 04a
    "accumulation": ("checks.patterns", "accumulation"),
    "allreduce_count": ("checks.patterns", "allreduce_count"),
    "autocast": ("checks.patterns", "autocast"),
    "recording_allreduces": ("checks.patterns", "recording_allreduces"),
    "two_node_command": ("checks.nodes", "two_node_command"),
    # 04b
    "by_hand": ("checks.by_hand", "by_hand"),
    # 05
    "run_broken": ("checks.hang_labs", "run_broken"),
    "run_in_terminal": ("checks.hang_labs", "run_in_terminal"),
    "predict_hang": ("checks.hang_labs", "predict"),
    "hang": ("checks.hang_labs", "check"),
    "hang_fix": ("checks.hang_labs", "check_fix"),
    # 06
    "compiled_ddp": ("checks.beyond", "compiled_ddp"),
    "counting_backend": ("checks.beyond", "counting_backend"),
    "share_prediction": ("checks.beyond", "share_prediction"),
    "fsdp": ("checks.beyond", "fsdp"),
    "resume": ("checks.beyond", "resume"),
}

# what a check cell names besides the checks -> (its module, under workshop_lib, and its name)
NAMES = {
    "SAME_GLOBAL": ("checks.ddp", "SAME_GLOBAL"),  # 03's speed-up: the three runs speedup_prediction compares
    "SAME_PER_RANK": ("checks.ddp", "SAME_PER_RANK"),
    "DDP_RUN": ("checks.ddp", "DDP_RUN"),
    "MLP": ("checks.beyond", "MLP"),  # 06: the model that compiles whole and fills four buckets
}


def __getattr__(name: str):
    found = CHECKS.get(name) or NAMES.get(name)
    if found is None:
        raise AttributeError(f"workshop_lib.check has no check {name!r}; the checks are {', '.join(sorted(CHECKS))}")
    module, attribute = found
    return getattr(importlib.import_module(f"workshop_lib.{module}"), attribute)


def __dir__() -> list[str]:
    return sorted([*CHECKS, *NAMES, "CHECKS", "NAMES"])


if __name__ == "__main__":
    from workshop_lib.cli import run_cli
    from workshop_lib.engine.script import _exit_with_verdict

    raise SystemExit(run_cli(_exit_with_verdict))
