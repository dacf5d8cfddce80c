"""One-id dense inputs of many features converted at once (engine/_dense_batch.py): the same
batches as the per-feature conversion, owned, and the same errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from batch_cases import assert_same, per_feature, shares_one_copy

import embcore as ec
from embcore._numba.ids import copy_checked_ids


def make_engine(safe: bool = False) -> ec.EmbeddingEngine:
    tables = [
        ec.TableConfig(vocabulary_size=v, dim=4, name=f"t{i}", combiner="mean", safe_lookup=safe)
        for i, v in enumerate((10, 30, 7))
    ]
    config = {f"f{i}": ec.FeatureConfig(table=t) for i, t in enumerate(tables)}
    return ec.EmbeddingEngine(config, optimizer=ec.Adagrad(learning_rate=0.1))


def inputs(samples: int = 6) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(samples)
    return {
        f"f{i}": torch.randint(0, v, (samples,), generator=gen) for i, v in enumerate((10, 30, 7))
    }


@pytest.mark.parametrize("samples", [6, 0])
def test_one_id_dense_inputs_give_the_per_feature_batches(samples: int) -> None:
    engine, batch = make_engine(), inputs(samples)
    prepared = engine.prepare(batch).batches
    assert shares_one_copy(prepared)  # converted together
    assert_same(list(prepared), per_feature(engine, batch))


def test_batches_do_not_see_later_changes_to_the_inputs() -> None:
    engine, batch = make_engine(), inputs()
    want = [x.clone() for x in batch.values()]
    prepared = engine.prepare(batch).batches
    for x in batch.values():
        x.zero_()
    for b, w in zip(prepared, want, strict=True):
        assert torch.equal(b.values, w)


def test_an_id_out_of_range_names_its_feature() -> None:
    engine, batch = make_engine(), inputs()
    batch["f1"][3] = 30
    with pytest.raises(ValueError, match=r"feature 'f1': id 30 at position 3 .* table 't1'"):
        engine.prepare(batch)


@pytest.mark.parametrize("change", ["int32", "column", "lengths", "safe_lookup"])
def test_other_inputs_take_the_per_feature_path(change: str) -> None:
    engine, batch = make_engine(safe=change == "safe_lookup"), inputs()
    if change == "int32":
        batch["f2"] = batch["f2"].to(torch.int32)
    elif change == "column":
        batch["f0"] = batch["f0"][:, None]  # (B, 1): one id per sample, another shape
    elif change == "lengths":
        batch["f1"] = batch["f1"][:4]
    prepared = engine.prepare(batch).batches
    assert not shares_one_copy(prepared)
    assert_same(list(prepared), per_feature(engine, batch))


# ------------------------------------------------------------------ the copy-and-check kernel
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def copy_with_kernel(inputs: list[torch.Tensor], limits: list[int]) -> tuple[int, np.ndarray]:
    out = np.full((len(inputs), inputs[0].shape[0]), -7, dtype=np.int64)
    sources = np.array([(x.data_ptr(), x.stride(0)) for x in inputs], dtype=np.int64)
    return copy_checked_ids(sources, np.array(limits, dtype=np.int64), out), out


@pytest.mark.parametrize("layout", ["contiguous", "columns", "expanded"])
def test_the_kernel_copies_every_feature_with_its_stride(layout: str) -> None:
    gen = torch.Generator().manual_seed(3)
    limits = [10, 1000, 2**40]
    block = torch.stack([torch.randint(0, v, (37,), generator=gen) for v in limits], dim=1)
    if layout == "contiguous":
        inputs = [block[:, f].clone() for f in range(3)]
    elif layout == "columns":  # (B, F): feature f's ids F apart
        inputs = [block[:, f] for f in range(3)]
    else:  # one id repeated (stride 0)
        inputs = [block[5, f].expand(37) for f in range(3)]
    first_bad, out = copy_with_kernel(inputs, limits)
    assert first_bad == -1
    np.testing.assert_array_equal(out, np.stack([x.numpy() for x in inputs]))


@pytest.mark.parametrize("bad", [-1, 1000, 1001, INT64_MIN, INT64_MAX])
@pytest.mark.parametrize("position", [0, 20, 36])
@pytest.mark.parametrize("strided", [False, True])
def test_the_kernel_names_the_first_feature_with_an_id_out_of_range(
    bad: int, position: int, strided: bool
) -> None:
    limits = [10, 1000, 7]
    block = torch.tensor([[9, 999, 6]] * 37)  # the largest ids in range, and 0 below
    block[::2] = 0
    block[position, 1] = bad
    block[position, 2] = -5  # also bad, in a later feature

    def features() -> list[torch.Tensor]:
        return [block[:, f] if strided else block[:, f].clone() for f in range(3)]

    assert copy_with_kernel(features(), limits)[0] == 1
    block[position, 1] = 999
    assert copy_with_kernel(features(), limits)[0] == 2


def test_columns_of_one_block_are_converted_together() -> None:
    engine, batch = make_engine(), inputs()
    block = torch.stack(list(batch.values()), dim=1)  # (B, F)
    columns = {name: block[:, f] for f, name in enumerate(batch)}
    prepared = engine.prepare(columns).batches
    assert shares_one_copy(prepared)
    assert_same(list(prepared), per_feature(engine, batch))
    block.zero_()
    assert_same(list(prepared), per_feature(engine, batch))  # a copy, not a view


@pytest.mark.parametrize("bad", [-1, 30, INT64_MIN, INT64_MAX])
def test_a_bad_id_raises_and_changes_nothing(bad: int) -> None:
    engine, batch = make_engine(), inputs()
    before = {k: v.clone() for k, v in engine.state_dict().items()}
    batch["f1"][3] = bad
    with pytest.raises(ValueError, match=rf"feature 'f1': id {bad} at position 3 .* table 't1'"):
        engine.stacked(batch).sum().backward()
    assert engine.step == 0
    for k, v in engine.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_ids_whose_memory_is_not_their_values_are_read_by_value() -> None:
    engine, batch = make_engine(), inputs()
    batch["f1"] = torch._neg_view(batch["f1"] + 1)  # in range in memory, negative as values
    with pytest.raises(ValueError, match=r"feature 'f1': id -\d+ at position 0"):
        engine.prepare(batch)


def test_a_copied_engine_converts_together() -> None:
    engine, batch = make_engine(), inputs()
    copy = pickle.loads(pickle.dumps(engine))
    del copy.__dict__["_dense_plan"]  # as in a pickle of a version without it
    copy = pickle.loads(pickle.dumps(copy))
    prepared = copy.prepare(batch).batches
    assert shares_one_copy(prepared)
    assert_same(list(prepared), per_feature(engine, batch))
