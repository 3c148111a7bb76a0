"""Regenerate ``dataset/b3db_classification.csv`` (package data) from the qc-B3DB package.

The shipped CSV is derived, not hand-edited. This script rebuilds it from the
``B3DB/B3DB_classification.tsv`` file inside the ``qc-B3DB`` distribution and
either writes it or (with ``--check``) verifies the committed copy is unchanged.

    pip install qc-B3DB==1.1.1
    python dataset/make_b3db.py            # rewrite the CSV
    python dataset/make_b3db.py --check    # exit 1 if the committed CSV differs

The ``B3DB`` module is never imported: importing it parses ~70 MB of extended
tables. The TSV is read straight from the installed files, or from a wheel
given with ``--wheel``.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import sys
import zipfile
from importlib import metadata
from pathlib import Path

SOURCE_MEMBER = "B3DB/B3DB_classification.tsv"
HERE = Path(__file__).resolve().parent
TARGET = HERE / "b3db_classification.csv"  # shipped in the wheel as workshop_lib/dataset/ (pyproject.toml)
LABELS = {"BBB+": "1", "BBB-": "0"}


def read_source(wheel: Path | None) -> str:
    """The TSV text, from a wheel file or from the installed distribution."""
    if wheel is not None:
        with zipfile.ZipFile(wheel) as zf:
            return zf.read(SOURCE_MEMBER).decode("utf-8")
    try:
        dist = metadata.distribution("qc-B3DB")
    except metadata.PackageNotFoundError:
        sys.exit("error: qc-B3DB is not installed; run `pip install qc-B3DB==1.1.1` or pass --wheel")
    return Path(dist.locate_file(SOURCE_MEMBER)).read_text(encoding="utf-8")


def convert(tsv_text: str) -> str:
    """B3DB's classification table -> the workshop's ``name,p_np,smiles`` CSV."""
    rows = csv.DictReader(io.StringIO(tsv_text), delimiter="\t")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["name", "p_np", "smiles"])
    for row in rows:
        # Some molecules have no common name; fall back to IUPAC, then to B3DB's id.
        name = row["compound_name"] or row["IUPAC_name"] or f"B3DB-{row['NO.']}"
        writer.writerow([name, LABELS[row["BBB+/BBB-"]], row["SMILES"]])
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify, do not write")
    parser.add_argument("--wheel", type=Path, help="read from this qc-B3DB wheel instead")
    args = parser.parse_args(argv)

    text = convert(read_source(args.wheel))
    digest = hashlib.sha256(text.encode()).hexdigest()
    if args.check:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET.name} differs from qc-B3DB's table; rerun without --check")
            return 1
        print(f"{TARGET.name} matches qc-B3DB (sha256 {digest})")
        return 0
    TARGET.write_text(text, encoding="utf-8")
    n_rows = sum(1 for _ in csv.reader(io.StringIO(text))) - 1
    print(f"wrote {TARGET} ({n_rows} molecules, sha256 {digest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
