"""The bidirectional LSTM: shapes, padding, the textbook packed LSTM it equals, and that both directions learn."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

from workshop_lib.model import SmilesLSTM


def batch(vocab=20, b=6, t=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, t + 1, (b,), generator=g)
    lengths[0] = t
    tokens = torch.randint(2, vocab, (b, t), generator=g)
    tokens[torch.arange(t)[None, :] >= lengths[:, None]] = 0
    return tokens, lengths


def params_without_grad(model: nn.Module) -> list[str]:
    """Names of parameters that got no gradient signal from one backward pass."""
    torch.manual_seed(0)
    tokens, lengths = batch()
    model.zero_grad()
    F.binary_cross_entropy_with_logits(model(tokens, lengths), torch.ones(len(lengths))).backward()
    return [n for n, p in model.named_parameters()
            if n != "embed.weight" and (p.grad is None or p.grad.abs().max() == 0)]


class PackedBidirectional(nn.Module):
    """The textbook model: one ``nn.LSTM(bidirectional=True)`` over a PackedSequence, the final states summed up.

    ``twice=True`` is the original workshop's bug: the backward final state concatenated with itself.
    """

    def __init__(self, vocab_size, embed_dim, hidden, layers, twice=False):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, batch_first=True, bidirectional=True)
        self.head = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Dropout(0.0), nn.Linear(hidden, 1))
        self.twice = twice

    def forward(self, tokens, lengths):
        packed = pack_padded_sequence(self.embed(tokens), lengths, batch_first=True, enforce_sorted=False)
        _, (h_n, _) = self.lstm(packed)  # h_n: (layers * 2, B, H), the last layer's forward then backward
        summary = torch.cat([h_n[-1], h_n[-1]] if self.twice else [h_n[-2], h_n[-1]], dim=1)  # (B, 2H)
        return self.head(summary).squeeze(1)


def packed_twin(model: SmilesLSTM) -> PackedBidirectional:
    """A PackedBidirectional with ``model``'s weights: each direction's LSTM is one half of the bidirectional one."""
    lstm = model.forward_lstm
    twin = PackedBidirectional(model.embed.num_embeddings, lstm.input_size, lstm.hidden_size, 1)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(("forward_lstm.", "backward_lstm."))}
    for name, value in model.forward_lstm.state_dict().items():
        state[f"lstm.{name}"] = value
    for name, value in model.backward_lstm.state_dict().items():
        state[f"lstm.{name}_reverse"] = value
    twin.load_state_dict(state)
    return twin


@pytest.mark.parametrize("layers", [1, 3])
def test_every_parameter_gets_a_gradient(layers):
    torch.manual_seed(0)
    assert params_without_grad(SmilesLSTM(20, 8, 16, layers, 0.0)) == []


def test_the_check_catches_the_original_workshops_bug():
    torch.manual_seed(0)
    dead = params_without_grad(PackedBidirectional(20, 8, 16, 3, twice=True))
    assert "lstm.weight_hh_l2" in dead and "lstm.weight_ih_l2" in dead  # last layer, forward direction
    assert not any(n.endswith("_reverse") for n in dead)


def test_two_plain_lstms_hold_the_weights():
    model = SmilesLSTM(20, 8, 16, 1, 0.0)
    assert {type(m) for m in (model.forward_lstm, model.backward_lstm)} == {nn.LSTM}
    assert not model.forward_lstm.bidirectional and model.forward_lstm.batch_first
    assert {"embed.weight", "forward_lstm.weight_ih_l0", "backward_lstm.weight_hh_l0"} <= model.state_dict().keys()


def test_output_shape_and_padding_never_changes_a_molecules_logit():
    torch.manual_seed(0)
    model = SmilesLSTM(20, 8, 16, 2, 0.0).eval()
    tokens, lengths = batch()
    out = model(tokens, lengths)
    assert out.shape == (6,)
    more_padding = torch.cat([tokens, torch.zeros(6, 7, dtype=torch.int64)], dim=1)  # (B, T + 7)
    assert torch.allclose(model(more_padding, lengths), out, atol=1e-6)
    for i in range(len(lengths)):  # each molecule alone, without any padding
        alone = model(tokens[i : i + 1, : lengths[i]], lengths[i : i + 1])
        assert torch.allclose(alone, out[i : i + 1], atol=1e-6), i


def test_it_equals_a_bidirectional_lstm_over_a_packed_sequence_with_the_same_weights():
    """With one layer: outputs and gradients, a one-token molecule included."""
    torch.manual_seed(0)
    ours = SmilesLSTM(20, 8, 16, 1, 0.0)
    ref = packed_twin(ours)
    tokens, lengths = batch(b=7, t=13, seed=1)
    lengths[-1] = 1  # a one-token molecule: both directions read just it
    tokens[-1, 1:] = 0
    out, expected = ours(tokens, lengths), ref(tokens, lengths)
    assert torch.allclose(out, expected, atol=1e-6)
    out.sum().backward()
    expected.sum().backward()
    assert torch.allclose(ours.embed.weight.grad, ref.embed.weight.grad, atol=1e-5)
    for name, p in ours.forward_lstm.named_parameters():
        assert torch.allclose(p.grad, dict(ref.lstm.named_parameters())[name].grad, atol=1e-5), name
    for name, p in ours.backward_lstm.named_parameters():
        assert torch.allclose(p.grad, dict(ref.lstm.named_parameters())[f"{name}_reverse"].grad, atol=1e-5), name


def test_a_seed_gives_the_bidirectional_lstms_initial_weights():
    """One layer: the weights are drawn in nn.LSTM(bidirectional=True)'s order, so a seed gives the same start."""
    torch.manual_seed(3)
    ours = SmilesLSTM(20, 8, 16, 1, 0.0)
    torch.manual_seed(3)
    ref = PackedBidirectional(20, 8, 16, 1)
    assert torch.equal(ours.embed.weight, ref.embed.weight)
    for name, p in ours.forward_lstm.named_parameters():
        assert torch.equal(p, dict(ref.lstm.named_parameters())[name]), name
    for name, p in ours.backward_lstm.named_parameters():
        assert torch.equal(p, dict(ref.lstm.named_parameters())[f"{name}_reverse"]), name
