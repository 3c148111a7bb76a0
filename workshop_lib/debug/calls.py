"""The collective a rank is in, as the hang watch records it: what it is, its tensors, and who called it."""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass

import torch

from workshop_lib.debug import collectives, frames

_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep  # workshop_lib/debug/


@dataclass
class Call:
    """One collective as this rank entered it."""

    op: str  # "all_reduce", "backward" (DDP's C++ all-reduce), "DDP.forward" (its buffer broadcast), ...
    seq: int  # this rank's count of observed collectives, 1-based; 0 for backward
    tensors: str  # "float32[3]", "2 tensors", ...
    since: float  # time.time() when it was entered
    where: str  # "file.py:41 in train()", the caller outside torch
    gpu: bool = False  # on CUDA tensors: Python returns once it is queued; the GPU may still wait
    backwards: int = 0  # the backward() calls this rank had entered by then (a backward's own number)

    def name(self) -> str:
        return "loss.backward()" if self.op == "backward" else f"{self.op} #{self.seq}"


def on_gpu(args: tuple, kwargs: dict) -> bool:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor) or (isinstance(a, list | tuple) and a and isinstance(a[0], torch.Tensor)):
            return (a if isinstance(a, torch.Tensor) else a[0]).is_cuda
    return False


def describe(op: str, args: tuple, kwargs: dict) -> str:
    """The call's tensors ("float32[3]", "2 tensors, first ..."), or what DDP's forward broadcasts."""
    if op == collectives.DDP_FORWARD:
        return collectives.ddp_broadcasts(args[0]) or ""
    found = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor | list | tuple)]
    for a in found:
        if isinstance(a, torch.Tensor):
            return f"{str(a.dtype).removeprefix('torch.')}{list(a.shape)}"
        if a and all(isinstance(t, torch.Tensor) for t in a):
            return f"{len(a)} tensors, first {str(a[0].dtype).removeprefix('torch.')}{list(a[0].shape)}"
    return "no tensor"


def user_frames(frame) -> tuple[list[list], str]:
    """([file, line, function, code] of the learner's frames, outermost first; the innermost library function)."""
    stack = frames.since_fork(traceback.extract_stack(frame))
    while stack and stack[-1].filename.startswith(_HERE):  # the watch itself (a rank explaining from its main thread)
        stack.pop()
    inner = stack[-1].name if stack and frames.is_library(stack[-1].filename) else ""
    return [[frames.short(f.filename), f.lineno, f.name, (f.line or "").strip()] for f in frames.users(stack)], inner


def caller() -> str:
    """'f.py:25 in g()', and where g was called from, for the code that called the collective."""
    mine, _ = user_frames(sys._getframe(2))
    sites = [f"{f}:{n} in {fn}()" for f, n, fn, _ in mine[-2:]]
    return ", from ".join(reversed(sites)) or "?"
