"""Mixed precision on CPUs with and without oneDNN's bfloat16 LSTM kernel (notebook 04, section 3)."""

from __future__ import annotations

import platform
import textwrap

import pytest
import torch

from tests.conftest import run_python
from workshop_lib import precision
from workshop_lib.model import SmilesLSTM


def _mixed_precision_step() -> dict:
    """One training step of the workshop's model under CPU autocast, as notebook 04 runs it; the dtypes seen."""
    torch.manual_seed(0)
    model = SmilesLSTM(40, dropout=0.0)
    seen = {}
    model.head.register_forward_hook(lambda module, inputs, output: seen.update(lstm=inputs[0].dtype))
    tokens, lengths = torch.randint(2, 40, (4, 9)), torch.tensor([9, 6, 3, 1])
    with torch.autocast("cpu", dtype=torch.bfloat16), precision.lstm_fallback(torch.device("cpu")):
        logits = model(tokens, lengths)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor([1.0, 0.0, 1.0, 0.0]))
    loss.backward()
    return {**seen, "logits": logits.dtype, "loss": loss.dtype, "grad": model.head[0].weight.grad.dtype}


def test_without_the_kernel_the_lstm_runs_in_float32_and_the_rest_in_bfloat16(monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_lstm", lambda: False)
    with precision.lstm_fallback(torch.device("cpu")):
        assert not torch.backends.mkldnn.enabled  # the fallback's effect: PyTorch's own LSTM kernel, not oneDNN's
    assert _mixed_precision_step() == {"lstm": torch.float32, "logits": torch.bfloat16, "loss": torch.float32,
                                       "grad": torch.float32}
    assert torch.backends.mkldnn.enabled  # switched back on after the block
    assert "no bfloat16 LSTM kernel" in precision.describe()


def test_with_the_kernel_the_fallback_changes_nothing(monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_lstm", lambda: True)
    with precision.lstm_fallback(torch.device("cpu")):
        assert torch.backends.mkldnn.enabled
    with precision.lstm_fallback(torch.device("cuda")):  # GPUs: cuDNN, nothing to do
        assert torch.backends.mkldnn.enabled


AVX2_CHILD = """
import torch
from workshop_lib import precision
from tests.unit.core.test_precision import _mixed_precision_step

lstm = torch.nn.LSTM(4, 4, batch_first=True)
try:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lstm(torch.zeros(1, 2, 4))
    plain = "ran"
except RuntimeError as err:
    plain = str(err).splitlines()[0][:60]
print("probe", precision.cpu_bf16_lstm())
print("plain", plain)
print("step", sorted((k, str(v)) for k, v in _mixed_precision_step().items()))
"""


@pytest.mark.slow
@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="ONEDNN_MAX_CPU_ISA=AVX2 is x86 only")
@pytest.mark.timeout(120)
def test_an_avx2_only_cpu_is_detected_and_the_step_still_runs():
    """oneDNN limited to AVX2 (a typical laptop): the probe says no, and the notebook's step runs all the same."""
    proc = run_python(["-c", textwrap.dedent(AVX2_CHILD)], timeout=100, ONEDNN_MAX_CPU_ISA="AVX2",
                      ATEN_CPU_CAPABILITY="avx2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines["probe"] == "False"
    assert lines["plain"].startswith("could not create a primitive descriptor for the LSTM"), lines["plain"]
    assert lines["step"] == str(sorted({"lstm": "torch.float32", "logits": "torch.bfloat16", "loss": "torch.float32",
                                        "grad": "torch.float32"}.items()))
