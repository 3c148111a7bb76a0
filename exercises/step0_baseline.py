# Generated from notebooks/00_baseline.ipynb by `python -m workshop_lib.build`: do not edit.
# Edit the cells tagged script:step0_baseline, then rebuild.
# ruff: noqa (exercise version: the TODOs leave names for you to define)
"""Step 0: the single-process baseline.

One process trains a bidirectional LSTM to tell whether a molecule crosses
the blood-brain barrier. Every later step changes a few lines of this file.

    python solutions/step0_baseline.py
"""

from __future__ import annotations

import torch
from torch.utils.data import RandomSampler

from workshop_lib.cli import run_cli
from workshop_lib.config import TrainConfig, build_parser, parse_config
from workshop_lib.data import load_splits, make_eval_loader, make_loader
from workshop_lib.model import count_parameters
from workshop_lib.report import Reporter
from workshop_lib.train import BestModel, build_model, build_optimizer, evaluate, train_epoch


def train(cfg: TrainConfig, device: torch.device) -> dict | None:
    torch.manual_seed(cfg.seed)
    splits = load_splits(cfg.data, cfg.smiles_col, cfg.label_col, cfg.limit,
                         cfg.heldout_frac, cfg.dev_frac, cfg.split_seed)
    report = Reporter(cfg, "step0_baseline", device)

    sampler = RandomSampler(splits.train, generator=torch.Generator().manual_seed(cfg.seed))
    train_loader = make_loader(splits.train, sampler, cfg.batch_size, seed=cfg.seed)
    dev_loader = make_eval_loader(splits.dev)

    model = build_model(cfg, len(splits.tokenizer)).to(device)
    optimizer = build_optimizer(cfg, model)
    report.start(len(splits.train), len(splits.dev), len(splits.heldout), count_parameters(model), splits.source)

    best = BestModel()
    for epoch in range(cfg.epochs):
        # TODO: train one pass, score the dev split, keep the best weights, report the epoch
        raise NotImplementedError("fill in the TODO above")

    best.restore(model)
    heldout_auc = evaluate(model, make_eval_loader(splits.heldout), device)
    return report.finish(best, heldout_auc)


def main(argv: list[str] | None = None) -> dict | None:
    cfg = parse_config(build_parser(__doc__.splitlines()[0]), argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return train(cfg, device)


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
