"""Mixed precision on CPU: does this CPU have a bfloat16 LSTM kernel?

Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` an LSTM runs in oneDNN's
bfloat16 kernel. oneDNN has that kernel for CPUs with AVX-512 (and newer), not
for AVX2-only ones (most laptops): there the LSTM's forward fails with
"could not create a primitive descriptor for the LSTM forward propagation
primitive". :func:`cpu_bf16_lstm` finds out with a tiny probe, and
:func:`lstm_fallback` is the way around: with oneDNN switched off, PyTorch's
own LSTM kernel runs, which autocast leaves in float32, while the linear
layers still run in bfloat16.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import torch


@functools.cache
def cpu_bf16_lstm() -> bool:
    """Can an LSTM run in bfloat16 under CPU autocast on this machine? (A 1-step probe, run once.)"""
    lstm = torch.nn.LSTM(4, 4, batch_first=True)
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            lstm(torch.zeros(1, 2, 4))
    except RuntimeError:  # oneDNN found no bfloat16 LSTM kernel for this CPU
        return False
    return True


@contextlib.contextmanager
def lstm_fallback(device: torch.device):
    """Around ``torch.autocast``: on a CPU without the bfloat16 LSTM kernel, run the LSTM in float32.

    It switches oneDNN off inside the block, so the LSTM takes PyTorch's own
    kernel (float32; autocast does not cast it); everything else autocast
    covers still runs in bfloat16. Elsewhere (GPU, or a CPU with the kernel)
    it changes nothing.
    """
    if device.type != "cpu" or cpu_bf16_lstm():
        yield
        return
    with warnings.catch_warnings():  # setting the flags warns about TF32 on Intel GPUs, irrelevant here
        warnings.simplefilter("ignore", UserWarning)
        flags = torch.backends.mkldnn.flags(enabled=False)
        flags.__enter__()
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            flags.__exit__(None, None, None)


def describe() -> str:
    """One line on what autocast does with the LSTM on this CPU."""
    if cpu_bf16_lstm():
        return "this CPU has oneDNN's bfloat16 LSTM kernel: under autocast the LSTM runs in bfloat16"
    return ("oneDNN has no bfloat16 LSTM kernel for this CPU (as on AVX2-only CPUs): under autocast the LSTM runs in "
            "float32 (lstm_fallback switches oneDNN off for it), the linear layers in bfloat16")
