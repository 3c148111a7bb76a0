"""What the hang watch costs a job that does not hang: DDP step time with the watch off and on.

    torchrun --standalone --nproc_per_node=2 benchmarks/hangwatch_overhead.py [--limit 1000] [--rounds 8]

Both ranks train the workshop's model under DDP on the same data, alternating
rounds without and with the watch attached (``hangwatch.attach()``, what
``-m workshop_lib.watch`` does; alternating, so that drift in the machine's
load falls on both alike), and time every step. Rank 0 writes
benchmarks/results/hangwatch_overhead.json and prints the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from workshop_lib.config import TrainConfig
from workshop_lib.data import collate, load_splits
from workshop_lib.debug import hangwatch
from workshop_lib.model import SmilesLSTM

RESULTS = Path(__file__).resolve().parent / "results" / "hangwatch_overhead.json"


def step_times(model, loader, optimizer, epochs: int) -> list[float]:
    """Seconds of each training step (forward, backward with DDP's all-reduce, optimizer step)."""
    times = []
    model.train()
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for tokens, lengths, labels in loader:
            start = time.perf_counter()
            loss = F.binary_cross_entropy_with_logits(model(tokens, lengths), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            times.append(time.perf_counter() - start)
    return times


def main(argv: Sequence[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=8, help="rounds of each setting, alternating")
    p.add_argument("--epochs", type=int, default=3, help="epochs per round")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        cfg = TrainConfig(limit=args.limit)
        splits = load_splits(cfg)
        sampler = DistributedSampler(splits.train, shuffle=True, seed=cfg.seed)
        loader = DataLoader(splits.train, batch_size=cfg.batch_size, sampler=sampler, collate_fn=collate)
        torch.manual_seed(cfg.seed)
        model = DDP(SmilesLSTM(len(splits.tokenizer), cfg.embed_dim, cfg.hidden, cfg.layers, cfg.dropout))
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        step_times(model, loader, optimizer, 1)  # warm-up
        runs: dict[str, list[float]] = {"off": [], "on": []}
        rounds: dict[str, list[float]] = {"off": [], "on": []}  # each round's median, ms: the noise between rounds
        for _ in range(args.rounds):
            for setting in ("off", "on"):
                if setting == "on":
                    hangwatch.attach()
                times = step_times(model, loader, optimizer, args.epochs)
                hangwatch.detach()
                runs[setting] += times
                rounds[setting].append(round(statistics.median(times) * 1e3, 3))
        if dist.get_rank() != 0:
            return None
        med = {k: statistics.median(v) * 1e3 for k, v in runs.items()}
        result = {"steps_per_setting": len(runs["off"]), "median_step_ms_off": round(med["off"], 3),
                  "median_step_ms_on": round(med["on"], 3),
                  "difference_percent": round(100 * (med["on"] / med["off"] - 1), 2),
                  "round_medians_ms_off": rounds["off"], "round_medians_ms_on": rounds["on"],
                  "setup": f"2 ranks, gloo, CPU, 1 thread each, --limit {args.limit}, batch {cfg.batch_size} per rank; "
                           "the watch attached as -m workshop_lib.watch attaches it",
                  "torch": torch.__version__}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2), flush=True)
        return result
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
