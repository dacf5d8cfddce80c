"""Criteo-format files into the main job's tables: dynamic tables key every raw hash (a row per
distinct id, never folded), fixed tables fold, ``data.raw_ids`` folds in the model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embcore.data import read_criteo_parquet, read_criteo_tsv
from embcore.train.config import load_config
from embcore.train.loop import train

ROWS = 96


def _write_tsv(path: Path, seed: int = 0) -> list[list[str]]:
    """ROWS labeled rows; column ``f`` draws from ``8 + 3 f`` hashes (some empty)."""
    rng = np.random.default_rng(seed)
    cats = []
    lines = []
    for _ in range(ROWS):
        row = []
        for f in range(26):
            k = int(rng.integers(0, 8 + 3 * f))
            # large hashes: folding them into small tables would collide
            row.append("" if k == 0 else f"{(k * 0x9E3779B1 + f * 7919) % 2**32:08x}")
        cats.append(row)
        ints = [str(int(rng.integers(0, 50))) for _ in range(13)]
        lines.append("\t".join([str(int(rng.random() < 0.4)), *ints, *row]))
    path.write_text("\n".join(lines) + "\n")
    return cats


def _distinct(cats: list[list[str]]) -> list[set[int]]:
    return [{int(row[f], 16) if row[f] else -1 for row in cats} for f in range(26)]


def _config(tmp_path: Path, path: Path, source: str, *sets: str):
    return load_config(
        None,
        [
            f"data.source={source}",
            f"data.path={path}",
            f"data.eval_path={path}",
            "data.batch_size=32",
            "data.vocab_cap=16",  # fixed tables far smaller than the distinct hashes
            "model.embedding_dim=4",
            "model.bottom_mlp=[8]",
            "model.top_mlp=[8]",
            f"train.steps={ROWS // 32}",  # one pass over the file
            "train.eval_every=100",
            "train.checkpoint_every=100",
            "train.progress=false",
            "train.plot=false",
            f"train.out_dir={tmp_path / 'run'}",
            *sets,
        ],
    )


@pytest.mark.parametrize("source", ["criteo_tsv", "parquet"])
def test_dynamic_tables_hold_one_row_per_distinct_raw_id(tmp_path: Path, source: str) -> None:
    cats = _write_tsv(tmp_path / "day.tsv")
    path = tmp_path / "day.tsv"
    if source == "parquet":
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        table = {"label": [i % 2 for i in range(ROWS)]}
        table.update({f"I{j + 1}": [1] * ROWS for j in range(13)})
        table.update({f"C{f + 1}": [row[f] or None for row in cats] for f in range(26)})
        path = tmp_path / "day.parquet"
        pq.write_table(pa.table(table), path)
    lines: list[str] = []
    result = train(_config(tmp_path, path, source, "model.tables=dynamic"), echo=lines.append)
    engine = result.model.engine
    expected = _distinct(cats)
    for f in range(26):
        keys = engine.table_keys(f"C{f + 1}").numpy()
        assert sorted(keys.tolist()) == sorted(expected[f]), f"C{f + 1}"
    assert sum(len(s) for s in expected) == sum(
        engine.table_keys(t.name).numel() for t in engine.tables
    )
    assert any(line.startswith("ids: raw 64-bit keys") for line in lines)


def test_readers_give_raw_keys_without_table_sizes(tmp_path: Path) -> None:
    cats = _write_tsv(tmp_path / "day.tsv")
    (batch,) = read_criteo_tsv(tmp_path / "day.tsv", batch_size=ROWS, vocab_sizes=None)
    expected = [[int(c, 16) if c else -1 for c in row] for row in cats]
    assert batch.sparse.numpy().tolist() == expected
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = {"label": [1] * ROWS, **{f"I{j + 1}": [None] * ROWS for j in range(13)}}
    table.update(
        {f"C{f + 1}": [int(row[f], 16) if row[f] else None for row in cats] for f in range(26)}
    )
    pq.write_table(pa.table(table), tmp_path / "day.parquet")
    (batch,) = read_criteo_parquet(tmp_path / "day.parquet", batch_size=ROWS, vocab_sizes=None)
    assert batch.sparse.numpy().tolist() == expected


def test_fixed_tables_fold_and_raw_ids_fold_in_the_model(tmp_path: Path) -> None:
    _write_tsv(tmp_path / "day.tsv")
    lines: list[str] = []
    folded = train(
        _config(tmp_path, tmp_path / "day.tsv", "criteo_tsv", "train.steps=1"), echo=lines.append
    )
    assert folded.model.engine.tables[0].vocabulary_size == 16
    assert any("folded into fixed tables as 1 + value % (rows - 1)" in line for line in lines)
    lines.clear()
    raw = train(
        _config(tmp_path, tmp_path / "day.tsv", "criteo_tsv", "data.raw_ids=true", "train.steps=1"),
        overwrite=True,
        echo=lines.append,
    )
    assert any("folded into fixed tables as id mod rows" in line for line in lines)
    assert raw.model.rows.tolist()[:3] == [16, 16, 16]  # FoldedDLRM: id mod rows
