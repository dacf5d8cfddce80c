"""Dynamic tables in the engine: admission, eviction, evaluation lookups, initial values and
their order, and every value checked against the NumPy formulas of SGD and Adagrad, with
exact expected key sets."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

import embcore as ec
from embcore.dynamic.init import default_rows

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
DIM = 3


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def engine(
    admission: ec.CountAdmission | None = None,
    eviction: ec.Eviction | None = None,
    optimizer: ec.Optimizer | None = None,
    features: tuple[str, ...] = ("f",),
    **options,
) -> ec.EmbeddingEngine:
    table = ec.TableConfig(
        None, DIM, combiner="sum", name="t", admission=admission, eviction=eviction
    )
    return ec.EmbeddingEngine(
        {f: ec.FeatureConfig(table) for f in features},
        optimizer or ec.SGD(learning_rate=1.0),
        **options,
    )


def init(keys) -> np.ndarray:
    return default_rows(0, "t", np.asarray(keys, np.int64), DIM)


def train(emb: ec.EmbeddingEngine, batch: dict[str, list[int]], grad: float = 1.0) -> dict:
    """One training step, gradient ``grad`` everywhere; returns the activations."""
    acts = emb({f: torch.tensor(v, dtype=torch.int64) for f, v in batch.items()})
    sum(a.sum() for a in acts.values()).mul(grad).backward()
    return {f: a.detach().numpy() for f, a in acts.items()}


def keys(emb: ec.EmbeddingEngine) -> list[int]:
    return emb.table_keys("t").tolist()


def test_the_example_keys_any_int64() -> None:
    emb = engine(optimizer=ec.Adagrad(0.05))
    ids = [8_231_778_211_409, -3, I64_MAX, I64_MIN, 0]
    acts = train(emb, {"f": ids})
    np.testing.assert_array_equal(acts["f"], init(ids))
    assert keys(emb) == sorted(ids)
    assert emb.table_rows("t", torch.tensor(ids)).shape == (5, DIM)
    assert "t: dynamic x3" in repr(emb)


def test_count_admission_across_shared_features_pending_reads_zero_gradient_dropped() -> None:
    emb = engine(admission=ec.CountAdmission(min_count=2), features=("f", "g"))
    # step 0: 5 occurs twice (once per feature): admitted, read at once; 7 pending
    acts = train(emb, {"f": [5, 7], "g": [5]})
    np.testing.assert_array_equal(acts["f"], np.stack([init([5])[0], np.zeros(DIM)]))
    np.testing.assert_array_equal(acts["g"], init([5]))
    assert keys(emb) == [5]
    # SGD(1) with gradient 1 per occurrence: row 5 moved by its two occurrences; 7's dropped
    np.testing.assert_array_equal(
        emb.table_rows("t", [5, 7]), np.stack([init([5])[0] - 2, [0] * 3])
    )
    assert emb.table_info("t") == {"rows": 1, "pending": 1, "dropped_gradients": 1, "step": 1}
    # step 1: 7 reaches 2 (admitted); 9 occurs twice in one lookup (admitted); 11 once
    acts = train(emb, {"f": [7, 9, 11], "g": [9]})
    np.testing.assert_array_equal(acts["f"], np.stack([*init([7, 9]), np.zeros(DIM)]))
    assert keys(emb) == [5, 7, 9]
    np.testing.assert_array_equal(emb.table_rows("t", [9]), init([9]) - 2)
    assert emb.table_info("t")["dropped_gradients"] == 2
    # the sink row the pending keys read stays zero
    assert float(emb.store.rows[0].weight[0].abs().sum()) == 0.0


def test_evaluation_lookups_neither_insert_nor_count_nor_refresh() -> None:
    emb = engine(admission=ec.CountAdmission(min_count=2), eviction=ec.Eviction(steps_to_live=1))
    train(emb, {"f": [1, 1]})  # 1 admitted in step 0
    emb.eval()
    for _ in range(3):
        out = emb({"f": torch.tensor([1, 4, 4])})["f"]
        np.testing.assert_array_equal(out.numpy()[1:], np.zeros((2, DIM)))
    with torch.no_grad():
        emb.train()
        emb({"f": torch.tensor([4])})
    emb.enqueue({"f": torch.tensor([4, 4])}, training=False)
    emb.dequeue()
    assert keys(emb) == [1]
    assert emb.table_info("t")["pending"] == 0  # 4 was never counted
    emb.train()
    train(emb, {"f": [4]})  # step 1: one occurrence of 4 in training: still pending
    # 1 was last looked up for training in step 0: gone at the end of step 1, though
    # evaluation read it since
    assert keys(emb) == []
    assert emb.table_info("t")["pending"] == 1
    train(emb, {"f": [4]})
    assert keys(emb) == [4]


def test_initializer_called_per_lookup_in_ascending_key_order() -> None:
    calls: list[tuple[int, ...]] = []

    def numbered(shape, dtype=torch.float32):
        calls.append(tuple(shape))
        base = 100.0 * len(calls)
        return base + torch.arange(shape[0] * shape[1], dtype=dtype).reshape(shape)

    table = ec.TableConfig(None, 2, initializer=numbered, combiner="sum", name="t")
    emb = ec.EmbeddingEngine({"f": ec.FeatureConfig(table)}, ec.SGD(0.0))
    out = emb({"f": torch.tensor([30, -4, 10, 30])})["f"]
    assert calls == [(3, 2)]
    # ascending keys -4, 10, 30 take rows 0, 1, 2 of the call
    np.testing.assert_array_equal(
        out.detach().numpy(), [[104, 105], [100, 101], [102, 103], [104, 105]]
    )
    out.sum().backward()
    emb.eval()
    emb({"f": torch.tensor([77])})
    assert calls == [(3, 2)]  # evaluation admits nothing
    emb.train()
    emb({"f": torch.tensor([10, 50, 10])})["f"].sum().backward()
    assert calls == [(3, 2), (1, 2)]
    emb({"f": torch.tensor([10])})["f"].sum().backward()
    assert calls == [(3, 2), (1, 2)]  # nothing new: not called


def test_steps_to_live_boundary() -> None:
    emb = engine(eviction=ec.Eviction(steps_to_live=2))
    train(emb, {"f": [1, 2]})  # step 0
    assert keys(emb) == [1, 2]
    train(emb, {"f": [2]})  # step 1
    assert keys(emb) == [1, 2]
    train(emb, {"f": [3]})  # step 2: 1 was last seen in step 0 = 2 - 2
    assert keys(emb) == [2, 3]
    train(emb, {"f": [3]})  # step 3: 2 was last seen in step 1
    assert keys(emb) == [3]


def test_max_rows_least_frequent_then_least_recent_then_smallest_key() -> None:
    emb = engine(eviction=ec.Eviction(max_rows=2))
    train(emb, {"f": [30, 20, 10, 20]})  # freq 10:1 20:2 30:1, all last seen 0: 10 goes
    assert keys(emb) == [20, 30]
    train(emb, {"f": [40]})  # 30 (freq 1, seen 0) before 40 (freq 1, seen 1)
    assert keys(emb) == [20, 40]
    # 20:2 (seen 0) 40:3 50:1 60:2 (seen 2): 50, then 20 (less recent than 60) go
    train(emb, {"f": [40, 40, 50, 60, 60]})
    assert keys(emb) == [40, 60]


def test_evicted_key_starts_over_with_the_same_values_and_fresh_slots() -> None:
    opt = ec.Adagrad(learning_rate=0.5, initial_accumulator_value=0.25)
    emb = engine(
        admission=ec.CountAdmission(min_count=2), eviction=ec.Eviction(max_rows=1), optimizer=opt
    )
    acts = train(emb, {"f": [7, 7]})  # 7 admitted, trained with gradient 2 per element
    np.testing.assert_array_equal(acts["f"], init([7, 7]))
    accumulated = 0.25 + 2.0**2
    want = init([7]) - 0.5 * 2.0 / np.sqrt(np.float32(accumulated))
    np.testing.assert_allclose(emb.table_rows("t", [7]), want, rtol=1e-6)
    train(emb, {"f": [8, 8, 8]})  # 8 (freq 3) pushes 7 (freq 2) out; 7's row is freed
    assert keys(emb) == [8]
    # 7 starts over: its count from zero (one occurrence is not enough) ...
    acts = train(emb, {"f": [7, 8]})
    assert keys(emb) == [8] and acts["f"][0].tolist() == [0.0] * DIM
    # ... and when admitted again, it reads its initial values and has fresh slots
    emb.train()
    acts = emb({"f": torch.tensor([7, 7])})
    np.testing.assert_array_equal(acts["f"].detach().numpy(), init([7, 7]))
    assert keys(emb) == [7, 8]
    state = emb.store.dynamic_state(0)
    assert state["keys"].tolist() == [7, 8]
    assert state["accumulators"][0].tolist() == [0.25] * DIM
    assert state["freq"][0] == 3  # one occurrence before, two now


def test_bad_ids_raise_naming_the_feature() -> None:
    emb = engine()
    with pytest.raises(TypeError, match=r"feature 'f'.*float"):
        emb({"f": torch.tensor([1.0, 2.0])})
    with pytest.raises(TypeError, match=r"feature 'f'.*bool"):
        emb({"f": torch.tensor([True])})
    with pytest.raises(TypeError, match=r"feature 'f'.*float64"):
        emb({"f": np.array([3.0])})
    floats = torch.sparse_coo_tensor(
        torch.tensor([[0], [0]]), torch.tensor([2.5]), (1, 2), check_invariants=True
    )
    with pytest.raises(TypeError, match=r"feature 'f'.*float"):
        emb({"f": floats})
    with pytest.raises(TypeError, match=r"feature 'f'.*float"):
        emb({"f": ec.RaggedIds(torch.tensor([1.5]), torch.tensor([0, 1]))})
    assert keys(emb) == []
    with pytest.raises(TypeError, match="table 't'"):
        emb.table_rows("t", torch.tensor([0.5]))
    with pytest.raises(ValueError, match="1-D"):
        emb.table_rows("t", torch.zeros((2, 2), dtype=torch.int64))
    with pytest.raises(ValueError, match=r"'nope' is no table.*\['t'\]"):
        emb.table_keys("nope")


def test_small_integer_dtypes_are_keys() -> None:
    emb = engine()
    for ids in (torch.tensor([255, 3], dtype=torch.uint8), torch.tensor([-7], dtype=torch.int8)):
        emb({"f": ids})["f"].sum().backward()
    train(emb, {"f": [-5]})
    assert keys(emb) == [-7, -5, 3, 255]


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="admission= is for dynamic tables"):
        ec.TableConfig(10, 2, admission=ec.CountAdmission(min_count=2))
    with pytest.raises(ValueError, match=r"eviction must be an embcore.Eviction"):
        ec.TableConfig(None, 2, eviction={"max_rows": 3})
    with pytest.raises(ValueError, match="safe_lookup"):
        ec.TableConfig(None, 2, safe_lookup=True)
    opt = ec.Adagrad(0.1, slot_variable_creation_fn=lambda w, names, inits: {})
    with pytest.raises(ValueError, match="slot_variable_creation_fn"):
        ec.EmbeddingEngine(ec.FeatureConfig(ec.TableConfig(None, 2, name="d")), opt)
    one_rank = ec.sharding.ShardingPlan(1, {"d": ec.sharding.TableShard.table_wise(0)})
    with pytest.raises(ValueError, match=r"table 'd' is a dynamic table.*key_hash"):
        ec.EmbeddingEngine(
            ec.FeatureConfig(ec.TableConfig(None, 2, name="d")), ec.SGD(0.1), plan=one_rank
        )
    with pytest.raises(ValueError, match="'t' is a fixed table"):
        ec.EmbeddingEngine(ec.FeatureConfig(ec.TableConfig(4, 2, name="t"))).table_keys("t")


def test_memory_failure_raises_naming_the_table_and_changes_nothing(monkeypatch) -> None:
    from embcore.rows import keyed as store

    emb = engine(admission=ec.CountAdmission(min_count=2), features=("f", "g"))
    train(emb, {"f": [1, 1, 2], "g": [3]})
    before = (keys(emb), emb.table_info("t"), emb.table_rows("t", [1]).clone())

    def no_memory(*args, **kwargs):
        raise MemoryError("no memory")

    monkeypatch.setattr(store, "_buffers", no_memory)
    with pytest.raises(MemoryError, match=r"table 't'.*rows.*nothing was changed"):
        train(emb, {"f": list(range(100, 140)), "g": [2]})
    assert (keys(emb), emb.table_info("t")) == before[:2]
    assert torch.equal(emb.table_rows("t", [1]), before[2])
    monkeypatch.undo()
    train(emb, {"f": list(range(100, 140)), "g": [2]})
    # 2 reached its second occurrence only now: the failed lookup counted nothing
    assert keys(emb) == [1, 2]


def test_checkpoint_save_and_load_keep_keys_and_rows(tmp_path) -> None:
    """(Checkpoints of dynamic tables are tested in tests/checkpoint/test_dynamic_*.py.)"""
    emb = engine()
    train(emb, {"f": [1, 5, 5]})
    ec.checkpoint.save(emb, str(tmp_path / "ckpt"))
    other = engine()
    ec.checkpoint.load(other, str(tmp_path / "ckpt"))
    assert keys(other) == keys(emb) and keys(emb)
    assert torch.equal(other.table_rows("t", keys(emb)), emb.table_rows("t", keys(emb)))


def test_statistics_record_keys(tmp_path) -> None:
    emb = engine(profile_data_directory=str(tmp_path), profile_sample_rate=1.0)
    train(emb, {"f": [I64_MAX, 5, 5]})
    assert len(emb.write_statistics()) == 1


def test_row_evicted_between_lookup_and_update_gets_no_gradient() -> None:
    emb = engine(eviction=ec.Eviction(max_rows=1))
    first = emb({"f": torch.tensor([1])})["f"]
    second = emb({"f": torch.tensor([2])})["f"]
    assert keys(emb) == [1, 2]
    second.sum().backward()  # step 0 ends: two rows, one allowed; key 1 (smaller) goes
    assert keys(emb) == [2]
    np.testing.assert_array_equal(emb.table_rows("t", [2]), init([2]) - 1)
    first.sum().backward()  # key 1's row was freed: its gradient is dropped
    assert emb.table_info("t")["dropped_gradients"] == 1
    np.testing.assert_array_equal(emb.table_rows("t", [2]), init([2]) - 1)
    assert keys(emb) == [2]
    # the freed row goes to the next new key, re-initialised
    acts = train(emb, {"f": [3]})
    np.testing.assert_array_equal(acts["f"], init([3]))


def test_failing_initializer_never_leaves_an_evicted_keys_values() -> None:
    calls = []

    def flaky(shape, dtype=torch.float32):
        calls.append(tuple(shape))
        if len(calls) == 3:
            return torch.ones((shape[0] + 1, shape[1]))  # the wrong shape
        return torch.full(tuple(shape), float(len(calls)))

    table = ec.TableConfig(None, 2, initializer=flaky, name="t", eviction=ec.Eviction(max_rows=1))
    emb = ec.EmbeddingEngine({"f": ec.FeatureConfig(table)}, ec.SGD(1.0))
    emb({"f": torch.tensor([1])})["f"].sum().mul(3).backward()  # row 0: key 1, now -2
    emb({"f": torch.tensor([2, 2])})["f"].sum().backward()  # key 1 evicted, its row freed
    assert emb.table_keys("t").tolist() == [2]
    with pytest.raises(ValueError, match=r"table 't': initializer returned shape \(2, 2\)"):
        emb({"f": torch.tensor([3])})  # takes key 1's freed row
    assert emb.table_rows("t", [3]).tolist() == [[0.0, 0.0]]


def test_memory_failure_in_one_table_changes_no_table(monkeypatch) -> None:
    from embcore.dynamic import index

    small = ec.TableConfig(None, 2, name="small")
    big = ec.TableConfig(None, 2, name="big")
    emb = ec.EmbeddingEngine(
        {"a": ec.FeatureConfig(small), "z": ec.FeatureConfig(big)}, ec.SGD(0.1)
    )
    real = index._empty

    def limited(shape, dtype):
        if shape > 1000:
            raise MemoryError("no memory")
        return real(shape, dtype)

    monkeypatch.setattr(index, "_empty", limited)
    assert emb.table_names == ["small", "big"]  # the small table is mapped first
    batch = {"a": torch.arange(5), "z": torch.arange(2000)}
    with pytest.raises(MemoryError, match=r"table 'big'.*slots.*unchanged"):
        emb(batch)
    assert emb.table_keys("small").tolist() == [] and emb.table_keys("big").tolist() == []
    monkeypatch.undo()
    emb(batch)
    assert emb.table_keys("small").tolist() == list(range(5))
    assert emb.table_keys("big").numel() == 2000


@pytest.mark.parametrize("combiner", ["mean", "sqrtn"])
def test_a_pending_key_counts_in_the_combiners_denominator(combiner: str) -> None:
    table = ec.TableConfig(
        None, DIM, name="t", combiner=combiner, admission=ec.CountAdmission(min_count=2)
    )
    emb = ec.EmbeddingEngine(ec.FeatureConfig(table), ec.SGD(0.0))
    ids = ec.RaggedIds.from_lists([[5, 5], [5, 7]])  # 5 admitted, 7 pending
    weights = ec.RaggedIds.from_lists([[1.0, 1.0], [2.0, 1.0]])
    out = emb(ids, weights).detach().numpy()
    row = init([5])[0]
    norm = {"mean": [2.0, 3.0], "sqrtn": [np.sqrt(2.0), np.sqrt(5.0)]}[combiner]
    np.testing.assert_allclose(out, [2 * row / norm[0], 2 * row / norm[1]], rtol=1e-6)
