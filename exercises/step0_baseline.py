# Generated from notebooks/00_baseline.ipynb by `python -m tools.build`: do not edit.
# Edit the cells tagged script:step0_baseline, then rebuild.
"""Step 0: the single-process baseline.

One process trains a bidirectional LSTM to tell whether a molecule crosses
the blood-brain barrier. Every later step changes a few lines of this file.

    python solutions/step0_baseline.py
"""

import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from workshop_lib.config import parse_args
from workshop_lib.data import collate, load_splits
from workshop_lib.metrics import BestModel, evaluate
from workshop_lib.model import SmilesLSTM
from workshop_lib.report import Reporter


def train_epoch(model, loader, optimizer, device) -> torch.Tensor:
    """One pass over ``loader``; returns [the summed loss, the number of molecules] of this process."""
    model.train()
    totals = torch.zeros(2, device=device)
    for tokens, lengths, labels in loader:
        tokens, labels = tokens.to(device), labels.to(device)
        loss = F.binary_cross_entropy_with_logits(model(tokens, lengths), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        totals += torch.stack([loss.detach() * len(labels), torch.tensor(len(labels), device=device)])
    return totals


def make_loader(dataset, batch_size: int, seed: int) -> DataLoader:
    """Training batches in a new random order every epoch."""
    order = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=order, collate_fn=collate)


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv, __doc__)
    splits = load_splits(cfg)  # bad data stops here, with one line
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    train_loader = make_loader(splits.train, cfg.batch_size, cfg.seed)
    dev_loader = DataLoader(splits.dev, batch_size=256, collate_fn=collate)
    torch.manual_seed(cfg.seed)
    model = SmilesLSTM(len(splits.tokenizer), cfg.embed_dim, cfg.hidden, cfg.layers, cfg.dropout).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    report = Reporter(cfg, "step0_baseline", splits, model)

    best = BestModel()
    for epoch in range(cfg.epochs):
        start = time.perf_counter()
        totals = train_epoch(model, train_loader, optimizer, device)
        seconds = time.perf_counter() - start
        dev_auc = evaluate(model, dev_loader, device)
        best.update(epoch, dev_auc, model)
        report.epoch(epoch, (totals[0] / totals[1]).item(), int(totals[1]), seconds, dev_auc)

    best.restore(model)
    heldout_loader = DataLoader(splits.heldout, batch_size=256, collate_fn=collate)
    torch.save(model.state_dict(), cfg.out / "model.pt")
    report.finish(best, evaluate(model, heldout_loader, device))


if __name__ == "__main__":
    main()
