"""A batch owns its ids: refilling the caller's buffers after a lookup or an enqueue changes
nothing (fault injection of docs/reliability.md, "Wrong results").

Every kind of input buffer (dense tensors, NumPy arrays and column views, RaggedIds values,
row_splits and weights, sparse COO indices, values and weights) is overwritten in place between
the lookup (or ``enqueue``, or ``prepare``) and the end of the step. The activations and the
updated table must be those of the NumPy model run on the ORIGINAL ids. A RaggedIds whose
row_splits were broken after it was built is refused with a clear error, state unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy_reference as ref
import pytest
import torch
from engine_cases import BACKENDS
from numpy.testing import assert_allclose

import embcore as ec

VOCAB, DIM, LR = 10, 3, 0.5
ROWS = [[(1, 0.5), (4, 2.0)], [], [(7, 1.0), (7, 3.0), (2, 0.25)]]  # (id, weight) per sample
DENSE = [3, 1, 4, 1]


@dataclass
class Case:
    """An input, how to overwrite every buffer it holds, and the samples it meant."""

    features: Any
    weights: Any
    mutate: Callable[[], None]
    samples: list
    combiner: str = "mean"
    sequence: int = 0


def _dense() -> Case:
    ids = torch.tensor(DENSE)
    return Case(ids, None, lambda: ids.fill_(9), [[(i, 1.0)] for i in DENSE])


def _dense_b1() -> Case:
    ids = torch.tensor(DENSE).reshape(-1, 1)
    return Case(ids, None, lambda: ids.fill_(0), [[(i, 1.0)] for i in DENSE])


def _dense_int32() -> Case:  # the dtype conversion already copies: nothing to copy again
    ids = torch.tensor(DENSE, dtype=torch.int32)
    return Case(ids, None, lambda: ids.fill_(9), [[(i, 1.0)] for i in DENSE])


def _numpy() -> Case:
    ids = np.array(DENSE, dtype=np.int64)
    return Case(ids, None, lambda: ids.fill(8), [[(i, 1.0)] for i in DENSE])


def _column_view() -> Case:  # a (B, 26) batch feeds feature f as sparse[:, f], a strided view
    batch = torch.tensor([[5, i, 6] for i in DENSE])
    return Case(batch[:, 1], None, lambda: batch.fill_(2), [[(i, 1.0)] for i in DENSE])


def _ragged() -> Case:
    ids = ec.RaggedIds.from_lists([[i for i, _ in r] for r in ROWS])
    weights = ec.RaggedIds(torch.tensor([w for r in ROWS for _, w in r]), ids.row_splits.clone())

    def mutate() -> None:
        ids.values.fill_(9)
        ids.row_splits.copy_(torch.tensor([0, 5, 0, 1000]))  # out of bounds if still read
        weights.values.fill_(-7.0)
        weights.row_splits.copy_(torch.tensor([0, 0, 0, 0]))

    return Case(ids, weights, mutate, [list(r) for r in ROWS])


def _ragged_sequence() -> Case:
    ids = ec.RaggedIds.from_lists([[i for i, _ in r] for r in ROWS])

    def mutate() -> None:
        ids.values.fill_(9)
        ids.row_splits.copy_(torch.tensor([0, 5, 0, 1000]))

    samples = [[(r[p][0], 1.0)] if p < len(r) else [] for r in ROWS for p in range(2)]
    return Case(ids, None, mutate, samples, combiner="sum", sequence=2)


def _sparse() -> Case:
    entries = [((b, j), i, w) for b, r in enumerate(ROWS) for j, (i, w) in enumerate(r)]
    index = torch.tensor([e[0] for e in entries]).T
    ids = torch.sparse_coo_tensor(
        index, torch.tensor([e[1] for e in entries]), (3, 3), check_invariants=True
    )
    weights = torch.sparse_coo_tensor(
        index.clone(), torch.tensor([e[2] for e in entries]), (3, 3), check_invariants=True
    )

    def mutate() -> None:
        ids._values().fill_(9)
        ids._indices().fill_(0)
        weights._values().fill_(-7.0)
        weights._indices().fill_(0)

    return Case(ids, weights, mutate, [list(r) for r in ROWS])


def _sparse_sequence() -> Case:
    entries = [((b, j), i) for b, r in enumerate(ROWS) for j, (i, _) in enumerate(r)]
    index = torch.tensor([e[0] for e in entries]).T
    ids = torch.sparse_coo_tensor(
        index, torch.tensor([e[1] for e in entries]), (3, 3), check_invariants=True
    )

    def mutate() -> None:
        ids._values().fill_(9)
        ids._indices()[1].fill_(0)

    samples = [[(r[p][0], 1.0)] if p < len(r) else [] for r in ROWS for p in range(2)]
    return Case(ids, None, mutate, samples, combiner="sum", sequence=2)


KINDS = {
    "dense": _dense,
    "dense-b1": _dense_b1,
    "dense-int32": _dense_int32,
    "numpy": _numpy,
    "column-view": _column_view,
    "ragged-weighted": _ragged,
    "ragged-sequence": _ragged_sequence,
    "sparse-weighted": _sparse,
    "sparse-sequence": _sparse_sequence,
}


def _engine(case: Case, backend: str) -> tuple[ec.EmbeddingEngine, np.ndarray]:
    values = (np.arange(VOCAB * DIM, dtype=np.float32).reshape(VOCAB, DIM) - 12) / 9
    table = ec.TableConfig(
        vocabulary_size=VOCAB,
        dim=DIM,
        name="t",
        combiner=case.combiner,
        initializer=lambda shape, dtype: torch.from_numpy(values.copy()),
    )
    feature = ec.FeatureConfig(table=table, max_sequence_length=case.sequence)
    engine = ec.EmbeddingEngine(
        {"f": feature}, optimizer=ec.Adagrad(learning_rate=LR), backend=backend
    )
    return engine, values


def _expected(case: Case, values: np.ndarray, grad: np.ndarray) -> tuple[np.ndarray, ...]:
    """The activations and updated table of the NumPy model on the original ids."""
    acts = ref.lookup(values, case.samples, case.combiner)
    g, touched = ref.row_gradients(VOCAB, DIM, [(case.samples, case.combiner, grad)])
    table = values.astype(np.float64)
    slots = ref.initial_slots("adagrad", {}, VOCAB, DIM)
    ref.apply_update("adagrad", {}, table, slots, g, touched, LR, 1)
    return acts, table


def _run(engine: ec.EmbeddingEngine, case: Case, style: str, grad_of: Callable) -> torch.Tensor:
    """One training step of ``style``, overwriting the inputs after the conversion."""
    features, weights = {"f": case.features}, {"f": case.weights}
    if style == "enqueue":
        engine.enqueue(features, weights=weights)
        case.mutate()
        acts = engine.dequeue()["f"]
        engine.apply_gradients({"f": grad_of(acts)})
    elif style == "prepare":
        prepared = engine.prepare(features, weights=weights)
        case.mutate()
        acts = engine(prepared)["f"]
        (acts * grad_of(acts)).sum().backward()
    else:  # forward: between the lookup and its backward
        acts = engine(features, weights=weights)["f"]
        case.mutate()
        (acts * grad_of(acts)).sum().backward()
    return acts


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("style", ["forward", "enqueue", "prepare"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_refilled_inputs_change_nothing(kind: str, style: str, backend: str) -> None:
    case = KINDS[kind]()
    engine, values = _engine(case, backend)
    rng = np.random.default_rng(len(kind))
    grads: list[torch.Tensor] = []

    def grad_of(acts: torch.Tensor) -> torch.Tensor:
        grads.append(torch.from_numpy(rng.standard_normal(tuple(acts.shape)).astype(np.float32)))
        return grads[-1]

    acts = _run(engine, case, style, grad_of)
    want_acts, want_table = _expected(case, values, grads[0].reshape(-1, DIM).double().numpy())
    assert_allclose(acts.detach().reshape(-1, DIM).numpy(), want_acts, rtol=1e-5, atol=1e-6)
    assert_allclose(engine.embedding_tables["t"].numpy(), want_table, rtol=1e-5, atol=1e-6)
    assert engine.step == 1


def test_a_copy_is_made_only_for_views_of_the_input() -> None:
    """Conversions that already produce fresh tensors are not copied again; views are."""
    table = ec.TableConfig(vocabulary_size=VOCAB, dim=DIM, name="t")
    engine = ec.EmbeddingEngine({"f": ec.FeatureConfig(table=table)})
    ids = torch.tensor(DENSE)
    (batch,) = engine.prepare({"f": ids}).batches
    assert batch.values.untyped_storage().data_ptr() != ids.untyped_storage().data_ptr()
    assert torch.equal(batch.values, ids)
    ragged = ec.RaggedIds.from_lists([[1, 2], [3]])
    (batch,) = engine.prepare({"f": ragged}).batches
    for got, given in ((batch.values, ragged.values), (batch.offsets, ragged.row_splits)):
        assert got.untyped_storage().data_ptr() != given.untyped_storage().data_ptr()
        assert torch.equal(got, given)


@pytest.mark.slow
def test_one_id_per_sample_offsets_are_shared_and_train_after_inference_mode() -> None:
    """Dense ids of one id per sample get ``arange(S + 1)`` offsets, one tensor for every batch
    of that size; a batch of a size first seen under ``torch.inference_mode`` still trains
    through the compiled operators (which save the offsets for their backward)."""
    table = ec.TableConfig(vocabulary_size=VOCAB, dim=DIM, name="t")
    config = {"f": ec.FeatureConfig(table=table), "g": ec.FeatureConfig(table=table)}
    engine = ec.EmbeddingEngine(config, optimizer=ec.SGD(learning_rate=LR))
    with torch.inference_mode():
        engine.prepare({"f": torch.tensor([0, 0, 0]), "g": torch.tensor([0, 0, 0])})
    prepared = engine.prepare({"f": torch.tensor([5, 6, 7]), "g": torch.tensor([1, 2, 3])})
    f, g = prepared.batches
    assert torch.equal(f.offsets, torch.arange(4)) and f.offsets is g.offsets
    before = engine.embedding_tables["t"].detach().clone()
    compiled = torch.compile(engine.stacked, backend="aot_eager", fullgraph=True)
    compiled(prepared).sum().backward()
    moved = (engine.embedding_tables["t"] != before).any(1)
    assert moved.tolist() == [i in (1, 2, 3, 5, 6, 7) for i in range(VOCAB)]


# ------------------------------------------------------- row_splits broken after construction

DECREASE = r"row_splits must never decrease, got row_splits"
BROKEN_SPLITS = [
    pytest.param([0, 3, 1, 5], DECREASE + r"\[2\]=1 < row_splits\[1\]=3", id="decreasing"),
    pytest.param(
        [0, 2, 3, 1000],
        r"row_splits must start at 0 and end at len\(values\)=5, got 0 \.\.\. 1000",
        id="past-end",
    ),
    pytest.param(
        [0, 2, 3, 4],
        r"row_splits must start at 0 and end at len\(values\)=5, got 0 \.\.\. 4",
        id="short",
    ),
    pytest.param([1, 2, 3, 5], r"row_splits must start at 0 .* got 1 \.\.\. 5", id="first-not-0"),
    pytest.param([0, -4, 3, 5], DECREASE + r"\[1\]=-4 < row_splits\[0\]=0", id="negative"),
    pytest.param([0, 2**62, 2, 5], DECREASE + r"\[2\]=2 < ", id="huge"),
]


def _snapshot(engine: ec.EmbeddingEngine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.state_dict().items()}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("style", ["forward", "enqueue", "prepare"])
@pytest.mark.parametrize(("splits", "message"), BROKEN_SPLITS)
def test_row_splits_changed_after_construction_are_refused(
    splits: list[int], message: str, style: str, backend: str
) -> None:
    table = ec.TableConfig(vocabulary_size=VOCAB, dim=DIM, name="t")
    features = {"f": ec.FeatureConfig(table=table), "s": ec.FeatureConfig(table=table)}
    engine = ec.EmbeddingEngine(features, optimizer=ec.Adagrad(learning_rate=LR), backend=backend)
    good = {"f": ec.RaggedIds.from_lists([[1], [2, 3], []]), "s": torch.tensor([1, 2, 3])}
    engine(good)["f"].sum().backward()  # slots away from their initial values
    before = _snapshot(engine)
    ids = ec.RaggedIds.from_lists([[1, 2], [3], [4, 5]])
    weights = ec.RaggedIds(torch.ones(5), ids.row_splits.clone())
    ids.row_splits.copy_(torch.tensor(splits))
    weights.row_splits.copy_(torch.tensor(splits))
    with pytest.raises(ValueError, match="feature 'f': " + message):
        if style == "enqueue":
            engine.enqueue({"f": ids, "s": torch.tensor([1, 2, 3])}, weights={"f": weights})
        elif style == "prepare":
            engine.prepare({"f": ids, "s": torch.tensor([1, 2, 3])}, weights={"f": weights})
        else:
            engine({"f": ids, "s": torch.tensor([1, 2, 3])}, weights={"f": weights})
    assert engine._pending is None
    after = engine.state_dict()
    for key, value in before.items():
        assert torch.equal(after[key], value), key
    engine.enqueue(good)  # still usable
    engine.apply_gradients({k: torch.ones_like(v) for k, v in engine.dequeue().items()})
    assert engine.step == 2


def test_ragged_weights_with_other_splits_after_construction_are_refused() -> None:
    table = ec.TableConfig(vocabulary_size=VOCAB, dim=DIM, name="t")
    engine = ec.EmbeddingEngine({"f": ec.FeatureConfig(table=table)})
    ids = ec.RaggedIds.from_lists([[1, 2], [3]])
    weights = ec.RaggedIds.from_lists([[1.0, 2.0], [3.0]])
    weights.row_splits.copy_(torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match="feature 'f': weights are not aligned"):
        engine({"f": ids}, weights={"f": weights})
