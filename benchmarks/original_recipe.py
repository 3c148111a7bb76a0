"""The original workshop's recipe, reproduced as the benchmark's baseline.

What it keeps from the original: one process with torch's default threads;
one token per SMILES *character*, looked up in ``__getitem__`` on every access;
``DataLoader(shuffle=True, batch_size=256)`` padding each random batch to its
longest molecule; a 3-layer bidirectional LSTM (embedding 128, hidden 128,
dropout 0.2) over packed sequences; AdamW lr 1e-3, weight decay 1e-4; 5
epochs with a dev evaluation after each; the heldout ROC AUC of the final
model. The split is the workshop's (heldout 10%, dev 20% of the rest, seed
1729), which is the original's.

The original's summary concatenated the backward final state with itself, so
the last layer's forward direction never received a gradient. That bug is
reproduced by default (the baseline's accuracy figure came from that code);
``--fixed-summary`` uses forward + backward instead. It costs the same time.

    python benchmarks/original_recipe.py --data BBBP.csv --out runs/original
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset

from workshop_lib.data import load_table
from workshop_lib.paths import DEFAULT_DATA, write_atomic
from workshop_lib.split import stratified_split


class CharDataset(Dataset):
    """SMILES strings, turned into character ids on every ``__getitem__`` (as the original)."""

    def __init__(self, smiles: Sequence[str], labels: np.ndarray, stoi: dict[str, int]):
        self.smiles, self.labels, self.stoi = list(smiles), labels, stoi

    def __len__(self) -> int:
        return len(self.smiles)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, float]:
        ids = [self.stoi.get(c, 1) for c in self.smiles[i]]
        return torch.tensor(ids, dtype=torch.long), float(self.labels[i])


def collate(items):
    seqs = [s for s, _ in items]
    lengths = torch.tensor([len(s) for s in seqs])
    return pad_sequence(seqs, batch_first=True), lengths, torch.tensor([y for _, y in items])


class OriginalLSTM(nn.Module):
    def __init__(self, vocab: int, fixed_summary: bool, embed: int = 128, hidden: int = 128,
                 layers: int = 3, dropout: float = 0.2):
        super().__init__()
        self.fixed_summary = fixed_summary
        self.embed = nn.Embedding(vocab, embed, padding_idx=0)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, bidirectional=True, batch_first=True,
                            dropout=dropout)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(2 * hidden, 1)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(self.embed(tokens), lengths, batch_first=True, enforce_sorted=False)
        _, (h_n, _) = self.lstm(packed)  # (layers * 2, B, H)
        first = h_n[-2] if self.fixed_summary else h_n[-1]  # the original: h_n[-1] twice
        return self.fc(self.dropout(torch.cat([first, h_n[-1]], dim=1))).squeeze(1)  # (B,)


@torch.no_grad()
def roc_auc(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    probs, labels = [], []
    for tokens, lengths, y in loader:
        probs.append(torch.sigmoid(model(tokens, lengths)))
        labels.append(y)
    return float(roc_auc_score(torch.cat(labels).numpy(), torch.cat(probs).numpy()))


def main(argv: Sequence[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--limit", type=int, default=None, help="first N molecules (random, seeded): quick runs only")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--fixed-summary", action="store_true", help="forward + backward state, not backward twice")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/original"))
    args = p.parse_args(sys.argv[1:] if argv is None else list(argv))

    torch.manual_seed(args.seed)
    table = load_table(args.data, limit=args.limit)
    train_i, dev_i, heldout_i = stratified_split(table.labels, 0.1, 0.2, 1729)
    stoi = {c: i + 2 for i, c in enumerate(sorted({c for s in table.smiles for c in s}))}  # 0 pad, 1 unknown

    def subset(idx, shuffle):
        ds = CharDataset([table.smiles[i] for i in idx], table.labels[idx], stoi)
        return DataLoader(ds, batch_size=args.batch_size, shuffle=shuffle, collate_fn=collate)

    train_loader, dev_loader, heldout_loader = subset(train_i, True), subset(dev_i, False), subset(heldout_i, False)
    model = OriginalLSTM(len(stoi) + 2, args.fixed_summary)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)

    history, train_seconds = [], 0.0
    for epoch in range(args.epochs):
        model.train()
        start = time.perf_counter()
        for tokens, lengths, y in train_loader:
            loss = F.binary_cross_entropy_with_logits(model(tokens, lengths), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        seconds = time.perf_counter() - start
        train_seconds += seconds
        dev = roc_auc(model, dev_loader)
        history.append({"epoch": epoch, "dev_roc_auc": dev, "seconds": seconds,
                        "samples_per_second": len(train_i) / seconds})
        print(f"epoch {epoch + 1}/{args.epochs}  dev ROC AUC {dev:.4f}  {seconds:.1f}s  "
              f"{len(train_i) / seconds:.0f} samples/s", flush=True)
    heldout = roc_auc(model, heldout_loader)
    metrics = {
        "script": "original_recipe", "world_size": 1, "threads_per_process": torch.get_num_threads(),
        "epochs": args.epochs, "global_batch_size": args.batch_size, "fixed_summary": args.fixed_summary,
        "heldout_roc_auc": heldout, "dev_roc_auc": history[-1]["dev_roc_auc"], "train_seconds": train_seconds,
        "train_samples_per_second": len(train_i) * args.epochs / train_seconds, "history": history,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out / "metrics.json", (json.dumps(metrics, indent=2) + "\n").encode())
    print(f"heldout ROC AUC {heldout:.4f} (final model); trained {train_seconds:.1f}s", flush=True)
    return metrics


if __name__ == "__main__":
    main()  # bad input (load_table's InputError) is one line and exit status 1
