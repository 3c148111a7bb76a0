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

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
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


# What pandas' read_csv reads as a missing value (its default na_values): such a cell is no molecule, no label.
MISSING = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>",
                     "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})


def _detect(columns: Sequence[str], wanted: tuple[str, ...], contains: str | None) -> str | None:
    """The first of the ``wanted`` names among ``columns`` (any case), else the one column whose name ``contains``."""
    lower = {c.lower().strip(): c for c in columns}
    hits = [c for c in columns if contains and contains in c.lower()]
    return next((lower[name] for name in wanted if name in lower), hits[0] if len(hits) == 1 else None)


def _number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    """The header and the rows (blank lines skipped, short rows padded); one line naming what cannot be read."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise InputError(f"{path} is not a readable CSV ({first_line(err, 10_000)}); check the file") from None
    if not text.strip():
        raise InputError(f"{path} is empty; pass --data PATH to a CSV with SMILES and 0/1 labels")
    dialect: type[csv.Dialect] | csv.Dialect = csv.excel
    if path.suffix.lower() in (".tsv", ".txt"):
        try:
            dialect = csv.Sniffer().sniff(text[:20_000], delimiters=",\t;| ")
        except csv.Error:
            dialect = csv.excel_tab
    try:
        header, *rows = [row for row in csv.reader(io.StringIO(text, newline=""), dialect) if row]
    except csv.Error as err:
        raise InputError(f"{path} is not a readable CSV ({first_line(err, 10_000)}); check the file") from None
    for i, row in enumerate(rows):
        if len(row) > len(header):
            raise InputError(f"{path} is not a readable CSV (row {i + 2} has {len(row)} fields, the header "
                             f"{len(header)}); check the file")
        row.extend([""] * (len(header) - len(row)))
    return [c.strip() for c in header], rows


def load_table(path: Path, smiles_col: str | None = None, label_col: str | None = None,
               limit: int | None = None, seed: int = 1729) -> Table:
    """Read a CSV with a SMILES column and a binary label column (the standard library's csv: quick to import).

    Column names are detected (``smiles``, ``p_np``, ``label`` ...) unless given.
    ``limit`` keeps a random subset of that many rows, fixed by ``seed``. A .tsv or
    .txt file's delimiter is detected.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"data file {path} not found; pass --data PATH to a CSV with SMILES and 0/1 labels")
    columns, rows = _rows(path)
    if not rows:
        raise InputError(f"{path} has a header but no rows; pass --data PATH to a CSV with molecules in it")

    def cells(column: str) -> list[str]:
        at = columns.index(column)
        return [row[at] for row in rows]

    s_col = smiles_col or _detect(columns, SMILES_NAMES, "smiles")
    if s_col not in columns:
        raise InputError(f"{path} has no SMILES column {smiles_col or ''}(columns: {', '.join(columns)}); "
                            f"name it with --smiles-col")
    l_col = label_col or _detect([c for c in columns if c != s_col], LABEL_NAMES, None)
    if l_col is None:  # fall back to the one column that holds only 0s and 1s
        found = [c for c in columns if c != s_col and {_number(v) for v in cells(c) if v not in MISSING} == {0.0, 1.0}]
        l_col = found[0] if len(found) == 1 else None
    if l_col not in columns:
        raise InputError(f"{path} has no label column {label_col or ''}(columns: {', '.join(columns)}); "
                            f"name the 0/1 column with --label-col")

    # Rows without a molecule are dropped (as pandas' dropna would); row numbers are the file's (the header is 1).
    kept = [(i + 2, smiles, label) for i, (smiles, label) in enumerate(zip(cells(s_col), cells(l_col), strict=True))
            if smiles not in MISSING]
    labels = []
    for row, _, label in kept:
        value = _number(label)
        if value not in (0.0, 1.0):
            raise InputError(f"label column '{l_col}' in {path} must hold only 0 and 1, found {label!r} "
                                f"in row {row}; convert the labels to 0/1 or pick --label-col")
        labels.append(int(value))
    if len(set(labels)) < 2:
        raise InputError(f"label column '{l_col}' in {path} holds a single class ({labels[0] if labels else '-'}); "
                            f"ROC AUC needs both 0s and 1s")
    smiles = [s.strip() for _, s, _ in kept]
    blank = next((row for (row, _, _), s in zip(kept, smiles, strict=True) if not s), None)
    if blank is not None:
        raise InputError(f"SMILES column '{s_col}' in {path} is blank in row {blank}; "
                            f"fill in that molecule or remove the row")
    table = Table(smiles, np.array(labels, dtype=np.int64), f"{path} [{s_col} -> {l_col}]")
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
