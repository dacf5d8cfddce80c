"""The default initializer: any row range equals those rows of the full table, and a small
table draws only its own rows; the values are pinned to the block formula."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

import embcore as ec
from embcore import initializers
from embcore.initializers import BLOCK_ROWS, initial_rows


def test_row_ranges_equal_the_full_table_across_blocks():
    vocab, dim = BLOCK_ROWS + 1234, 3
    full = initial_rows("t", vocab, dim, None, seed=7)
    assert full.shape == (vocab, dim)
    for start, stop in [(0, 5), (BLOCK_ROWS - 3, BLOCK_ROWS + 4), (vocab - 10, vocab), (0, vocab)]:
        part = initial_rows("t", vocab, dim, None, seed=7, start=start, stop=stop)
        assert torch.equal(part, full[start:stop])
    assert not torch.equal(full, initial_rows("t", vocab, dim, None, seed=8))
    assert not torch.equal(full, initial_rows("u", vocab, dim, None, seed=7))


def test_a_small_table_draws_only_its_rows(monkeypatch):
    drawn = []
    real = torch.nn.init.trunc_normal_

    def spy(tensor, *args, **kwargs):
        drawn.append(tuple(tensor.shape))
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.nn.init, "trunc_normal_", spy)
    rows = initial_rows("tiny", 3, 8, None, seed=0)
    assert drawn == [(3, 8)]
    assert rows.abs().max() <= 2 / 8**0.5  # cut at two standard deviations
    drawn.clear()
    initializers.initial_rows("big", BLOCK_ROWS + 5, 2, None, seed=0, start=BLOCK_ROWS)
    assert drawn == [(5, 2)]  # only the last, partial block


def _formula_rows(seed: int, table: str, vocab: int, dim: int) -> torch.Tensor:
    """The default initializer written out: rows in blocks of 65,536 keyed by the absolute
    block index, each block a truncated normal (std 1/sqrt(dim), cut at 2 std) from a
    generator seeded by blake2b("seed/table/block"), the last block holding only its rows."""
    std = 1 / math.sqrt(dim)
    blocks = []
    for block in range(-(-vocab // 65_536)):
        key = hashlib.blake2b(f"{seed}/{table}/{block}".encode(), digest_size=8).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(key, "little") & ((1 << 63) - 1))
        rows = torch.empty(min(65_536, vocab - 65_536 * block), dim, dtype=torch.float32)
        torch.nn.init.trunc_normal_(rows, mean=0.0, std=std, a=-2 * std, b=2 * std, generator=gen)
        blocks.append(rows)
    return torch.cat(blocks)


@pytest.mark.parametrize("vocab", [1, 3, 1000, 65_536, 2 * 65_536 + 17])
def test_values_equal_the_block_formula_bit_for_bit(vocab):
    expected = _formula_rows(11, "t", vocab, 4)
    assert torch.equal(initial_rows("t", vocab, 4, None, seed=11), expected)
    # any row range, e.g. a shard's, holds exactly those rows, also across block borders
    for start, stop in [(vocab // 3, vocab), (max(vocab - 65_540, 0), vocab - vocab // 4)]:
        part = initial_rows("t", vocab, 4, None, seed=11, start=start, stop=stop)
        assert torch.equal(part, expected[start:stop])


def test_values_do_not_follow_the_default_dtype():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        rows = initial_rows("t", 65_536 + 5, 2, None, seed=3, start=65_530)
    finally:
        torch.set_default_dtype(before)
    assert rows.dtype == torch.float32
    assert torch.equal(rows, _formula_rows(3, "t", 65_536 + 5, 2)[65_530:])


@pytest.mark.parametrize(
    "optimizer",
    [
        None,
        ec.SGD(learning_rate=0.1),
        ec.Adagrad(learning_rate=0.1, initial_accumulator_value=0.25),
        ec.RowwiseAdagrad(learning_rate=0.1, initial_accumulator_value=0.5),
        ec.FTRL(learning_rate=0.1, initial_accumulator_value=0.75),
        ec.Adam(learning_rate=0.1),
    ],
    ids=lambda o: type(o).__name__,
)
def test_slot_values_hold_every_slot_at_its_initial_value(optimizer):
    """The one builder of optimizer slots' starting values (dense, keyed and disk rows, shard
    pieces and checkpoints call it), against the slot specs read directly."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the slots are float32 whatever the default
    try:
        got = initializers.slot_values(optimizer, 5, 3)
    finally:
        torch.set_default_dtype(before)
    specs = optimizer.slot_specs() if optimizer is not None else ()
    assert list(got) == [s.name for s in specs]
    for s in specs:
        expected = np.full((5,) if s.rowwise else (5, 3), s.initial_value, dtype=np.float32)
        assert got[s.name].dtype == torch.float32
        np.testing.assert_array_equal(got[s.name].numpy(), expected)
