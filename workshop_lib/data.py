"""Molecules in, batches out: CSV loading, the tokenized dataset, the split, and ``collate`` for a DataLoader.

Every SMILES is tokenized once, up front, into one padded ``(N, L_max)``
tensor; ``dataset[i]`` is a view of its row, and :func:`collate` pads a
batch to its longest molecule. A step script builds its loaders itself:

    DataLoader(splits.train, batch_size=64, sampler=DistributedSampler(splits.train), collate_fn=collate)

The dev and heldout splits are stored sorted by length: their order does not
change a ROC AUC, and a plain sequential loader then batches molecules of
similar length, with little padding. The tokenizer is in
:mod:`workshop_lib.tokenizer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset

from workshop_lib.config import TrainConfig
from workshop_lib.errors import InputError, first_line
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
        raise InputError(f"data file {path} not found; pass --data PATH to a CSV with SMILES and 0/1 labels")
    try:
        df = pd.read_csv(path, sep=None, engine="python") if path.suffix.lower() in (".tsv", ".txt") else pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise InputError(f"{path} is empty; pass --data PATH to a CSV with SMILES and 0/1 labels") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise InputError(f"{path} is not a readable CSV ({first_line(err, 10_000)}); check the file") from None
    if df.empty:
        raise InputError(f"{path} has a header but no rows; pass --data PATH to a CSV with molecules in it")

    columns = [str(c) for c in df.columns]
    s_col = smiles_col or _detect(columns, SMILES_NAMES, "smiles")
    if s_col not in columns:
        raise InputError(f"{path} has no SMILES column {smiles_col or ''}(columns: {', '.join(columns)}); "
                            f"name it with --smiles-col")
    l_col = label_col or _detect([c for c in columns if c != s_col], LABEL_NAMES, None)
    if l_col is None:  # fall back to the one column that holds only 0s and 1s
        binary = [c for c in columns if c != s_col and set(pd.unique(df[c].dropna())) <= {0, 1}
                  and df[c].nunique() == 2]
        l_col = binary[0] if len(binary) == 1 else None
    if l_col not in columns:
        raise InputError(f"{path} has no label column {label_col or ''}(columns: {', '.join(columns)}); "
                            f"name the 0/1 column with --label-col")

    df = df.dropna(subset=[s_col])
    raw = df[l_col]
    labels = pd.to_numeric(raw, errors="coerce")
    bad = raw[labels.isna() | ~labels.isin([0, 1])]
    if len(bad):
        raise InputError(f"label column '{l_col}' in {path} must hold only 0 and 1, found {bad.iloc[0]!r} "
                            f"in row {bad.index[0] + 2}; convert the labels to 0/1 or pick --label-col")
    if labels.nunique() < 2:
        raise InputError(f"label column '{l_col}' in {path} holds a single class ({int(labels.iloc[0])}); "
                            f"ROC AUC needs both 0s and 1s")
    stripped = df[s_col].astype(str).str.strip()
    blank = stripped.index[stripped == ""]
    if len(blank):
        raise InputError(f"SMILES column '{s_col}' in {path} is blank in row {blank[0] + 2}; "
                            f"fill in that molecule or remove the row")
    table = Table(stripped.tolist(), labels.to_numpy(dtype=np.int64), f"{path} [{s_col} -> {l_col}]")
    return table if limit is None else take(table, limit, seed)


def take(table: Table, limit: int, seed: int = 1729) -> Table:
    """A seeded random subset of ``limit`` molecules, in file order (the shipped file is sorted by class)."""
    if limit > len(table.smiles):
        raise InputError(f"--limit {limit} is larger than the {len(table.smiles)} molecules in "
                            f"{table.source.split(' [')[0]}; use --limit {len(table.smiles)} or less")
    keep = np.sort(np.random.default_rng(seed).permutation(len(table.smiles))[:limit])
    return Table([table.smiles[i] for i in keep], table.labels[keep], table.source)


# ------------------------------------------------------------------------- dataset


class Batch(NamedTuple):
    """A padded batch; a loader's batches unpack as ``for tokens, lengths, labels in loader``."""

    tokens: torch.Tensor  # (B, T) int64, padded with 0 after each molecule
    lengths: torch.Tensor  # (B,) int64, each molecule's number of tokens
    labels: torch.Tensor  # (B,) float32, 0 or 1


class TokenizedDataset(Dataset):
    """Molecules tokenized once: ``dataset[i]`` is (the molecule's tokens (L,), its label) as tensors."""

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

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tokens[i, : self.lengths[i]], self.labels[i]

    def subset(self, indices: np.ndarray) -> TokenizedDataset:
        sub = TokenizedDataset.__new__(TokenizedDataset)
        idx = torch.as_tensor(indices, dtype=torch.int64)
        sub.lengths, sub.labels = self.lengths[idx], self.labels[idx]
        sub.tokens = self.tokens[idx, : int(sub.lengths.max())]
        sub.smiles = [self.smiles[i] for i in indices]
        return sub


def collate(items: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> Batch:
    """A DataLoader's ``collate_fn``: ``dataset[i]`` items -> one Batch, padded to its longest molecule."""
    lengths = torch.tensor([len(tokens) for tokens, _ in items], dtype=torch.int64)  # (B,)
    tokens = torch.nn.utils.rnn.pad_sequence([tokens for tokens, _ in items], batch_first=True)  # (B, T)
    return Batch(tokens, lengths, torch.stack([label for _, label in items]))


# ---------------------------------------------------------------------------- split


@dataclass(frozen=True)
class Splits:
    train: TokenizedDataset
    dev: TokenizedDataset
    heldout: TokenizedDataset
    tokenizer: SmilesTokenizer
    source: str


def load_splits(cfg: TrainConfig) -> Splits:
    """``cfg.data`` -> tokenizer fitted on all SMILES -> three tokenized, stratified splits (of ``cfg.limit``).

    The vocabulary comes from the whole table, before ``--limit``: the model's
    size is then the same for a quick run and a full one. Dev and heldout are
    sorted by length (see the module's docstring). Bad input stops with one line.
    """
    table = load_table(cfg.data, cfg.smiles_col, cfg.label_col, None, cfg.split_seed)
    tokenizer = SmilesTokenizer.fit(table.smiles)  # SMILES only, no labels: no leak
    if cfg.limit is not None:
        table = take(table, cfg.limit, cfg.split_seed)
    full = TokenizedDataset(table.smiles, table.labels, tokenizer)
    train, dev, heldout = stratified_split(table.labels, cfg.heldout_frac, cfg.dev_frac, cfg.split_seed)
    by_length = [np.asarray(part)[np.argsort(full.lengths[part].numpy(), kind="stable")] for part in (dev, heldout)]
    return Splits(full.subset(train), full.subset(by_length[0]), full.subset(by_length[1]), tokenizer, table.source)
