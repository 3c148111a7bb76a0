"""What global rank 0 shows and writes: console lines, tqdm, TensorBoard, metrics.json.

Every rank builds a Reporter; on ranks other than 0 each method does nothing,
so the step scripts never need ``if rank == 0`` around a print.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from workshop_lib.config import TrainConfig
from workshop_lib.distributed import DistEnv
from workshop_lib.errors import WorkshopError
from workshop_lib.metrics import write_metrics
from workshop_lib.paths import REPO_ROOT
from workshop_lib.train import BestModel, EpochStats


def shown(text: str | Path) -> str:
    """``text`` with the repository's absolute path dropped: printed lines read the same on every machine."""
    return str(text).replace(f"{REPO_ROOT}{os.sep}", "")


def prepare_out_dir(out: Path) -> Path:
    """Create ``out`` and prove it is writable, before any work is done."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise WorkshopError(f"cannot write to --out {out} ({err.strerror}); choose a writable directory") from None
    return out


class Reporter:
    def __init__(self, cfg: TrainConfig, script: str, device: torch.device, env: DistEnv | None = None):
        self.cfg, self.script, self.device = cfg, script, device
        self.world_size = env.world_size if env else 1
        self.backend = env.backend if env else None
        self.is_main = env.is_main if env else True
        self.history: list[dict] = []
        self.train_seconds, self.train_samples = 0.0, 0
        self._writer = None
        if self.is_main:
            prepare_out_dir(cfg.out)

    # -- resume (checkpoint.py) ----------------------------------------------
    def state_dict(self) -> dict:
        return {"history": self.history, "train_seconds": self.train_seconds, "train_samples": self.train_samples}

    def load_state_dict(self, state: dict) -> None:
        self.history = list(state["history"])
        self.train_seconds, self.train_samples = state["train_seconds"], state["train_samples"]

    # -- console -------------------------------------------------------------
    def print(self, *args) -> None:
        if self.is_main:
            print(*args, flush=True)

    def start(self, n_train: int, n_dev: int, n_heldout: int, n_params: int, source: str) -> None:
        self.print(f"data: {shown(source)}: {n_train} train / {n_dev} dev / {n_heldout} heldout molecules")
        self.print(f"model: {n_params:,} parameters; batch {self.cfg.batch_size} per process x "
                   f"{self.world_size} process(es) = global batch {self.global_batch_size}")

    @property
    def global_batch_size(self) -> int:
        return self.cfg.batch_size * self.world_size

    def progress(self, epoch: int, total: int):
        """A tqdm bar for one epoch on rank 0 (None elsewhere, or with --no-progress)."""
        if not (self.is_main and self.cfg.progress):
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=f"epoch {epoch + 1}/{self.cfg.epochs}", leave=False,
                    file=sys.stderr, dynamic_ncols=True)

    # -- per epoch -----------------------------------------------------------
    def epoch(self, epoch: int, stats: EpochStats, dev_roc_auc: float, progress=None, **extra) -> None:
        """Record one epoch. ``stats`` are rank 0's; every rank trained as many samples."""
        if progress is not None:
            progress.close()
        if not self.is_main:
            return
        samples = stats.samples * self.world_size
        self.train_seconds += stats.seconds
        self.train_samples += samples
        row = {"epoch": epoch, "train_loss": stats.loss, "dev_roc_auc": dev_roc_auc,
               "seconds": stats.seconds, "samples_per_second": samples / stats.seconds, **extra}
        self.history.append(row)
        more = "".join(f"  {k} {v:.3g}" for k, v in extra.items())
        self.print(f"epoch {epoch + 1}/{self.cfg.epochs}  train loss {stats.loss:.4f}  dev ROC AUC {dev_roc_auc:.4f}"
                   f"  {stats.seconds:.1f}s  {row['samples_per_second']:.0f} samples/s{more}")
        if self.cfg.tensorboard:
            w = self._tensorboard()
            w.add_scalar("loss/train", stats.loss, epoch)
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
    def finish(self, best: BestModel, heldout_roc_auc: float, **extra) -> dict | None:
        """Write metrics.json (and the TensorBoard hparams), print the summary."""
        if not self.is_main:
            return None
        metrics = {
            "script": self.script,
            "world_size": self.world_size,
            "backend": self.backend,
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
            hparams = {k: v for k, v in self.cfg.as_dict().items()
                       if k in ("epochs", "batch_size", "lr", "embed_dim", "hidden", "layers", "dropout", "seed")}
            hparams["world_size"] = self.world_size
            self._tensorboard().add_hparams(hparams, {"hparam/heldout_roc_auc": heldout_roc_auc,
                                                      "hparam/dev_roc_auc": best.roc_auc}, run_name=".")
            self._writer.close()
        self.print(f"best epoch {best.epoch + 1}: dev ROC AUC {best.roc_auc:.4f}; heldout ROC AUC {heldout_roc_auc:.4f}")
        self.print(f"trained {self.train_seconds:.1f}s at {metrics['train_samples_per_second']:.0f} samples/s")
        self.print(f"metrics: {shown(path)}")
        return metrics
