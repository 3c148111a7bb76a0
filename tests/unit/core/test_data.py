"""CSV loading, tokenizer, dataset, split."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from tests.conftest import SHIPPED
from workshop_lib.config import TrainConfig
from workshop_lib.data import Batch, TokenizedDataset, collate, load_splits, load_table
from workshop_lib.errors import InputError
from workshop_lib.split import stratified_split
from workshop_lib.tokenizer import SmilesTokenizer


def test_tokenizer_keeps_multi_character_atoms_whole():
    tokens = SmilesTokenizer.split("ClC(Br)c1cc[nH]c1[C@@H](N)%12")
    assert tokens == ["Cl", "C", "(", "Br", ")", "c", "1", "c", "c", "[nH]", "c", "1", "[C@@H]", "(", "N", ")", "%12"]


def test_tokenizer_round_trips_the_shipped_data():
    smiles = pd.read_csv(SHIPPED)["smiles"].tolist()[:500]
    tok = SmilesTokenizer.fit(smiles)
    assert all("".join(tok.itos[i] for i in tok.encode(s)) == s for s in smiles)
    assert tok.itos[:2] == ["<pad>", "<unk>"]


def test_tokenizer_is_deterministic_and_maps_unseen_tokens_to_unk():
    a, b = SmilesTokenizer.fit(["CCO", "c1ccccc1"]), SmilesTokenizer.fit(["c1ccccc1", "CCO"])
    assert a.itos == b.itos
    assert a.encode("CBr") == [a.stoi["C"], SmilesTokenizer.UNK]


def test_tokenizer_names_an_unknown_character():
    with pytest.raises(InputError, match=r"row 5.*'X' at position 2"):
        SmilesTokenizer.split("CCXC", row=3)


def test_fitting_in_one_pass_gives_the_vocabulary_of_molecule_by_molecule_and_names_the_same_bad_one():
    smiles = load_table(SHIPPED).smiles
    by_molecule = sorted({t for s in smiles for t in SmilesTokenizer.split(s)})
    assert SmilesTokenizer.fit(smiles).itos[2:] == by_molecule
    # An unclosed bracket must not pair with the next molecule's ']' across the separator, even when a skipped
    # character elsewhere makes the lengths add up; nor may a molecule hide a newline.
    for bad, named in ((["CC", "C[N", "H]C!"], r"'C\[N' in row 3 .* '\[' at position 1"),
                       (["CCO", "C\nC"], r"'C\\nC' in row 3 .* '\\n' at position 1")):
        with pytest.raises(InputError, match=named):
            SmilesTokenizer.fit(bad)


def test_bbbp_layout_is_detected(bbbp_style_csv):
    table = load_table(bbbp_style_csv)
    assert table.labels.tolist() == [1, 1, 0, 0]
    assert table.smiles[0] == "[Cl].CC(C)NCC(O)COc1cccc2ccccc12"
    assert "[smiles -> p_np]" in table.source


def test_columns_can_be_named(tmp_path):
    path = tmp_path / "custom.csv"
    path.write_text("mol,crosses\nCCO,1\nc1ccccc1,0\n")
    table = load_table(path, smiles_col="mol", label_col="crosses")
    assert table.labels.tolist() == [1, 0]


def test_a_lone_binary_column_is_taken_as_the_label(tmp_path):
    path = tmp_path / "odd.csv"
    path.write_text("id,SMILES,weight,bbb_plus\n7,CCO,46.1,1\n8,CCN,45.1,0\n")
    assert load_table(path).labels.tolist() == [1, 0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty"),
        ("name,p_np,smiles\n", "no rows"),
        ("name,p_np\na,1\nb,0\n", "no SMILES column"),
        ("name,smiles\na,CCO\nb,CCN\n", "no label column"),
        ("name,p_np,smiles\na,1,CCO\nb,yes,CCN\n", "only 0 and 1, found 'yes' in row 3"),
        ("name,p_np,smiles\na,1,CCO\nb,2,CCN\n", "only 0 and 1"),
        ("name,p_np,smiles\na,1,CCO\nb,1,CCN\n", "single class"),
    ],
)
def test_bad_csvs_name_the_problem(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        load_table(path)


def test_the_csv_reads_as_pandas_reads_it(tmp_path, bbbp_style_csv):
    """The core reads with the standard library's csv; pandas (what it used to use) reads the same molecules."""
    for path in (SHIPPED, bbbp_style_csv):
        table, df = load_table(path), pd.read_csv(path)
        smiles = next(c for c in df.columns if c.lower() == "smiles")
        label = next(c for c in df.columns if c.lower() == "p_np")
        df = df.dropna(subset=[smiles])
        assert table.smiles == df[smiles].astype(str).str.strip().tolist()
        assert table.labels.tolist() == df[label].astype(int).tolist()


def test_the_csv_edge_cases(tmp_path):
    tsv = tmp_path / "data.tsv"
    tsv.write_text("smiles\tp_np\nC(C)O\t1\n\nCCN\t0.0\n")  # tabs found, a blank line skipped, 0.0 is 0
    table = load_table(tsv)
    assert (table.smiles, table.labels.tolist()) == (["C(C)O", "CCN"], [1, 0])
    missing = tmp_path / "missing.csv"
    missing.write_text("smiles,p_np\nCCO,1\n,0\nCCN,0\n")  # the molecule-less row is dropped, as pandas would
    assert load_table(missing).smiles == ["CCO", "CCN"]
    wide = tmp_path / "wide.csv"
    wide.write_text("smiles,p_np\nCCO,1\nCCN,0,extra\n")
    with pytest.raises(InputError, match=r"is not a readable CSV \(row 3 has 3 fields, the header 2\); check the file"):
        load_table(wide)
    no_label = tmp_path / "no_label.csv"
    no_label.write_text("smiles,p_np\nCCO,1\nCCN,\nCCC,0\n")
    with pytest.raises(InputError, match=r"only 0 and 1, found '' in row 3"):
        load_table(no_label)
    latin = tmp_path / "latin.csv"
    latin.write_bytes("smiles,p_np\nCCO,1\nCCN,0\n\xe9,1\n".encode("latin-1"))
    with pytest.raises(InputError, match="is not a readable CSV"):
        load_table(latin)


def test_missing_file_and_oversized_limit(tmp_path, bbbp_style_csv):
    with pytest.raises(InputError, match="not found"):
        load_table(tmp_path / "nope.csv")
    with pytest.raises(InputError, match="--limit 5 is larger than the 4"):
        load_table(bbbp_style_csv, limit=5)


def test_limit_takes_a_seeded_random_subset():
    a, b = load_table(SHIPPED, limit=300, seed=1), load_table(SHIPPED, limit=300, seed=1)
    assert a.smiles == b.smiles and len(a.smiles) == 300
    assert 0 < a.labels.mean() < 1  # the shipped file is sorted by class; a head would not be


def test_split_is_stratified_disjoint_covering_and_reproducible():
    labels = load_table(SHIPPED).labels
    train, dev, held = stratified_split(labels, 0.1, 0.2, seed=1729)
    assert len(set(train) | set(dev) | set(held)) == len(labels) == len(train) + len(dev) + len(held)
    assert abs(len(held) / len(labels) - 0.1) < 0.002
    assert abs(len(dev) / (len(train) + len(dev)) - 0.2) < 0.002
    for part in (train, dev, held):
        assert abs(labels[part].mean() - labels.mean()) < 0.01
    again = stratified_split(labels, 0.1, 0.2, seed=1729)
    assert all(np.array_equal(x, y) for x, y in zip((train, dev, held), again, strict=True))
    other = stratified_split(labels, 0.1, 0.2, seed=7)
    assert not np.array_equal(held, other[2])


SMILES = ["CCO", "c1ccccc1Cl", "N", "CC(=O)Oc1ccccc1C(=O)O"]


def test_an_item_is_the_molecules_tokens_and_its_label():
    tok = SmilesTokenizer.fit(SMILES)
    ds = TokenizedDataset(SMILES, np.array([1, 0, 1, 0]), tok)
    tokens, label = ds[1]
    assert tokens.tolist() == tok.encode("c1ccccc1Cl") and tokens.dtype == torch.int64  # (L,), no padding
    assert label.item() == 0.0 and label.dtype == torch.float32


def test_collate_pads_a_batch_to_its_longest_molecule():
    ds = TokenizedDataset(SMILES, np.array([1, 0, 1, 0]), SmilesTokenizer.fit(SMILES))
    batch = collate([ds[2], ds[1]])
    assert isinstance(batch, Batch)
    tokens, lengths, labels = batch  # as a loader's batches unpack in the scripts' loop
    longest = len(SmilesTokenizer.split("c1ccccc1Cl"))
    assert tokens.shape == (2, longest) and lengths.tolist() == [1, longest] and labels.tolist() == [1.0, 0.0]
    assert tokens[0, 1:].eq(0).all() and torch.equal(tokens[1], ds[1][0])  # padded with 0 after each molecule


def test_a_plain_dataloader_with_a_distributed_sampler_gives_each_rank_its_shard():
    """What steps 2-4 build: disjoint shards that cover the training split, in batches of at most B."""
    splits = load_splits(TrainConfig(limit=300))
    seen = []
    for rank in (0, 1):
        sampler = DistributedSampler(splits.train, num_replicas=2, rank=rank, shuffle=True, seed=0)
        loader = DataLoader(splits.train, batch_size=64, sampler=sampler, collate_fn=collate)
        batches = list(loader)
        assert all(len(labels) <= 64 for _, _, labels in batches)
        seen.append(sum(len(labels) for _, _, labels in batches))
    assert seen == [len(splits.train) // 2] * 2  # 216 molecules: 108 each, none repeated


def test_load_splits_on_shipped_data():
    splits = load_splits(TrainConfig())
    assert (len(splits.train), len(splits.dev), len(splits.heldout)) == (5620, 1406, 781)
    assert splits.train.tokens.dtype == torch.int64
    assert int(splits.train.lengths.max()) == splits.train.tokens.shape[1]
    for part in (splits.dev, splits.heldout):  # sorted by length: a sequential loader pads little
        assert torch.equal(part.lengths, part.lengths.sort(stable=True).values)


def test_a_blank_smiles_is_an_error_naming_its_row(tmp_path):
    path = tmp_path / "blank.csv"
    path.write_text("name,p_np,smiles\na,1,CCO\nb,0,   \nc,1,CCN\n")
    with pytest.raises(InputError, match=r"SMILES column 'smiles' in .* is blank in row 3; fill in"):
        load_table(path)


def test_the_vocabulary_does_not_depend_on_limit():
    """Fitted on the whole table: a quick --limit run builds the same model as a full one."""
    full, quick = load_splits(TrainConfig()), load_splits(TrainConfig(limit=200))
    assert quick.tokenizer.itos == full.tokenizer.itos
    assert len(quick.train) + len(quick.dev) + len(quick.heldout) == 200
    fitted_on_subset = SmilesTokenizer.fit(load_table(SHIPPED, limit=200).smiles)
    assert len(fitted_on_subset) < len(full.tokenizer)  # what --limit used to change
