"""metrics.json: written atomically by global rank 0, read back by notebooks and tests."""

from __future__ import annotations

import json
from pathlib import Path

from workshop_lib.paths import write_atomic

REQUIRED = ("script", "world_size", "backend", "device", "epochs", "global_batch_size", "best_epoch",
            "dev_roc_auc", "heldout_roc_auc", "train_seconds", "train_samples_per_second")


def write_metrics(path: Path, metrics: dict) -> Path:
    missing = [k for k in REQUIRED if k not in metrics]
    assert not missing, f"metrics lack {missing}"
    write_atomic(path, (json.dumps(metrics, indent=2, sort_keys=True) + "\n").encode())
    return Path(path)


def read_metrics(path: Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.json"
    return json.loads(path.read_text())
