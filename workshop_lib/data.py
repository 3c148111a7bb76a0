"""Molecules in, batches out: CSV loading, SMILES tokenizer, split, samplers, loaders.

The hot path does no per-molecule Python work: every SMILES is tokenized once,
up front, into one padded ``(N, L_max)`` tensor, and a batch is a single
fancy-index of it, cut to the longest molecule in the batch.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from workshop_lib.errors import WorkshopError
from workshop_lib.split import stratified_split

SMILES_NAMES = ("smiles", "smi", "canonical_smiles", "isomeric_smiles")
LABEL_NAMES = ("p_np", "label", "labels", "y", "target", "class", "bbb", "active")

# One token per atom or bond symbol: bracket atoms ([nH], [C@@H], [N+]) and the
# two-letter halogens Cl and Br stay whole; ring closures %NN are one token.
SMILES_TOKEN = re.compile(
    r"\[[^\[\]]+\]|Br|Cl|Si|Se|se|As|Na|Li|[BCNOPSFIKHbcnops]|%\d{2}|\d|[=#\-+\\/().:~@?*$>]"
)


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
        raise WorkshopError(f"{path} is not a readable CSV ({str(err).splitlines()[0]}); check the file") from None
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
    smiles = df[s_col].astype(str).str.strip().tolist()
    y = labels.to_numpy(dtype=np.int64)
    if limit is not None:
        if limit > len(smiles):
            raise WorkshopError(f"--limit {limit} is larger than the {len(smiles)} molecules in {path}; "
                                f"use --limit {len(smiles)} or less")
        keep = np.sort(np.random.default_rng(seed).permutation(len(smiles))[:limit])
        smiles, y = [smiles[i] for i in keep], y[keep]
    return Table(smiles, y, f"{path} [{s_col} -> {l_col}]")


# ----------------------------------------------------------------------- tokenizer


class SmilesTokenizer:
    """Regex SMILES tokenizer with a vocabulary fitted on the data.

    Index 0 pads, index 1 stands for a token the vocabulary has not seen
    (for example a rare bracket atom in a new CSV).
    """

    PAD, UNK = 0, 1

    def __init__(self, vocab: Sequence[str]):
        self.itos = ["<pad>", "<unk>", *vocab]
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    @staticmethod
    def split(smiles: str, row: int | None = None) -> list[str]:
        """SMILES -> tokens; a character outside SMILES syntax is an error naming it."""
        tokens = SMILES_TOKEN.findall(smiles)
        if sum(map(len, tokens)) != len(smiles):
            pos = 0
            for tok in tokens:  # find the first character the pattern skipped
                at = smiles.index(tok, pos)
                if at != pos:
                    break
                pos = at + len(tok)
            where = f" in row {row + 2}" if row is not None else ""
            raise WorkshopError(f"SMILES {smiles[:60]!r}{where} has a character the tokenizer does not know: "
                                f"{smiles[pos]!r} at position {pos}; fix or remove that molecule")
        return tokens

    @classmethod
    def fit(cls, smiles: Sequence[str]) -> SmilesTokenizer:
        counts = Counter(t for i, s in enumerate(smiles) for t in cls.split(s, i))
        return cls(sorted(counts))  # sorted: the same data gives the same ids

    def encode(self, smiles: str, row: int | None = None) -> list[int]:
        return [self.stoi.get(t, self.UNK) for t in self.split(smiles, row)]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.itos[i] for i in ids if i != self.PAD)

    def __len__(self) -> int:
        return len(self.itos)

    def state_dict(self) -> dict:
        return {"itos": list(self.itos)}

    @classmethod
    def from_state_dict(cls, state: dict) -> SmilesTokenizer:
        return cls(state["itos"][2:])


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
    """CSV -> tokenizer fitted on all SMILES -> three tokenized, stratified splits."""
    table = load_table(path, smiles_col, label_col, limit, split_seed)
    tokenizer = SmilesTokenizer.fit(table.smiles)  # SMILES only, no labels: no leak
    full = TokenizedDataset(table.smiles, table.labels, tokenizer)
    train, dev, heldout = stratified_split(table.labels, heldout_frac, dev_frac, split_seed)
    return Splits(full.subset(train), full.subset(dev), full.subset(heldout), tokenizer, table.source)


# ------------------------------------------------------------------------- samplers


class BucketBatchSampler(Sampler[list[int]]):
    """Group the indices of any sampler into batches of similar-length molecules.

    It draws the sampler's order (a DistributedSampler's shard, say), sorts each
    window of ``window`` batches by length, cuts it into batches, and shuffles
    the batch order. So it keeps the wrapped sampler's contract: the same
    indices (disjoint across ranks, covering the data), a new order after
    ``set_epoch``, and the same number of batches on every rank. Short batches
    are cheap batches: an LSTM runs as many steps as its longest molecule.
    """

    def __init__(self, sampler: Sampler[int], lengths: torch.Tensor, batch_size: int,
                 window: int = 32, seed: int = 0):
        self.sampler, self.lengths, self.batch_size = sampler, lengths, batch_size
        self.window, self.seed, self._calls = window, seed, 0

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return math.ceil(len(self.sampler) / self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        # Follow the wrapped sampler's epoch when it has one (DistributedSampler);
        # otherwise each pass is a new epoch.
        epoch = getattr(self.sampler, "epoch", self._calls)
        self._calls += 1
        order = torch.as_tensor(list(self.sampler), dtype=torch.int64)
        span = self.window * self.batch_size
        chunks = [c[torch.argsort(self.lengths[c], stable=True)] for c in order.split(span)]
        batches = torch.cat(chunks).split(self.batch_size)
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        for b in torch.randperm(len(batches), generator=g).tolist():
            yield batches[b].tolist()


class SortedBatchSampler(Sampler[list[int]]):
    """Fixed batches of similar length for evaluation (order does not matter for ROC AUC)."""

    def __init__(self, lengths: torch.Tensor, batch_size: int):
        self.batches = torch.argsort(lengths, stable=True).split(batch_size)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[list[int]]:
        for b in self.batches:
            yield b.tolist()


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
