"""The one place that reads torch's private names: each behind a function that returns None where it is missing.

Torch's public API gives no way to read these two things; each function below
reads one private name, only reads it (it writes nothing of torch's), and
returns None where this torch lacks it (another release), after one line on
stderr (once per process) that says what could not be read and what the
caller does instead. Checked on torch 2.13.0; 2.15.0 is to be checked.

* ``ProcessGroup._get_backend(device).options._timeout`` (:func:`group_timeout`):
  the timeout a process group was created with, for the hang watch's default
  threshold (a quarter of it). Public ways looked at: ``ProcessGroup.set_timeout``
  sets it and nothing gets it; ``get_backend_config`` names the backends only;
  ``Backend.Options`` holds it only as ``_timeout``; the group store's ``timeout``
  equals it only where ``init_process_group`` made the store itself (env://,
  tcp://), not for a store passed in (the lab's FileStore). Missing: the watch
  takes torch's default, 30 min (``--after`` avoids the read).
* ``DistributedDataParallel._get_ddp_logging_data()`` and its keys
  ``has_rebuilt_buckets``, ``rebuilt_per_bucket_param_indices`` and
  ``rebuilt_bucket_sizes`` (:func:`ddp_buckets`): the buckets DDP rebuilt after
  its first step, for notebook 04b's timeline
  (:func:`workshop_lib.lab.timeline.buckets`). Public ways looked at: only a
  communication hook's ``GradBucket`` (``register_comm_hook``) sees the buckets,
  and a hook changes the step being measured (and is registered once, before
  the first backward). Missing: the timeline says in one line that it cannot
  name DDP's buckets.

One private name is observed elsewhere, not read here:
``torch.distributed._broadcast_coalesced``, wrapped call-through by
:mod:`workshop_lib.debug.collectives` (DDP's constructor and, with buffers,
each forward broadcast through it); where it is missing it is not wrapped.
"""

from __future__ import annotations

import sys
from datetime import timedelta

WARNING = "workshop_lib warning: "  # starts the one line said where a private name is missing

_said: set[str] = set()


def _missing(what: str, instead: str) -> None:
    """One line on stderr, once per ``what``: this torch has no ``what``, and what the caller does instead."""
    if what not in _said:
        _said.add(what)
        import torch

        print(f"{WARNING}torch {torch.__version__} has no {what}; {instead}", file=sys.stderr, flush=True)


def _devices(group) -> list[str]:
    """The device types the group has a backend for ('cpu:gloo,cuda:nccl': cpu, cuda), from its public config."""
    import torch.distributed as dist

    try:
        config = dist.get_backend_config(group)
    except Exception:  # not a group torch knows (a test's stand-in): try both
        return ["cpu", "cuda"]
    found = [part.split(":")[0].strip() for part in config.split(",") if ":" in part]
    return found or ["cpu", "cuda"]


def group_timeout(group=None, instead: str = "torch's default, 30 min, is taken instead") -> timedelta | None:
    """The timeout ``group`` (default: the default group) was created with; None where it cannot be read."""
    import torch
    import torch.distributed as dist

    pg = group if group is not None else dist.group.WORLD
    if pg is None:  # no default group yet: nothing to read
        return None
    get_backend = getattr(pg, "_get_backend", None)
    if get_backend is None:
        _missing("ProcessGroup._get_backend", instead)
        return None
    devices = _devices(group)
    for device in devices:
        try:
            backend = get_backend(torch.device(device))
        except (RuntimeError, ValueError):  # no backend for that device: try the next
            continue
        timeout = getattr(getattr(backend, "options", None), "_timeout", None)
        if isinstance(timeout, timedelta):
            return timeout
        _missing(f"{type(backend).__name__}.options._timeout", instead)
        return None
    _missing(f"ProcessGroup._get_backend for {' or '.join(devices)}", instead)
    return None


def ddp_buckets(ddp_model, instead: str = "DDP's buckets cannot be named") -> list[tuple[tuple[int, ...], int]] | None:
    """The buckets DDP rebuilt after its first step: (its parameters' indices, its bytes) each; None where unreadable.

    DDP rebuilds its buckets in the second step's forward and logs them in the third's (AssertionError before).
    """
    read = getattr(ddp_model, "_get_ddp_logging_data", None)
    if not callable(read):
        _missing("DistributedDataParallel._get_ddp_logging_data", instead)
        return None
    data = read()
    assert data.get("has_rebuilt_buckets"), "DDP logs its rebuilt buckets in the third step's forward: run three first"
    if "rebuilt_per_bucket_param_indices" not in data or "rebuilt_bucket_sizes" not in data:
        _missing("rebuilt_per_bucket_param_indices or rebuilt_bucket_sizes in DDP's logging data", instead)
        return None
    indices = [tuple(int(i) for i in group.split()) for group in str(data["rebuilt_per_bucket_param_indices"]).split(",")]
    sizes = [int(size) for size in str(data["rebuilt_bucket_sizes"]).split(",")]
    return list(zip(indices, sizes, strict=True))
