"""The SMILES tokenizer: one token per atom or bond symbol, a vocabulary fitted on the data."""

from __future__ import annotations

import re
from collections.abc import Sequence

from workshop_lib.errors import InputError

# One token per atom or bond symbol: bracket atoms ([nH], [C@@H], [N+]) and the
# two-letter halogens Cl and Br stay whole; ring closures %NN are one token.
SMILES_TOKEN = re.compile(
    r"\[[^\[\]\n]+\]|Br|Cl|Si|Se|se|As|Na|Li|[BCNOPSFIKHbcnops]|%\d{2}|\d|[=#\-+\\/().:~@?*$>]"
)


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
            while m := SMILES_TOKEN.match(smiles, pos):  # to the first character no token starts with
                pos = m.end()
            where = f" in row {row + 2}" if row is not None else ""
            raise InputError(f"SMILES {smiles[:60]!r}{where} has a character the tokenizer does not know: "
                                f"{smiles[pos]!r} at position {pos}; fix or remove that molecule")
        return tokens

    @classmethod
    def fit(cls, smiles: Sequence[str]) -> SmilesTokenizer:
        # One pass of the pattern over all the molecules at once: a newline is no SMILES character, so when the
        # tokens cover every character but the separators, every molecule is whole tokens. Otherwise the
        # molecule-by-molecule pass finds the first bad one and names it.
        text = "\n".join(smiles)
        tokens = SMILES_TOKEN.findall(text)
        if sum(map(len, tokens)) != len(text) - max(len(smiles) - 1, 0):
            tokens = [t for i, s in enumerate(smiles) for t in cls.split(s, i)]
        return cls(sorted(set(tokens)))  # sorted: the same data gives the same ids

    def encode(self, smiles: str, row: int | None = None) -> list[int]:
        return [self.stoi.get(t, self.UNK) for t in self.split(smiles, row)]

    def __len__(self) -> int:
        return len(self.itos)
