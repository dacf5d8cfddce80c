"""Ragged inputs of many features converted at once (engine/_dense_batch.py: ragged_batches):
the same batches as the per-feature conversion, owned, and the same errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from batch_cases import assert_same, per_feature, shares_one_copy

import embcore as ec
from embcore._numba.ids import copy_checked_ragged

VOCABS = (10, 30, 7)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def make_engine() -> ec.EmbeddingEngine:
    tables = [
        ec.TableConfig(vocabulary_size=v, dim=4, name=f"t{i}", combiner="mean")
        for i, v in enumerate(VOCABS)
    ]
    config = {f"f{i}": ec.FeatureConfig(table=t) for i, t in enumerate(tables)}
    return ec.EmbeddingEngine(config, optimizer=ec.Adagrad(learning_rate=0.1))


def ragged(rows: int, vocab: int, gen: torch.Generator) -> ec.RaggedIds:
    lengths = torch.randint(0, 4, (rows,), generator=gen)  # empty rows included
    splits = torch.zeros(rows + 1, dtype=torch.int64)
    splits[1:] = torch.cumsum(lengths, 0)
    return ec.RaggedIds(torch.randint(0, vocab, (int(splits[-1]),), generator=gen), splits)


def inputs(rows: int = 6, seed: int = 0) -> dict[str, ec.RaggedIds]:
    gen = torch.Generator().manual_seed(seed)
    return {f"f{i}": ragged(rows, v, gen) for i, v in enumerate(VOCABS)}


@pytest.mark.parametrize(("rows", "seed"), [(6, 0), (1, 1), (0, 2), (40, 3)])
def test_ragged_inputs_give_the_per_feature_batches(rows: int, seed: int) -> None:
    engine, batch = make_engine(), inputs(rows, seed)
    prepared = engine.prepare(batch).batches
    assert shares_one_copy(prepared)  # converted together
    assert_same(list(prepared), per_feature(engine, batch))


def test_batches_do_not_see_later_changes_to_the_inputs() -> None:
    engine, batch = make_engine(), inputs()
    want = per_feature(engine, batch)
    prepared = engine.prepare(batch).batches
    for x in batch.values():
        x.values.zero_()
        x.row_splits.zero_()
    assert_same(list(prepared), want)


def test_a_stacked_step_on_raw_ragged_inputs_equals_one_on_prepared_ones() -> None:
    raw, ahead = make_engine(), make_engine()
    ahead.load_state_dict(raw.state_dict())
    for seed in range(3):
        batch = inputs(5, seed)
        (raw.stacked(batch) ** 2).sum().backward()
        (ahead.stacked(ahead.prepare(batch)) ** 2).sum().backward()
    for name, table in raw.embedding_tables.items():
        assert torch.equal(table, ahead.embedding_tables[name])


@pytest.mark.parametrize("change", ["int32", "strided", "dense", "weights"])
def test_other_inputs_take_the_per_feature_path(change: str) -> None:
    engine, batch = make_engine(), inputs()
    weights = None
    if change == "int32":
        r = batch["f2"]
        batch["f2"] = ec.RaggedIds(r.values.to(torch.int32), r.row_splits)
    elif change == "strided":
        r = batch["f1"]
        batch["f1"] = ec.RaggedIds(r.values.repeat_interleave(2)[::2], r.row_splits)
    elif change == "dense":
        batch["f0"] = torch.tensor([1, 2, 3, 4, 5, 6])
    else:
        weights = {k: ec.RaggedIds(r.values.float(), r.row_splits) for k, r in batch.items()}
    prepared = engine.prepare(batch, weights).batches
    assert not shares_one_copy(prepared)
    if weights is None:
        assert_same(list(prepared), per_feature(engine, batch))


def _corrupt(batch: dict[str, ec.RaggedIds], how: str) -> str:
    """Break feature f1's input in place (after its RaggedIds was built); the error wanted."""
    values, splits = batch["f1"].values, batch["f1"].row_splits
    if how == "id":
        values[-1] = 30
        return rf"feature 'f1': id 30 at position {values.numel() - 1} .* table 't1'"
    if how == "negative":
        values[0] = INT64_MIN
        return "feature 'f1': id -9223372036854775808 at position 0"
    if how == "start":
        splits[0] = 1
        return "feature 'f1': row_splits must start at 0 and end at len"
    if how == "end":
        splits[-1] += 1
        return "feature 'f1': row_splits must start at 0 and end at len"
    splits[2], splits[3] = splits[3] + 1, splits[3]  # decreasing
    return "feature 'f1': row_splits must never decrease, got row_splits"


@pytest.mark.parametrize("how", ["id", "negative", "start", "end", "decreasing"])
def test_a_bad_ragged_input_raises_naming_it_and_changes_nothing(how: str) -> None:
    engine, batch = make_engine(), inputs(6, seed=4)
    batch["f1"].values[:] = 1  # no empty feature: every corruption has a value to break
    before = {k: v.clone() for k, v in engine.embedding_tables.items()}
    want = _corrupt(batch, how)
    with pytest.raises(ValueError, match=want):
        engine.stacked(batch)
    with pytest.raises(ValueError, match=want):
        engine.prepare(batch)
    for k, v in engine.embedding_tables.items():
        assert torch.equal(v, before[k])


# ------------------------------------------------------------------ the copy-and-check kernel
def reference(parts: list[tuple[np.ndarray, np.ndarray]], limits: list[int]) -> int:
    """NumPy: the first feature whose splits or ids are bad, or -1."""
    for f, (values, splits) in enumerate(parts):
        good_splits = splits[0] == 0 and splits[-1] == values.size and np.all(np.diff(splits) >= 0)
        in_range = values.size == 0 or (values.min() >= 0 and values.max() < limits[f])
        if not (good_splits and in_range):
            return f
    return -1


def run_kernel(
    parts: list[tuple[np.ndarray, np.ndarray]], limits: list[int]
) -> tuple[int, np.ndarray, np.ndarray]:
    sources = np.array(
        [(v.ctypes.data, v.size, s.ctypes.data, s.size - 1) for v, s in parts], dtype=np.int64
    )
    values = np.full(sum(v.size for v, _ in parts), -7, dtype=np.int64)
    splits = np.full(sum(s.size for _, s in parts), -7, dtype=np.int64)
    bad = copy_checked_ragged(sources, np.array(limits, dtype=np.int64), values, splits)
    return bad, values, splits


def random_parts(seed: int, limits: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    parts = []
    for limit in limits:
        rows = int(rng.integers(0, 9))
        splits = np.concatenate([[0], np.cumsum(rng.integers(0, 5, rows))]).astype(np.int64)
        parts.append((rng.integers(0, limit, int(splits[-1]), dtype=np.int64), splits))
    return parts


@pytest.mark.parametrize("seed", range(6))
def test_the_kernel_copies_every_feature_in_order(seed: int) -> None:
    limits = [10, 1000, 2**40, 3]
    parts = random_parts(seed, limits)
    bad, values, splits = run_kernel(parts, limits)
    assert bad == reference(parts, limits) == -1
    np.testing.assert_array_equal(values, np.concatenate([v for v, _ in parts]))
    np.testing.assert_array_equal(splits, np.concatenate([s for _, s in parts]))


@pytest.mark.parametrize("seed", range(40))
def test_the_kernel_finds_the_first_bad_feature_as_numpy_does(seed: int) -> None:
    limits = [10, 1000, 7, 50]
    rng = np.random.default_rng(100 + seed)
    parts = random_parts(seed, limits)
    for _ in range(int(rng.integers(1, 3))):  # break one or two features at random
        f = int(rng.integers(0, len(limits)))
        values, splits = parts[f]
        how = int(rng.integers(0, 5))
        if how == 0 and values.size:
            values[rng.integers(0, values.size)] = rng.choice([-1, limits[f], INT64_MIN, INT64_MAX])
        elif how == 1:
            splits[0] = int(rng.integers(1, 3))
        elif how == 2:
            splits[-1] += int(rng.choice([-1, 1]))
        elif how == 3 and splits.size > 2:
            i = int(rng.integers(1, splits.size - 1))
            splits[i] = splits[i + 1] + 1  # above the next: decreasing there
    assert run_kernel(parts, limits)[0] == reference(parts, limits)
