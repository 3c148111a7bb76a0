"""What global rank 0 shows and writes: console lines, TensorBoard, metrics.json.

A step script builds its Reporter on global rank 0 only (``if rank == 0``): one
process writes the files, even with several nodes. Nothing here talks to the
other ranks: the script all-reduces what the report needs first.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from workshop_lib.config import TrainConfig
from workshop_lib.data import Splits
from workshop_lib.errors import InputError
from workshop_lib.metrics import BestModel, write_metrics
from workshop_lib.model import count_parameters
from workshop_lib.paths import shown


def prepare_out_dir(out: Path) -> Path:
    """Create ``out`` and prove it is writable, before any work is done."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise InputError(f"cannot write to --out {out} ({err.strerror}); choose a writable directory") from None
    return out


class Reporter:
    """Global rank 0's console, TensorBoard and metrics.json for one run; the header is printed at once."""

    def __init__(self, cfg: TrainConfig, script: str, splits: Splits, model: nn.Module, world_size: int = 1):
        self.cfg, self.script, self.world_size = cfg, script, world_size
        self.device = next(model.parameters()).device
        self.history: list[dict] = []
        self.train_seconds, self.train_samples = 0.0, 0
        self._writer = None
        prepare_out_dir(cfg.out)
        self.print(f"data: {shown(splits.source)}: {len(splits.train)} train / {len(splits.dev)} dev / "
                   f"{len(splits.heldout)} heldout molecules")
        self.print(f"model: {count_parameters(model):,} parameters; {self._batch_line(model)}")

    def _batch_line(self, model: nn.Module) -> str:
        """The batch as it is at this step: the ranks share a step (a global batch) only once DDP wraps the model."""
        batch = f"batch {self.cfg.batch_size}"
        if self.world_size == 1:
            return batch
        if isinstance(model, nn.parallel.DistributedDataParallel):
            return (f"{batch} per process x {self.world_size} processes (global batch {self.global_batch_size}: "
                    f"DDP averages their gradients)")
        return f"{batch} per process x {self.world_size} processes, each training its own copy of the model"

    # -- resume (checkpoint.py) ----------------------------------------------
    def state_dict(self) -> dict:
        return {"history": self.history, "train_seconds": self.train_seconds, "train_samples": self.train_samples}

    def load_state_dict(self, state: dict) -> None:
        self.history = list(state["history"])
        self.train_seconds, self.train_samples = state["train_seconds"], state["train_samples"]

    # -- console -------------------------------------------------------------
    @staticmethod
    def print(*args) -> None:
        print(*args, flush=True)

    @property
    def global_batch_size(self) -> int:
        return self.cfg.batch_size * self.world_size

    # -- per epoch -----------------------------------------------------------
    def epoch(self, epoch: int, loss: float, samples: int, seconds: float, dev_roc_auc: float, **extra) -> None:
        """Record one epoch: the mean training ``loss`` over the ``samples`` every rank trained, rank 0's ``seconds``."""
        self.train_seconds += seconds
        self.train_samples += samples
        row = {"epoch": epoch, "train_loss": loss, "dev_roc_auc": dev_roc_auc, "seconds": seconds,
               "samples_per_second": samples / seconds, **extra}
        self.history.append(row)
        more = "".join(f"  {k} {v:.3g}" for k, v in extra.items())
        self.print(f"epoch {epoch + 1}/{self.cfg.epochs}  train loss {loss:.4f}  dev ROC AUC {dev_roc_auc:.4f}"
                   f"  {seconds:.1f}s  {row['samples_per_second']:.0f} samples/s{more}")
        if self.cfg.tensorboard:
            w = self._tensorboard()
            w.add_scalar("loss/train", loss, epoch)
            w.add_scalar("roc_auc/dev", dev_roc_auc, epoch)
            w.add_scalar("throughput/samples_per_second", row["samples_per_second"], epoch)
            for k, v in extra.items():
                w.add_scalar(f"extra/{k}", v, epoch)

    def _tensorboard(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # slow import: only when used

            self._writer = SummaryWriter(log_dir=str(Path(self.cfg.out) / "tensorboard"))
        return self._writer

    # -- end -----------------------------------------------------------------
    def finish(self, best: BestModel, heldout_roc_auc: float, **extra) -> dict:
        """Write metrics.json (and the TensorBoard hparams), print the summary."""
        metrics = {
            "script": self.script,
            "world_size": self.world_size,
            "backend": dist.get_backend() if dist.is_available() and dist.is_initialized() else None,
            "device": str(self.device),
            "threads_per_process": torch.get_num_threads(),
            "epochs": self.cfg.epochs,
            "batch_size_per_process": self.cfg.batch_size,
            "global_batch_size": self.global_batch_size,
            "best_epoch": best.epoch,
            "dev_roc_auc": best.roc_auc,
            "heldout_roc_auc": heldout_roc_auc,
            "train_seconds": self.train_seconds,
            "train_samples_per_second": self.train_samples / max(self.train_seconds, 1e-9),
            "history": self.history,
            "config": self.cfg.as_dict(),
            **extra,
        }
        path = write_metrics(Path(self.cfg.out) / "metrics.json", metrics)
        if self.cfg.tensorboard:
            hparams = {k: getattr(self.cfg, k) for k in ("epochs", "batch_size", "lr", "embed_dim", "hidden", "layers",
                                                           "dropout", "seed")} | {"world_size": self.world_size}
            self._tensorboard().add_hparams(hparams, {"hparam/heldout_roc_auc": heldout_roc_auc,
                                                      "hparam/dev_roc_auc": best.roc_auc}, run_name=".")
            self._writer.close()
        self.print(f"best epoch {best.epoch + 1}: dev ROC AUC {best.roc_auc:.4f}; heldout ROC AUC {heldout_roc_auc:.4f}")
        self.print(f"trained {self.train_seconds:.1f}s at {metrics['train_samples_per_second']:.0f} samples/s")
        self.print(f"metrics: {shown(path)}")
        return metrics
