"""The default initializer: any row range equals those rows of the full table, and a small
table draws only its own rows."""

from __future__ import annotations

import torch

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
