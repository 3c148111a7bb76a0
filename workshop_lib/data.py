"""Molecules in, batches out: CSV loading, the tokenized dataset, the split, loaders.

The tokenizer is in :mod:`workshop_lib.tokenizer`, the batch samplers (the
length bucketing that keeps DistributedSampler's shards) in
:mod:`workshop_lib.samplers`.

The hot path does no per-molecule Python work: every SMILES is tokenized once,
up front, into one padded ``(N, L_max)`` tensor, and a batch is a single
fancy-index of it, cut to the longest molecule in the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from workshop_lib.errors import WorkshopError, first_line
from workshop_lib.samplers import BucketBatchSampler, SortedBatchSampler
from workshop_lib.split import stratified_split
from workshop_lib.tokenizer import SmilesTokenizer

SMILES_NAMES = ("smiles", "smi", "canonical_smiles", "isomeric_smiles")
LABEL_NAMES = ("p_np", "label", "labels", "y", "target", "class", "bbb", "active")

# ----------------------------------------------------------------------------- CSV


@dataclass(frozen=True)
class Table:
    """The molecules of one CSV: SMILES strings, 0/1 labels, and where they came from."""

    smiles: list[str]
    labels: np.ndarray  # (N,) int64, 0 or 1
    source: str  # "path [smiles_col -> label_col]"


def _detect(columns: Sequence[str], wanted: tuple[str, ...], contains: str | None) -> str | None:
    lower = {c.lower().strip(): c for c in columns}
    for name in wanted:
        if name in lower:
            return lower[name]
    if contains:
        hits = [c for c in columns if contains in c.lower()]
        if len(hits) == 1:
            return hits[0]
    return None


def load_table(path: Path, smiles_col: str | None = None, label_col: str | None = None,
               limit: int | None = None, seed: int = 1729) -> Table:
    """Read a CSV with a SMILES column and a binary label column.

    Column names are detected (``smiles``, ``p_np``, ``label`` ...) unless given.
    ``limit`` keeps a random subset of that many rows, fixed by ``seed``.
    """
    path = Path(path)
    if not path.is_file():
        raise WorkshopError(f"data file {path} not found; pass --data PATH to a CSV with SMILES and 0/1 labels")
    try:
        df = pd.read_csv(path, sep=None, engine="python") if path.suffix.lower() in (".tsv", ".txt") else pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise WorkshopError(f"{path} is empty; pass --data PATH to a CSV with SMILES and 0/1 labels") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise WorkshopError(f"{path} is not a readable CSV ({first_line(err, 10_000)}); check the file") from None
    if df.empty:
        raise WorkshopError(f"{path} has a header but no rows; pass --data PATH to a CSV with molecules in it")

    columns = [str(c) for c in df.columns]
    s_col = smiles_col or _detect(columns, SMILES_NAMES, "smiles")
    if s_col not in columns:
        raise WorkshopError(f"{path} has no SMILES column {smiles_col or ''}(columns: {', '.join(columns)}); "
                            f"name it with --smiles-col")
    l_col = label_col or _detect([c for c in columns if c != s_col], LABEL_NAMES, None)
    if l_col is None:  # fall back to the one column that holds only 0s and 1s
        binary = [c for c in columns if c != s_col and set(pd.unique(df[c].dropna())) <= {0, 1}
                  and df[c].nunique() == 2]
        l_col = binary[0] if len(binary) == 1 else None
    if l_col not in columns:
        raise WorkshopError(f"{path} has no label column {label_col or ''}(columns: {', '.join(columns)}); "
                            f"name the 0/1 column with --label-col")

    df = df.dropna(subset=[s_col])
    raw = df[l_col]
    labels = pd.to_numeric(raw, errors="coerce")
    bad = raw[labels.isna() | ~labels.isin([0, 1])]
    if len(bad):
        raise WorkshopError(f"label column '{l_col}' in {path} must hold only 0 and 1, found {bad.iloc[0]!r} "
                            f"in row {bad.index[0] + 2}; convert the labels to 0/1 or pick --label-col")
    if labels.nunique() < 2:
        raise WorkshopError(f"label column '{l_col}' in {path} holds a single class ({int(labels.iloc[0])}); "
                            f"ROC AUC needs both 0s and 1s")
    stripped = df[s_col].astype(str).str.strip()
    blank = stripped.index[stripped == ""]
    if len(blank):
        raise WorkshopError(f"SMILES column '{s_col}' in {path} is blank in row {blank[0] + 2}; "
                            f"fill in that molecule or remove the row")
    table = Table(stripped.tolist(), labels.to_numpy(dtype=np.int64), f"{path} [{s_col} -> {l_col}]")
    return table if limit is None else take(table, limit, seed)


def take(table: Table, limit: int, seed: int = 1729) -> Table:
    """A seeded random subset of ``limit`` molecules, in file order (the shipped file is sorted by class)."""
    if limit > len(table.smiles):
        raise WorkshopError(f"--limit {limit} is larger than the {len(table.smiles)} molecules in "
                            f"{table.source.split(' [')[0]}; use --limit {len(table.smiles)} or less")
    keep = np.sort(np.random.default_rng(seed).permutation(len(table.smiles))[:limit])
    return Table([table.smiles[i] for i in keep], table.labels[keep], table.source)


# ------------------------------------------------------------------------- dataset


class Batch(NamedTuple):
    tokens: torch.Tensor  # (B, T) int64, padded with 0
    lengths: torch.Tensor  # (B,) int64, on CPU: pack_padded_sequence wants them there
    labels: torch.Tensor  # (B,) float32

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        return Batch(self.tokens.to(device, non_blocking=nb), self.lengths, self.labels.to(device, non_blocking=nb))


class TokenizedDataset(Dataset):
    """Molecules tokenized once, stored as one padded tensor."""

    def __init__(self, smiles: Sequence[str], labels: np.ndarray, tokenizer: SmilesTokenizer):
        ids = [tokenizer.encode(s, i) for i, s in enumerate(smiles)]
        self.lengths = torch.tensor([max(len(x), 1) for x in ids], dtype=torch.int64)  # (N,)
        self.tokens = torch.zeros(len(ids), int(self.lengths.max()), dtype=torch.int64)  # (N, L_max)
        for i, x in enumerate(ids):
            self.tokens[i, : len(x)] = torch.tensor(x, dtype=torch.int64)
        self.labels = torch.tensor(labels, dtype=torch.float32)  # (N,)
        self.smiles = list(smiles)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, float]:
        return self.tokens[i, : self.lengths[i]], float(self.labels[i])

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        """A whole batch in one indexing op (DataLoader calls this when it exists)."""
        idx = torch.as_tensor(indices, dtype=torch.int64)
        lengths = self.lengths[idx]
        return Batch(self.tokens[idx, : int(lengths.max())], lengths, self.labels[idx])

    def subset(self, indices: np.ndarray) -> TokenizedDataset:
        sub = TokenizedDataset.__new__(TokenizedDataset)
        idx = torch.as_tensor(indices, dtype=torch.int64)
        sub.lengths, sub.labels = self.lengths[idx], self.labels[idx]
        sub.tokens = self.tokens[idx, : int(sub.lengths.max())]
        sub.smiles = [self.smiles[i] for i in indices]
        return sub


def pad_collate(items: Sequence[tuple[torch.Tensor, float]]) -> Batch:
    """Collate ``dataset[i]`` items into a padded Batch (the slow, per-item path)."""
    lengths = torch.tensor([len(t) for t, _ in items], dtype=torch.int64)
    tokens = torch.nn.utils.rnn.pad_sequence([t for t, _ in items], batch_first=True)  # (B, T)
    return Batch(tokens, lengths, torch.tensor([y for _, y in items], dtype=torch.float32))


def _as_is(batch: Batch) -> Batch:
    return batch


# ---------------------------------------------------------------------------- split


@dataclass(frozen=True)
class Splits:
    train: TokenizedDataset
    dev: TokenizedDataset
    heldout: TokenizedDataset
    tokenizer: SmilesTokenizer
    source: str


def load_splits(path: Path, smiles_col: str | None = None, label_col: str | None = None,
                limit: int | None = None, heldout_frac: float = 0.1, dev_frac: float = 0.2,
                split_seed: int = 1729) -> Splits:
    """CSV -> tokenizer fitted on all SMILES -> three tokenized, stratified splits (of ``limit`` molecules).

    The vocabulary comes from the whole table, before ``limit``: the model's
    size is then the same for a quick run and a full one.
    """
    table = load_table(path, smiles_col, label_col, None, split_seed)
    tokenizer = SmilesTokenizer.fit(table.smiles)  # SMILES only, no labels: no leak
    if limit is not None:
        table = take(table, limit, split_seed)
    full = TokenizedDataset(table.smiles, table.labels, tokenizer)
    train, dev, heldout = stratified_split(table.labels, heldout_frac, dev_frac, split_seed)
    return Splits(full.subset(train), full.subset(dev), full.subset(heldout), tokenizer, table.source)


# ------------------------------------------------------------------------- loaders


def make_loader(dataset: TokenizedDataset, sampler: Sampler[int], batch_size: int, seed: int = 0) -> DataLoader:
    """Training batches drawn in ``sampler``'s order, bucketed by length."""
    batches = BucketBatchSampler(sampler, dataset.lengths, batch_size, seed=seed)
    return DataLoader(dataset, batch_sampler=batches, collate_fn=_as_is)


def make_eval_loader(dataset: TokenizedDataset, batch_size: int = 512) -> DataLoader:
    """Every molecule exactly once, no shuffling, no padding duplicates."""
    return DataLoader(dataset, batch_sampler=SortedBatchSampler(dataset.lengths, batch_size), collate_fn=_as_is)


def check_shardable(n_train: int, world_size: int) -> None:
    """Refuse a training split too small to give every rank real molecules."""
    if n_train < world_size:
        raise WorkshopError(f"{n_train} training molecules cannot be shared by {world_size} ranks; "
                            f"raise --limit or use fewer processes")
