"""The bidirectional LSTM classifier: tokens -> embedding -> an LSTM each way -> MLP -> logit."""

from __future__ import annotations

import torch
from torch import nn


class SmilesLSTM(nn.Module):
    """Reads a SMILES token sequence in both directions and scores BBB permeability.

    Two ordinary ``nn.LSTM``\\ s read the padded batch (``batch_first``): one left
    to right, one right to left over each molecule reversed in place, so that
    in both the padding comes after the molecule's last real token. A
    molecule's summary is each direction's output at its last real token: what
    ``nn.LSTM(bidirectional=True)`` over a packed sequence gives, since an LSTM's
    output at step t depends only on steps 0..t. Padded, not packed, because on
    CPU a packed LSTM runs a slow per-timestep loop while a padded one runs
    oneDNN's fused kernel, several times faster per training step.

    With ``layers`` > 1 each direction is its own stack of that many layers
    (a bidirectional stack would feed both directions into each next layer).
    With one layer, the default, a seed gives the same initial weights as
    ``nn.LSTM(bidirectional=True)`` would: they are drawn in the same order.
    """

    def __init__(self, vocab_size: int, embed_dim: int = 32, hidden: int = 32,
                 layers: int = 1, dropout: float = 0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        between = dropout if layers > 1 else 0.0  # nn.LSTM's dropout acts between stacked layers only
        self.forward_lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, batch_first=True, dropout=between)
        self.backward_lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, batch_first=True, dropout=between)
        self.head = nn.Sequential(
            nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 1)
        )

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Logits (B,) for ``tokens`` (B, T), padded with 0 after each molecule's ``lengths`` (B,) tokens."""
        lengths = lengths.to(tokens.device)
        pos = torch.arange(tokens.shape[1], device=tokens.device)  # (T,)
        # reverse[b, t]: the position read at step t when molecule b is read backwards; the pads stay put.
        reverse = torch.where(pos < lengths[:, None], lengths[:, None] - 1 - pos, pos)  # (B, T)
        forward_out, _ = self.forward_lstm(self.embed(tokens))  # (B, T, H)
        backward_out, _ = self.backward_lstm(self.embed(tokens.gather(1, reverse)))  # (B, T, H)
        last = (lengths - 1)[:, None, None].expand(-1, 1, forward_out.shape[2])  # (B, 1, H)
        summary = torch.cat([forward_out.gather(1, last), backward_out.gather(1, last)], dim=2)  # (B, 1, 2H)
        return self.head(summary.squeeze(1)).squeeze(1)  # (B,) logits


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
