"""The div and mod row maps follow docs/semantics.md §4.1 exactly, including empty shards (N <
P)."""

from __future__ import annotations

import pytest
import torch

from embcore.sharding import maps


def spec_div_shard(i: int, n: int, p: int) -> int:
    """docs/semantics.md §4.1's formula, written as stated (q > 0 only)."""
    q, x = divmod(n, p)
    return max(i // (q + 1), (i - x) // q)


def spec_div_local(i: int, n: int, p: int) -> int:
    q, x = divmod(n, p)
    s = spec_div_shard(i, n, p)
    return i % (q + 1) if s < x else (i - x) % q


def layout(n: int, p: int, strategy: str) -> list[list[int]]:
    return [maps.global_ids(s, n, p, strategy).tolist() for s in range(p)]


def test_spec_example_13_ids_over_5_shards():
    assert layout(13, 5, "mod") == [[0, 5, 10], [1, 6, 11], [2, 7, 12], [3, 8], [4, 9]]
    assert layout(13, 5, "div") == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10], [11, 12]]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 12, 13, 64, 101])
@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_div_matches_the_spec_formula(n: int, p: int):
    ids = torch.arange(n)
    shard = maps.shard_of(ids, n, p, "div").tolist()
    local = maps.local_of(ids, n, p, "div").tolist()
    if n >= p:  # the formula divides by q = n // p
        assert shard == [spec_div_shard(i, n, p) for i in range(n)]
        assert local == [spec_div_local(i, n, p) for i in range(n)]
    starts = maps.div_starts(n, p)
    assert starts[0] == 0 and starts[-1] == n
    assert [starts[s] for s in shard] == [i - lo for i, lo in zip(range(n), local, strict=True)]


@pytest.mark.parametrize("strategy", ["div", "mod"])
@pytest.mark.parametrize("n,p", [(1, 1), (2, 3), (3, 5), (7, 2), (7, 3), (13, 5), (100, 7)])
def test_maps_are_bijections_with_the_spec_sizes(strategy: str, n: int, p: int):
    ids = torch.arange(n)
    shard = maps.shard_of(ids, n, p, strategy)
    local = maps.local_of(ids, n, p, strategy)
    sizes = maps.shard_sizes(n, p)
    q, x = divmod(n, p)
    assert sizes == [q + 1 if s < x else q for s in range(p)]  # first N % P shards get one more
    assert sizes == [-(-(n - s) // p) for s in range(p)]  # ceil((N - p) / P)
    for s in range(p):
        held = maps.global_ids(s, n, p, strategy)
        assert held.numel() == sizes[s]
        assert torch.equal(shard[held], torch.full_like(held, s))
        assert torch.equal(local[held], torch.arange(sizes[s]))
    if strategy == "mod":
        assert torch.equal(shard, ids % p) and torch.equal(local, ids // p)


def test_vocabulary_smaller_than_shards_leaves_empty_shards():
    assert maps.shard_sizes(2, 5) == [1, 1, 0, 0, 0]
    for strategy in ("div", "mod"):
        assert layout(2, 5, strategy) == [[0], [1], [], [], []]
        assert maps.shard_of(torch.tensor([0, 1]), 2, 5, strategy).tolist() == [0, 1]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"partition_strategy.*'block'"):
        maps.shard_of(torch.tensor([0]), 4, 2, "block")
    with pytest.raises(ValueError, match="num_shards must be >= 1, got 0"):
        maps.shard_sizes(4, 0)
    with pytest.raises(ValueError, match=r"shard must be in \[0, 2\), got 2"):
        maps.global_ids(2, 4, 2, "div")
