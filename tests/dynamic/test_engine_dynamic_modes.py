"""Dynamic tables under the engine's modes: both API styles, pipelining, mixing with fixed
tables, state dicts, the non-finite policy. Each compares two engines that must compute the
same bits (one of them a configuration already checked elsewhere)."""

from __future__ import annotations

import gc
import io
import weakref
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import embcore as ec

DIM = 4


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def dynamic_engine(**options) -> ec.EmbeddingEngine:
    """Two features sharing a dynamic table with admission and eviction, and a sequence
    feature on a second dynamic table with a per-table optimizer."""
    shared = ec.TableConfig(
        None,
        DIM,
        name="shared",
        combiner="sqrtn",
        admission=ec.CountAdmission(min_count=2),
        eviction=ec.Eviction(steps_to_live=3, max_rows=9),
    )
    seq = ec.TableConfig(
        None, DIM, name="seq", optimizer=ec.Adagrad(0.2), eviction=ec.Eviction(max_rows=5)
    )
    features = {
        "a": ec.FeatureConfig(shared),
        "b": ec.FeatureConfig(shared),
        "s": ec.FeatureConfig(seq, max_sequence_length=2),
    }
    return ec.EmbeddingEngine(features, ec.Adam(0.05, lazy_adam=False), **options)


def batch(rng: np.random.Generator, size: int = 5) -> tuple[dict, dict]:
    """Weighted ragged ids on ``a``, dense on ``b``, a ragged sequence on ``s``: keys drawn
    from a small spread of int64 values, so keys repeat, wait for admission and get evicted."""
    pool = np.array([-(2**63), -9, 0, 3, 17, 2**40, 2**63 - 1, 5, -1, 99, 1234], np.int64)
    lengths = rng.integers(0, 4, size=size)
    values = torch.from_numpy(rng.choice(pool, size=int(lengths.sum())))
    splits = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]))
    weights = torch.from_numpy(rng.uniform(0.5, 2.0, size=values.numel()).astype(np.float32))
    seq = torch.from_numpy(rng.choice(pool[:6], size=int(lengths.sum())))
    features = {
        "a": ec.RaggedIds(values, splits),
        "b": torch.from_numpy(rng.choice(pool, size=size)),
        "s": ec.RaggedIds(seq, splits),
    }
    return features, {"a": ec.RaggedIds(weights, splits)}


def grads_for(rng: np.random.Generator, size: int) -> dict:
    shapes = {"a": (size, DIM), "b": (size, DIM), "s": (size, 2, DIM)}
    return {
        f: torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for f, s in shapes.items()
    }


def backward_step(emb: ec.EmbeddingEngine, features, weights, grads) -> dict:
    acts = emb(features, weights)
    sum((acts[f] * grads[f]).sum() for f in grads).backward()
    return {f: a.detach() for f, a in acts.items()}


def tpu_step(emb: ec.EmbeddingEngine, features, weights, grads) -> dict:
    emb.enqueue(features, weights=weights)
    acts = emb.dequeue()
    emb.apply_gradients(grads)
    return {f: a.detach() for f, a in acts.items()}


def assert_same(left: ec.EmbeddingEngine, right: ec.EmbeddingEngine) -> None:
    ls, rs = left.state_dict(), right.state_dict()
    assert list(ls) == list(rs)
    for key in ls:
        assert torch.equal(ls[key], rs[key]), key


def run(engines, steps: int, styles, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        size = int(rng.integers(3, 7))
        features, weights = batch(rng, size)
        grads = grads_for(rng, size)
        outs = [
            style(e, features, weights, grads) for e, style in zip(engines, styles, strict=True)
        ]
        for f in grads:
            assert torch.equal(outs[0][f], outs[1][f]), f


def test_both_api_styles_agree_with_admission_and_eviction() -> None:
    left, right = dynamic_engine(), dynamic_engine()
    run((left, right), 8, (backward_step, tpu_step))
    assert_same(left, right)
    info = left.table_info("shared")
    assert info["step"] == 8 and info["dropped_gradients"] > 0 and 0 < info["rows"] <= 9
    assert left.table_info("seq")["rows"] <= 5


@pytest.mark.parametrize("style", [backward_step, tpu_step], ids=["backward", "apply_gradients"])
def test_pipelined_equals_unpipelined(style) -> None:
    """Pipelined, the pending update is applied before each training lookup of an engine with
    dynamic tables: the same bits as without pipelining."""
    plain, piped = dynamic_engine(), dynamic_engine(pipeline=True)
    assert piped.pipelined
    run((plain, piped), 6, (style, style), seed=1)
    assert_same(plain, piped)


def test_state_dict_carries_a_run_exactly() -> None:
    first, second = dynamic_engine(), dynamic_engine()
    run((first, second), 4, (backward_step, backward_step), seed=2)
    state = first.state_dict()
    assert state["shared.keys"].dtype == torch.int64
    assert state["shared.weight"].shape == (state["shared.keys"].numel(), DIM)
    assert "shared.pending/keys" in state and "shared.freq" in state
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    restored = dynamic_engine()
    restored.load_state_dict(torch.load(buffer))
    assert_same(first, restored)
    # training on from the restored state: admission counts, eviction ages, rows and slots
    # all carried over
    run((second, restored), 4, (backward_step, backward_step), seed=3)
    assert restored.table_info("shared")["step"] == 8


def test_state_dict_errors_load_nothing() -> None:
    emb = dynamic_engine()
    run((emb, dynamic_engine()), 2, (backward_step, backward_step))
    state = emb.state_dict()
    fresh = dynamic_engine()
    del state["seq.weight"]
    with pytest.raises(RuntimeError, match=r"seq\.weight"):
        fresh.load_state_dict(state)
    assert fresh.table_keys("shared").numel() == 0 and fresh.step == 0


def test_mixed_fixed_and_dynamic_tables_equal_all_fixed() -> None:
    def make(dynamic: bool) -> ec.EmbeddingEngine:
        def zeros(shape, dtype=torch.float32):
            return torch.zeros(tuple(shape), dtype=dtype)

        fixed = ec.TableConfig(8, DIM, name="fixed", initializer=zeros)
        other = ec.TableConfig(None if dynamic else 8, DIM, name="other", initializer=zeros)
        features = {
            "x": ec.FeatureConfig(fixed),
            "y": ec.FeatureConfig(other),
            "z": ec.FeatureConfig(other),
        }
        return ec.EmbeddingEngine(features, ec.FTRL(0.1, l1_regularization_strength=0.01))

    rng = np.random.default_rng(4)
    all_fixed, mixed = make(False), make(True)
    for _ in range(4):
        ids = {f: torch.from_numpy(rng.integers(8, size=5)) for f in "xyz"}
        grads = {
            f: torch.from_numpy(rng.standard_normal((5, DIM)).astype(np.float32)) for f in "xyz"
        }
        want = backward_step(all_fixed, ids, None, grads)
        got = tpu_step(mixed, ids, None, grads)
        for f in "xyz":
            assert torch.equal(got[f], want[f]), f
    assert torch.equal(mixed.embedding_tables["fixed"], all_fixed.embedding_tables["fixed"])
    keys = mixed.table_keys("other")
    assert torch.equal(mixed.table_rows("other", keys), all_fixed.embedding_tables["other"][keys])


def test_skipped_step_is_no_step_boundary() -> None:
    emb = dynamic_engine(non_finite_gradients="skip")
    rng = np.random.default_rng(5)
    features, weights = batch(rng, 4)
    grads = grads_for(rng, 4)
    grads["b"][0, 0] = float("nan")
    before = emb.table_info("seq")
    backward_step(emb, features, weights, grads)
    assert emb.skipped_steps == 1 and emb.step == 0
    info = emb.table_info("seq")
    # the training lookup admitted its keys; without an update there was no step boundary
    assert info["rows"] > before["rows"] and info["step"] == 0


def test_load_dynamic_state_validates_before_changing_anything() -> None:
    emb = dynamic_engine()
    run((emb, dynamic_engine()), 3, (backward_step, backward_step))
    t = next(t.index for t in emb.tables if t.name == "shared")
    state = emb.store.dynamic_state(t)
    assert list(state["keys"]) == emb.table_keys("shared").tolist()
    assert torch.equal(state["weight"], emb.table_rows("shared", torch.from_numpy(state["keys"])))
    before = emb.state_dict()
    for broken in (
        {k: v for k, v in state.items() if k != "freq"},
        state | {"weight": state["weight"][:-1]},
        state | {"keys": state["keys"][::-1].copy()},
    ):
        with pytest.raises(ValueError, match="table 'shared'"):
            emb.store.load_dynamic_state(t, broken)
    after = emb.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_table_without_optimizer_serves_a_loaded_state() -> None:
    trained = dynamic_engine()
    run((trained, dynamic_engine()), 3, (backward_step, backward_step))
    shared = ec.TableConfig(None, DIM, name="shared", combiner="sqrtn")
    seq = ec.TableConfig(None, DIM, name="seq")
    serving = ec.EmbeddingEngine(
        {
            "a": ec.FeatureConfig(shared),
            "b": ec.FeatureConfig(shared),
            "s": ec.FeatureConfig(seq, max_sequence_length=2),
        }
    )
    state = trained.state_dict()
    with pytest.raises(RuntimeError, match=r"Unexpected key.*shared\.momenta"):
        serving.load_state_dict(state)  # the optimizer slots have no place here
    slots = (".momenta", ".velocities", ".accumulators")
    no_slots = {k: v for k, v in state.items() if not k.endswith(slots)}
    with pytest.raises(RuntimeError, match=r"Unexpected key.*shared\.pending/keys"):
        serving.load_state_dict(no_slots)  # nor the pending counts (no admission here)
    serving.load_state_dict({k: v for k, v in no_slots.items() if ".pending/" not in k})
    features, weights = batch(np.random.default_rng(9), 6)
    trained.eval()
    want = trained(features, weights)
    got = serving(features, weights)  # training mode, but without optimizers: a plain lookup
    for f in want:
        assert torch.equal(got[f], want[f]), f
    assert torch.equal(serving.table_keys("shared"), trained.table_keys("shared"))


@pytest.mark.parametrize("pipeline", [False, True])
def test_a_dynamic_engine_is_freed_when_its_last_reference_goes(pipeline: bool) -> None:
    emb = dynamic_engine(pipeline=pipeline)
    run((emb, dynamic_engine()), 3, (tpu_step, backward_step))
    emb.flush()
    refs = [weakref.ref(emb), weakref.ref(emb.store)]  # the store holds the tables
    gc.disable()  # freed by reference counting alone, not by a collector pass
    try:
        del emb
        assert [r() for r in refs] == [None, None]
    finally:
        gc.enable()


def test_pipelined_updates_use_their_own_lookups_rows_with_a_reused_prepared_batch() -> None:
    """Pipelined, step N+1's lookup runs before step N's update; with the same prepared
    batch in both, step N's update still drops the gradient of a key that was pending in
    step N and admitted in step N+1."""

    def make() -> ec.EmbeddingEngine:
        table = ec.TableConfig(
            None, DIM, name="t", combiner="sum", admission=ec.CountAdmission(min_count=2)
        )
        return ec.EmbeddingEngine(ec.FeatureConfig(table), ec.SGD(1.0), pipeline=True)

    reused, fresh = make(), make()
    ids = torch.tensor([1, 2, 2, 3])
    prepared = reused.prepare(ids)
    for _ in range(3):
        reused(prepared).sum().backward()
        fresh(fresh.prepare(ids)).sum().backward()
    reused.flush()
    fresh.flush()
    assert_same(reused, fresh)
    # 1 and 3 were pending in step 0: their first gradient was dropped, as 2's never was
    assert fresh.table_info("t")["dropped_gradients"] == 2
