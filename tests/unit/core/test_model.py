"""The bidirectional LSTM: shapes, padding, and that both directions learn."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence

from workshop_lib.model import SmilesLSTM


def batch(vocab=20, b=6, t=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, t + 1, (b,), generator=g)
    lengths[0] = t
    tokens = torch.randint(2, vocab, (b, t), generator=g)
    tokens[torch.arange(t)[None, :] >= lengths[:, None]] = 0
    return tokens, lengths


def params_without_grad(model: torch.nn.Module) -> list[str]:
    """Names of parameters that got no gradient signal from one backward pass."""
    torch.manual_seed(0)
    tokens, lengths = batch()
    model.zero_grad()
    F.binary_cross_entropy_with_logits(model(tokens, lengths), torch.ones(len(lengths))).backward()
    return [n for n, p in model.named_parameters()
            if n != "embed.weight" and (p.grad is None or p.grad.abs().max() == 0)]


class BackwardTwice(SmilesLSTM):
    """The original workshop's bug: the backward final state, concatenated with itself."""

    def forward(self, tokens, lengths):
        packed = pack_padded_sequence(self.embed(tokens), lengths, batch_first=True, enforce_sorted=False)
        _, (h_n, _) = self.lstm(packed)
        return self.head(torch.cat([h_n[-1], h_n[-1]], dim=1)).squeeze(1)


@pytest.mark.parametrize("layers", [1, 3])
def test_every_parameter_gets_a_gradient(layers):
    torch.manual_seed(0)
    assert params_without_grad(SmilesLSTM(20, 8, 16, layers, 0.0)) == []


def test_the_check_catches_the_original_workshops_bug():
    torch.manual_seed(0)
    dead = params_without_grad(BackwardTwice(20, 8, 16, 3, 0.0))
    assert "lstm.weight_hh_l2" in dead and "lstm.weight_ih_l2" in dead  # last layer, forward direction
    assert not any(n.endswith("_reverse") for n in dead)


def test_output_shape_and_padding_does_not_change_the_answer():
    torch.manual_seed(0)
    model = SmilesLSTM(20, 8, 16, 2, 0.0).eval()
    tokens, lengths = batch()
    out = model(tokens, lengths)
    assert out.shape == (6,)
    more_padding = torch.cat([tokens, torch.zeros(6, 7, dtype=torch.int64)], dim=1)  # (B, T + 7)
    assert torch.allclose(model(more_padding, lengths), out, atol=1e-6)
    alone = model(tokens[1:2, : lengths[1]], lengths[1:2])
    assert torch.allclose(alone, out[1:2], atol=1e-6)


class PackedReference(SmilesLSTM):
    """The textbook forward pass: nn.LSTM over a PackedSequence (slow on CPU)."""

    def forward(self, tokens, lengths):
        packed = pack_padded_sequence(self.embed(tokens), lengths, batch_first=True, enforce_sorted=False)
        _, (h_n, _) = self.lstm(packed)
        return self.head(torch.cat([h_n[-2], h_n[-1]], dim=1)).squeeze(1)


@pytest.mark.parametrize("layers", [1, 3])
def test_padded_fast_path_equals_packed_lstm(layers):
    torch.manual_seed(0)
    fast = SmilesLSTM(20, 8, 16, layers, 0.0)
    ref = PackedReference(20, 8, 16, layers, 0.0)
    ref.load_state_dict(fast.state_dict())
    tokens, lengths = batch(b=7, t=13, seed=1)
    lengths[-1] = 1  # a one-token molecule: both directions read just it
    tokens[-1, 1:] = 0
    out, expected = fast(tokens, lengths), ref(tokens, lengths)
    assert torch.allclose(out, expected, atol=1e-6)
    assert torch.allclose(fast._forward_packed(tokens, lengths), expected, atol=1e-6)  # the GPU path
    out.sum().backward()
    expected.sum().backward()
    for (name, p), q in zip(fast.named_parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-5), name
