"""The bidirectional LSTM classifier: tokens -> embedding -> BiLSTM -> MLP -> logit."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence


class SmilesLSTM(nn.Module):
    """Reads a SMILES token sequence in both directions and scores BBB permeability.

    The molecule's summary is the last layer's final hidden state of the
    forward direction (after reading left to right) concatenated with that of
    the backward direction (after reading right to left). Packed sequences
    make both directions stop at each molecule's true end, not at the padding.
    """

    def __init__(self, vocab_size: int, embed_dim: int = 32, hidden: int = 32,
                 layers: int = 1, dropout: float = 0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, bidirectional=True,
                            batch_first=True, dropout=dropout if layers > 1 else 0.0)
        self.head = nn.Sequential(
            nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1)
        )

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # (B, T, E)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, (h_n, _) = self.lstm(packed)  # h_n: (layers * 2, B, H), last layer's forward at -2, backward at -1
        summary = torch.cat([h_n[-2], h_n[-1]], dim=1)  # (B, 2H)
        return self.head(summary).squeeze(1)  # (B,) logits


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
