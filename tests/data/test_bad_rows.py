"""Malformed rows: ``raise`` names the file and line; ``skip`` reads exactly the well-formed
rows (compared with the same file without the bad rows) and counts each bad row once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embcore.data import read_criteo_parquet, read_criteo_tsv
from embcore.data.bad_rows import BadRows
from embcore.data.batch import capped_vocab_sizes
from embcore.errors import UserError

VOCAB = capped_vocab_sizes(500)
BAD_LINES = {3: "7", 9: "cols", 10: "hash", 17: "int"}  # 1-based line -> how it is broken


def _lines(n: int) -> list[str]:
    rng = np.random.default_rng(11)
    out = []
    for _ in range(n):
        ints = [str(v) for v in rng.integers(0, 90, 13)]
        cats = [f"{v:08x}" for v in rng.integers(0, 2**32, 26)]
        out.append("\t".join([str(rng.integers(0, 2)), *ints, *cats]))
    return out


def _break(line: str, how: str) -> str:
    cols = line.split("\t")
    if how == "7":
        cols[0] = "7"
    elif how == "cols":
        cols = cols[:20]
    elif how == "hash":
        cols[20] = "not-hex"
    else:
        cols[3] = "1.5"
    return "\t".join(cols)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    """A file with malformed lines, and the same file without them."""
    good = _lines(24)
    mixed = [
        _break(line, BAD_LINES[i + 1]) if i + 1 in BAD_LINES else line
        for i, line in enumerate(good)
    ]
    clean = [line for i, line in enumerate(good) if i + 1 not in BAD_LINES]
    (tmp_path / "mixed.tsv").write_text("\n".join(mixed) + "\n")
    (tmp_path / "clean.tsv").write_text("\n".join(clean) + "\n")
    return tmp_path / "mixed.tsv", tmp_path / "clean.tsv"


def _rows(batches) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batches = list(batches)
    cat = lambda name: torch.cat([getattr(b, name) for b in batches])  # noqa: E731
    return cat("dense"), cat("sparse"), cat("labels")


def test_raise_names_the_file_and_the_first_bad_line(files: tuple[Path, Path]) -> None:
    mixed, _ = files
    with pytest.raises(UserError, match=rf"{mixed}:3: the label must be 0 or 1, got '7'"):
        list(read_criteo_tsv(mixed, batch_size=5, vocab_sizes=VOCAB))


@pytest.mark.parametrize("skip_rows", [0, 2, 7])
def test_skip_reads_exactly_the_well_formed_rows(files: tuple[Path, Path], skip_rows: int) -> None:
    mixed, clean = files
    bad = BadRows(skip=True)
    got = _rows(
        read_criteo_tsv(mixed, batch_size=5, vocab_sizes=VOCAB, skip_rows=skip_rows, bad_rows=bad)
    )
    want = _rows(read_criteo_tsv(clean, batch_size=5, vocab_sizes=VOCAB, skip_rows=skip_rows))
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    sizes = [
        b.size
        for b in read_criteo_tsv(mixed, batch_size=5, vocab_sizes=VOCAB, bad_rows=BadRows(True))
    ]
    assert sizes == [5, 5, 5, 5]  # full batches though rows were left out
    if skip_rows == 0:
        assert bad.count == len(BAD_LINES) and bad.first.startswith(f"{mixed}:3:")


def test_a_file_read_twice_counts_each_bad_row_once(files: tuple[Path, Path]) -> None:
    mixed, _ = files
    bad = BadRows(skip=True)
    for _ in range(2):
        list(read_criteo_tsv(mixed, batch_size=5, vocab_sizes=VOCAB, bad_rows=bad))
    assert bad.count == len(BAD_LINES)


def test_parquet_skip_matches_the_clean_rows(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [line.split("\t") for line in _lines(30)]
    labels = [int(r[0]) for r in rows]
    cats = {f"C{i + 1}": [r[14 + i] for r in rows] for i in range(26)}
    labels[4], cats["C2"][11] = 2, "xyz"  # rows 4 and 11 are malformed
    cols = {
        "label": labels,
        **{f"I{i + 1}": [int(r[1 + i]) for r in rows] for i in range(13)},
        **cats,
    }
    pq.write_table(pa.table(cols), tmp_path / "mixed.parquet")
    keep = [i for i in range(30) if i not in (4, 11)]
    clean = {k: [v[i] for i in keep] for k, v in cols.items()}
    pq.write_table(pa.table(clean), tmp_path / "clean.parquet")
    with pytest.raises(UserError, match=r"mixed.parquet: row 4: column label must be 0 or 1"):
        list(read_criteo_parquet(tmp_path / "mixed.parquet", batch_size=8, vocab_sizes=VOCAB))
    bad = BadRows(skip=True)
    for skip_rows in (0, 5):
        got = _rows(
            read_criteo_parquet(
                tmp_path / "mixed.parquet",
                batch_size=8,
                vocab_sizes=VOCAB,
                skip_rows=skip_rows,
                bad_rows=bad,
            )
        )
        want = _rows(
            read_criteo_parquet(
                tmp_path / "clean.parquet", batch_size=8, vocab_sizes=VOCAB, skip_rows=skip_rows
            )
        )
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)
    assert bad.count == 2 and "row 4" in bad.first
