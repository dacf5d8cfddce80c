"""Every record of a disk table's working file carries a CRC-32C of its id and values: one
damaged byte anywhere in a row (weight or optimizer slot) is found when the row is read, with
one error naming the table, the file's directory and the row, and never used."""

from __future__ import annotations

import pytest
import torch
from disk_cases import cache_bytes

import embcore as ec
from embcore.disk import DiskTableError

OPT = ec.Adagrad(learning_rate=0.2)
DIM = 4


def engine(directory) -> ec.EmbeddingEngine:
    table = ec.TableConfig(
        50, DIM, name="t", storage=ec.DiskStorage(directory, cache_bytes(2, DIM, OPT))
    )
    return ec.EmbeddingEngine(ec.FeatureConfig(table), OPT)


def train(e: ec.EmbeddingEngine, ids: list[int]) -> None:
    e(torch.tensor(ids)).pow(2).sum().backward()


@pytest.mark.parametrize(("where", "what"), [(16, "weight"), (16 + 4 * DIM + 2, "slot")])
def test_a_flipped_byte_in_a_row_is_found_when_it_is_read(tmp_path, where, what) -> None:
    e = engine(tmp_path)
    train(e, [1, 2, 3, 4, 5])  # rows 1-3 were written back
    size = e.table_info("t")["bytes_read"] // e.table_info("t")["rows_read"]
    path = tmp_path / "t.rows"
    with open(path, "r+b") as f:  # one bit of row 2's weight or Adagrad slot
        f.seek(2 * size + where)
        byte = f.read(1)
        f.seek(2 * size + where)
        f.write(bytes([byte[0] ^ 0x01]))
    train(e, [1])  # another row reads fine
    with pytest.raises(
        DiskTableError, match=r"table 't': its working file .*records of ids \[2\]"
    ) as err:
        train(e, [2])
    assert str(tmp_path) in str(err.value) and "restore the engine from a checkpoint" in str(
        err.value
    )
    with pytest.raises(DiskTableError, match=r"ids \[2\]"):  # a whole-table read finds it too
        e.embedding_tables["t"]
