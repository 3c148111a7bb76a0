"""The one place that reads torch's private names: each behind a function that returns None where it is missing.

Each function reads one private name (it writes nothing of torch's) and, where this torch lacks it, says so in
one line on stderr (once per process) with what the caller does instead. Torch's public API has no way to read
them; the public ways looked at, and each name, are listed in docs/reference/library.md. Checked on torch 2.13.0.
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
    for device in ("cpu", "cuda"):  # the first device the group has a backend for
        try:
            backend = get_backend(torch.device(device))
        except (RuntimeError, ValueError):  # no backend for that device: try the next
            continue
        timeout = getattr(getattr(backend, "options", None), "_timeout", None)
        if isinstance(timeout, timedelta):
            return timeout
        _missing(f"{type(backend).__name__}.options._timeout", instead)
        return None
    _missing("ProcessGroup._get_backend for cpu or cuda", instead)
    return None


def ddp_buckets(ddp_model, instead: str = "DDP's buckets cannot be named") -> list[tuple[tuple[int, ...], int]] | None:
    """The buckets DDP rebuilt after its first step, (parameter indices, bytes) each, logged from the third step's
    forward (AssertionError before); None where unreadable."""
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
