"""The shipped dataset: what dataset/README.md promises, and that it matches qc-B3DB."""

from __future__ import annotations

import importlib.util
from importlib import metadata

import pandas as pd
import pytest

from tests.conftest import REPO, SHIPPED, run_python


def load_maker():
    spec = importlib.util.spec_from_file_location("make_b3db", REPO / "dataset" / "make_b3db.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_table_has_the_documented_shape():
    df = pd.read_csv(SHIPPED)
    assert list(df.columns) == ["name", "p_np", "smiles"]
    assert len(df) == 7807
    assert df["p_np"].value_counts().to_dict() == {1: 4956, 0: 2851}
    assert df["smiles"].notna().all() and df["name"].notna().all()


def test_conversion_maps_b3db_columns():
    tsv = ("NO.\tcompound_name\tIUPAC_name\tSMILES\tCID\tlogBB\tBBB+/BBB-\tInchi\tthreshold\treference\tgroup\tcomments\n"
           "1\taspirin\t\tCC(=O)Oc1ccccc1C(=O)O\t\t\tBBB-\t\t\t\t\t\n"
           "2\t\tethanol\tCCO\t\t\tBBB+\t\t\t\t\t\n"
           "3\t\t\tN\t\t\tBBB+\t\t\t\t\t\n")
    assert load_maker().convert(tsv) == "name,p_np,smiles\naspirin,0,CC(=O)Oc1ccccc1C(=O)O\nethanol,1,CCO\nB3DB-3,1,N\n"


def _has_b3db() -> bool:
    try:
        metadata.distribution("qc-B3DB")
        return True
    except metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(not _has_b3db(), reason="qc-B3DB is not installed (pip install qc-B3DB==1.1.1); .ci/run installs it")
@pytest.mark.timeout(120)
def test_shipped_csv_is_exactly_what_qc_b3db_regenerates():
    proc = run_python([REPO / "dataset" / "make_b3db.py", "--check"], timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "matches qc-B3DB" in proc.stdout
