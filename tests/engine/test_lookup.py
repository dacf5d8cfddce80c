"""Lookups against the NumPy model of docs/semantics.md §2, for every input format and combiner.

Formats: dense ``(B,)``, ``(B, 1)``, ``(B, 2, 1)``; ``torch.sparse_coo_tensor`` of rank 2 and 3
with unsorted and duplicate indices; :class:`embcore.RaggedIds`; with and without weights.
Also sequence features (2.4), ``output_shape`` (2.5), safe lookups (2.8), the worked example
of 2.3 and a batch size that changes between steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy_reference as ref
import pytest
import torch
from engine_cases import (
    BACKENDS,
    Entry,
    dense_samples,
    initializer_from,
    ragged_input,
    ragged_samples,
    ragged_sequence_samples,
    sparse_input,
    sparse_samples,
    sparse_sequence_samples,
    table_values,
)
from numpy.testing import assert_allclose

import embcore as ec

COMBINERS = ["sum", "mean", "sqrtn"]
RTOL, ATOL = 1e-5, 1e-6
VOCAB = 12


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny tensors: thread hand-offs cost more than the work on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_table(
    combiner: str, dim: int = 13, safe_lookup: bool = False, seed: int = 0, vocab: int = VOCAB
) -> tuple[ec.TableConfig, np.ndarray]:
    values = table_values(np.random.default_rng(seed), vocab, dim)
    table = ec.TableConfig(
        vocab,
        dim,
        initializer=initializer_from(values),
        combiner=combiner,
        name="t",
        safe_lookup=safe_lookup,
    )
    return table, values


def lookup(feature: ec.FeatureConfig, backend: str, ids: Any, weights: Any = None) -> np.ndarray:
    """A lookup-only engine (no optimizer) of one feature."""
    engine = ec.EmbeddingEngine(feature, optimizer=None, backend=backend)
    return engine(ids, weights).numpy()


def check(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    assert_allclose(got, expected, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------------- formats


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((6,), torch.int64), ((6, 1), torch.int32), ((3, 2, 1), torch.int64)],
    ids=["B", "B1", "B21"],
)
def test_dense(shape: tuple[int, ...], dtype: torch.dtype, combiner: str, backend: str) -> None:
    """docs/semantics.md §2.2: one id per sample whatever the combiner; ``(B, 1)`` gives
    ``(B, dim)``."""
    table, values = make_table(combiner, dim=5)
    ids = np.random.default_rng(1).integers(VOCAB, size=shape)
    got = lookup(ec.FeatureConfig(table), backend, torch.from_numpy(ids).to(dtype))
    out_shape = shape if len(shape) == 1 else shape[:-1]
    expected = ref.lookup(values, dense_samples(ids), combiner).reshape(*out_shape, 5)
    check(got, expected)
    assert_allclose(got, values[ids.reshape(out_shape)], rtol=0, atol=1e-7)


def test_dense_rejects_weights() -> None:
    table, _ = make_table("mean")
    engine = ec.EmbeddingEngine(ec.FeatureConfig(table))
    with pytest.raises(ValueError, match="dense"):
        engine(torch.tensor([1, 2]), torch.tensor([1.0, 2.0]))


def _rank2_entries(rng: np.random.Generator) -> tuple[list[Entry], tuple[int, int]]:
    """(5, 4): row 0 repeats an id, row 1 is empty, row 3 repeats an index, row 4 (the last)
    is empty: trailing empty rows are kept (pitfall 7)."""
    w = lambda: float(np.float32(rng.uniform(0.2, 2.0)))  # noqa: E731
    entries: list[Entry] = [
        ((0, 0), 3, w()),
        ((0, 2), 3, w()),
        ((0, 3), 7, w()),
        ((2, 1), 11, w()),
        ((3, 1), 5, w()),
        ((3, 1), 0, w()),
        ((3, 0), 9, w()),
    ]
    return entries, (5, 4)


def _rank3_entries(rng: np.random.Generator) -> tuple[list[Entry], tuple[int, int, int]]:
    """(3, 2, 4): samples (b, j); (1, 0) empty, (2, 1) holds a duplicate index."""
    w = lambda: float(np.float32(rng.uniform(0.2, 2.0)))  # noqa: E731
    entries: list[Entry] = [
        ((0, 0, 0), 1, w()),
        ((0, 0, 3), 2, w()),
        ((0, 1, 1), 2, w()),
        ((1, 1, 0), 4, w()),
        ((1, 1, 2), 4, w()),
        ((2, 0, 0), 6, w()),
        ((2, 1, 2), 8, w()),
        ((2, 1, 2), 10, w()),
        ((2, 1, 3), 0, w()),
    ]
    return entries, (3, 2, 4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("rank", [2, 3])
def test_sparse(rank: int, combiner: str, weighted: bool, backend: str) -> None:
    """docs/semantics.md §2.2/§2.3: entries sharing all but the last index are one sample; unsorted
    and duplicate indices are fine; every sample of dense_shape comes back, empty ones as 0."""
    rng = np.random.default_rng(rank)
    entries, shape = _rank2_entries(rng) if rank == 2 else _rank3_entries(rng)
    table, values = make_table(combiner)
    ids, weights = sparse_input(entries, shape, rng, weighted)
    assert not ids.is_coalesced()
    got = lookup(ec.FeatureConfig(table), backend, ids, weights)
    samples = sparse_samples(entries, shape, weighted)
    expected = ref.lookup(values, samples, combiner).reshape(*shape[:-1], 13)
    check(got, expected)
    empty = [i for i, s in enumerate(samples) if not s]
    assert empty
    flat = got.reshape(-1, 13)
    assert np.array_equal(flat[empty], np.zeros((len(empty), 13)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sequence", [0, 3], ids=["pooled", "sequence"])
def test_sparse_entries_in_any_order_without_torch_checks(sequence: int, backend: str) -> None:
    """torch does not check a COO tensor's invariants by default: entries in reverse order,
    with a repeated index, give what the NumPy model gives on the row-major samples."""
    entries = [((0, 0), 3), ((0, 2), 7), ((1, 1), 5), ((1, 1), 2), ((3, 0), 9), ((3, 3), 1)]
    shape = (4, 4)
    table, values = make_table("sum")
    backwards = entries[::-1]
    ids = torch.sparse_coo_tensor(
        torch.tensor([e[0] for e in backwards]).T,
        torch.tensor([e[1] for e in backwards]),
        shape,
        check_invariants=False,
    )
    got = lookup(ec.FeatureConfig(table, max_sequence_length=sequence), backend, ids)
    if sequence:  # sample (row, col) for col < L; the repeated (1, 1) holds both ids
        samples = [
            [(i, 1.0) for (r, c), i in entries if (r, c) == (row, col)]
            for row in range(shape[0])
            for col in range(sequence)
        ]
        expected = ref.lookup(values, samples, "sum").reshape(shape[0], sequence, 13)
    else:
        samples = [[(i, 1.0) for (r, _), i in entries if r == row] for row in range(shape[0])]
        expected = ref.lookup(values, samples, "sum")
    check(got, expected)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_ragged(combiner: str, weighted: bool, backend: str) -> None:
    rng = np.random.default_rng(5)
    w = lambda: float(np.float32(rng.uniform(0.2, 2.0)))  # noqa: E731
    rows = [[(4, w()), (4, w()), (1, w())], [], [(11, w())], [(0, w()), (6, w())], []]
    table, values = make_table(combiner)
    ids, weights = ragged_input(rows, weighted)
    got = lookup(ec.FeatureConfig(table), backend, ids, weights)
    check(got, ref.lookup(values, ragged_samples(rows, weighted), combiner))
    assert np.array_equal(got[[1, 4]], np.zeros((2, 13)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("fmt", ["ragged", "sparse"])
def test_zero_weight_sums(fmt: str, combiner: str, backend: str) -> None:
    """docs/semantics.md §2.2/§2.3, §6 pitfall 10: a zero weight sum (mean) or sum of squares
    (sqrtn) gives 0, like div_no_nan; negative weights pass through outside safe mode."""
    rows = [[(1, 1.0), (2, -1.0)], [(3, 0.0), (4, 0.0)], [(5, 2.0)]]
    table, values = make_table(combiner, dim=5)
    if fmt == "ragged":
        ids, weights = ragged_input(rows)
    else:
        entries = [((b, j), i, w) for b, r in enumerate(rows) for j, (i, w) in enumerate(r)]
        ids, weights = sparse_input(entries, (3, 2), np.random.default_rng(0))
    got = lookup(ec.FeatureConfig(table), backend, ids, weights)
    check(got, ref.lookup(values, rows, combiner))
    assert np.isfinite(got).all()
    assert np.array_equal(got[1], np.zeros(5))
    if combiner == "mean":
        assert np.array_equal(got[0], np.zeros(5))
    else:  # sum: e1 - e2; sqrtn: (e1 - e2) / sqrt(2)
        scale = 1.0 if combiner == "sum" else 1 / np.sqrt(2)
        assert_allclose(got[0], scale * (values[1] - values[2]), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("combiner", "expected"),
    [("sum", [7.0, 9.5]), ("mean", [2.8, 3.8]), ("sqrtn", [3.3955, 4.6082])],
)
@pytest.mark.parametrize("fmt", ["ragged", "sparse"])
def test_spec_worked_example(fmt: str, combiner: str, expected: list[float], backend) -> None:
    """docs/semantics.md §2.3: P[r] = [2r, 2r+1]; row 0 holds ids 1 (weight 2.0) and 3 (weight
    0.5)."""
    table = ec.TableConfig(
        5,
        2,
        initializer=lambda shape, dtype=torch.float32: torch.arange(10, dtype=dtype).reshape(5, 2),
        combiner=combiner,
    )
    if fmt == "ragged":
        ids, weights = ragged_input([[(1, 2.0), (3, 0.5)], []])
    else:
        ids, weights = sparse_input([((0, 0), 1, 2.0), ((0, 1), 3, 0.5)], (2, 2))
    got = lookup(ec.FeatureConfig(table), backend, ids, weights)
    assert_allclose(got[0], expected, rtol=0, atol=5e-5)
    assert np.array_equal(got[1], [0.0, 0.0])
    if combiner == "sqrtn":
        assert_allclose(got[0], np.array([7.0, 9.5]) / np.sqrt(4.25), rtol=1e-6)


# ------------------------------------------------------------------------------- sequences


SEQ_ENTRIES: list[Entry] = [
    # row 0: columns 0, 2 and 5; by column index, 5 >= L is dropped and position 1 is padding
    ((0, 5), 10, 1.0),
    ((0, 2), 2, 1.0),
    ((0, 0), 1, 1.0),
    # row 1: column 1 twice (summed), column 4 dropped
    ((1, 1), 3, 1.0),
    ((1, 4), 11, 1.0),
    ((1, 1), 4, 1.0),
    # row 2: empty
]
SEQ_ROWS = [[(1, 1.0), (2, 1.0), (5, 1.0), (10, 1.0)], [(3, 1.0)], []]
DROPPED = (10, 11)  # ids only in truncated positions


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("fmt", ["ragged", "sparse"])
def test_sequence_lookup(fmt: str, combiner: str, backend: str) -> None:
    """docs/semantics.md §2.4: (B, L, dim); sparse input truncates by column index, ragged by
    position; missing positions are zeros; the table's combiner plays no part."""
    table, values = make_table(combiner)
    feature = ec.FeatureConfig(table, max_sequence_length=3)
    if fmt == "sparse":
        ids, _ = sparse_input(SEQ_ENTRIES, (3, 6), np.random.default_rng(0), weighted=False)
        samples = sparse_sequence_samples(SEQ_ENTRIES, 3, 3)
    else:
        ids, _ = ragged_input(SEQ_ROWS, weighted=False)
        samples = ragged_sequence_samples(SEQ_ROWS, 3)
    got = lookup(feature, backend, ids)
    check(got, ref.lookup(values, samples, "sum").reshape(3, 3, 13))
    if fmt == "sparse":
        check(got[0], np.stack([values[1], np.zeros(13), values[2]]))
        check(got[1], np.stack([np.zeros(13), values[3] + values[4], np.zeros(13)]))
    else:
        check(got[0], values[[1, 2, 5]])
        check(got[1], np.stack([values[3], np.zeros(13), np.zeros(13)]))
    assert np.array_equal(got[2], np.zeros((3, 13)))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["ragged", "sparse"])
def test_sequence_padding_gets_no_gradient(fmt: str, backend: str) -> None:
    """docs/semantics.md §2.4 / §3.1: a gradient of ones on every position moves each kept id by lr
    per occurrence; truncated ids and padded positions (no id, not even id 0) update nothing."""
    table, values = make_table("mean")
    engine = ec.EmbeddingEngine(
        ec.FeatureConfig(table, max_sequence_length=3), ec.SGD(learning_rate=0.5), backend=backend
    )
    if fmt == "sparse":
        ids, _ = sparse_input(SEQ_ENTRIES, (3, 6), np.random.default_rng(0), weighted=False)
        counts = {1: 1, 2: 1, 3: 1, 4: 1}
    else:
        ids, _ = ragged_input(SEQ_ROWS, weighted=False)
        counts = {1: 1, 2: 1, 5: 1, 3: 1}
    engine.enqueue(ids)
    acts = engine.dequeue()
    assert tuple(acts.shape) == (3, 3, 13)
    engine.apply_gradients(torch.ones(3, 3, 13))
    w = engine.embedding_tables["t"]
    for r in range(VOCAB):
        if r in counts:
            assert_allclose(w[r].numpy(), values[r] - 0.5 * counts[r], rtol=RTOL, atol=ATOL)
        else:  # rows 0 (a padding id would land here), the dropped ids and all others
            assert torch.equal(w[r], torch.from_numpy(values[r])), r


@pytest.mark.parametrize("backend", BACKENDS)
def test_sequence_ignores_rank_3_with_a_warning(backend: str) -> None:
    """docs/semantics.md §2.4: rank > 2 sparse input ignores max_sequence_length and combines."""
    table, values = make_table("sum")
    entries, shape = _rank3_entries(np.random.default_rng(3))
    ids, _ = sparse_input(entries, shape, weighted=False)
    with pytest.warns(UserWarning, match="max_sequence_length"):
        got = lookup(ec.FeatureConfig(table, max_sequence_length=2), backend, ids)
    samples = sparse_samples(entries, shape, weighted=False)
    check(got, ref.lookup(values, samples, "sum").reshape(3, 2, 13))


# ---------------------------------------------------------------------------- output_shape


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("ids_shape", "output_shape", "expected"),
    [
        ((6,), [2, 3], (2, 3)),
        ((6, 1), [-1, 3], (2, 3)),
        ((6,), (None, 2), (3, 2)),
        ((3, 2, 1), [6], (6,)),
        ((6,), [3, -1], (3, 2)),
    ],
)
def test_output_shape_dense(ids_shape, output_shape, expected, backend: str) -> None:
    """docs/semantics.md §2.5: the activations take ``output_shape + [dim]``; one None/-1 is
    inferred."""
    table, values = make_table("mean", dim=5)
    ids = np.random.default_rng(2).integers(VOCAB, size=ids_shape)
    feature = ec.FeatureConfig(table, output_shape=output_shape)
    got = lookup(feature, backend, torch.from_numpy(ids))
    check(got, values[ids.reshape(-1)].reshape(*expected, 5))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("output_shape", [[2, 2], [None, 2], [4]])
@pytest.mark.parametrize("fmt", ["ragged", "sparse"])
def test_output_shape_pooled(fmt: str, output_shape, backend: str) -> None:
    """docs/semantics.md §2.5: N == B samples combine as usual, then take the output shape."""
    rows = [[(1, 0.5), (2, 1.5)], [], [(3, 1.0), (3, 2.0), (7, 0.25)], [(4, 1.0)]]
    table, values = make_table("sqrtn", dim=5)
    if fmt == "ragged":
        ids, weights = ragged_input(rows)
    else:
        entries = [((b, j), i, w) for b, r in enumerate(rows) for j, (i, w) in enumerate(r)]
        ids, weights = sparse_input(entries, (4, 3), np.random.default_rng(0))
    feature = ec.FeatureConfig(table, output_shape=output_shape)
    got = lookup(feature, backend, ids, weights)
    shape = (4,) if output_shape == [4] else (2, 2)
    check(got, ref.lookup(values, rows, "sqrtn").reshape(*shape, 5))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("combiner", COMBINERS)
def test_output_shape_multiple_of_ragged_batch_makes_sequences(combiner: str, backend) -> None:
    """docs/semantics.md §2.5 / §6 pitfall 12: prod(output_shape) = k * B turns each ragged row into
    a sequence of length k; weights and combiner are ignored, with a warning for the weights."""
    rows = [[(1, 0.5), (2, 2.0), (5, 3.0), (6, 1.0)], [(3, 0.25)]]
    table, values = make_table(combiner, dim=5)
    feature = ec.FeatureConfig(table, output_shape=[2, 3])
    expected = ref.lookup(values, ragged_sequence_samples(rows, 3), "sum").reshape(2, 3, 5)
    ids, weights = ragged_input(rows)
    check(lookup(feature, backend, ids), expected)
    engine = ec.EmbeddingEngine(feature, backend=backend)
    with pytest.warns(UserWarning, match="ignored"):
        got = engine(ids, weights).numpy()
    check(got, expected)
    feature = ec.FeatureConfig(table, output_shape=[3, 2, 2])  # k = 6 (padding)
    check(
        lookup(feature, backend, ids),
        ref.lookup(values, ragged_sequence_samples(rows, 6), "sum").reshape(3, 2, 2, 5),
    )


def test_output_shape_that_does_not_fit_raises() -> None:
    table, _ = make_table("mean", dim=5)
    ids, _ = ragged_input([[(1, 1.0)], [(2, 1.0)]], weighted=False)
    engine = ec.EmbeddingEngine(ec.FeatureConfig(table, output_shape=[5]))
    with pytest.raises(ValueError, match="output_shape"):
        engine(ids)
    engine = ec.EmbeddingEngine(ec.FeatureConfig(table, output_shape=[4]))
    with pytest.raises(ValueError, match="output_shape"):
        engine(torch.tensor([1, 2, 3]))


# ------------------------------------------------------------------------------ safe lookup


SAFE_ROWS = [
    [(-1, 1.0), (2, 1.0)],  # negative id: always pruned
    [(3, -2.0)],  # negative weight: pruned for mean/sqrtn (row empties -> 0), kept for sum
    [(4, 0.0), (5, 1.0)],  # zero weight: pruned for mean/sqrtn, kept for sum
    [(-3, 1.0)],  # emptied by pruning -> 0
    [(6, 2.0), (7, 0.5)],
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("fmt", ["ragged", "sparse"])
def test_safe_lookup_prunes_as_safe_embedding_lookup_sparse(
    fmt: str, combiner: str, backend: str
) -> None:
    """docs/semantics.md §2.8 / §6 pitfall 8."""
    table, values = make_table(combiner, safe_lookup=True)
    if fmt == "ragged":
        ids, weights = ragged_input(SAFE_ROWS)
    else:
        entries = [((b, j), i, w) for b, r in enumerate(SAFE_ROWS) for j, (i, w) in enumerate(r)]
        ids, weights = sparse_input(entries, (5, 2), np.random.default_rng(1))
    got = lookup(ec.FeatureConfig(table), backend, ids, weights)
    check(got, ref.lookup(values, ref.safe_prune(SAFE_ROWS, combiner), combiner))
    assert np.array_equal(got[3], np.zeros(13))
    if combiner == "sum":
        assert_allclose(got[1], -2.0 * values[3], rtol=RTOL)
    else:
        assert np.array_equal(got[1], np.zeros(13))
        assert_allclose(got[2], values[5], rtol=RTOL, atol=ATOL)  # one id left, weight 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_safe_lookup_dense_and_unweighted(backend: str) -> None:
    """Ids < 0 are pruned in every format (their sample looks up zeros)."""
    table, values = make_table("mean", safe_lookup=True)
    got = lookup(ec.FeatureConfig(table), backend, torch.tensor([[3], [-1], [0]]))
    check(got, np.stack([values[3], np.zeros(13), values[0]]))
    ids, _ = ragged_input([[(-2, 1.0), (4, 1.0), (4, 1.0), (8, 1.0)]], weighted=False)
    got = lookup(ec.FeatureConfig(table), backend, ids)
    check(got[0], (2 * values[4] + values[8]) / 3)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("combiner", COMBINERS)
def test_safe_lookup_pruned_ids_are_not_touched(combiner: str, backend: str) -> None:
    """Pruned ids get no gradient and no update: under weight decay a touched row decays even
    with a zero gradient, a pruned one stays bit-identical."""
    table, values = make_table(combiner, safe_lookup=True)
    opt = ec.SGD(learning_rate=0.1, weight_decay_factor=0.5)
    engine = ec.EmbeddingEngine(ec.FeatureConfig(table), opt, backend=backend)
    ids, weights = ragged_input(SAFE_ROWS)
    engine.enqueue(ids, weights)
    engine.dequeue()
    engine.apply_gradients(torch.zeros(5, 13))
    w = engine.embedding_tables["t"]
    kept = {i for r in ref.safe_prune(SAFE_ROWS, combiner) for i, _ in r}
    assert kept == ({2, 3, 4, 5, 6, 7} if combiner == "sum" else {2, 5, 6, 7})
    for r in range(VOCAB):
        if r in kept:
            assert_allclose(w[r].numpy(), 0.5 * values[r], rtol=RTOL)
        else:
            assert torch.equal(w[r], torch.from_numpy(values[r])), r


@pytest.mark.parametrize("safe_lookup", [False, True])
def test_out_of_range_ids_raise(safe_lookup: bool) -> None:
    """docs/semantics.md §2.9: ids >= vocab always raise; ids < 0 raise unless the lookup is
    safe."""
    table, _ = make_table("sum", safe_lookup=safe_lookup)
    engine = ec.EmbeddingEngine(ec.FeatureConfig(table))
    with pytest.raises(ValueError, match=r"id 12 .*vocabulary_size 12"):
        engine(torch.tensor([1, 12]))
    ids, _ = ragged_input([[(2, 1.0), (-4, 1.0)]], weighted=False)
    if safe_lookup:
        engine(ids)
    else:
        with pytest.raises(ValueError, match=r"id -4 .*safe_lookup"):
            engine(ids)


# ------------------------------------------------------------------- changing batch sizes


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_size_changes_between_steps(backend: str) -> None:
    """Pitfall 3: any batch size, any step; lookups and SGD updates follow the NumPy model."""
    table, values = make_table("mean", dim=5)
    engine = ec.EmbeddingEngine(
        {"bag": ec.FeatureConfig(table), "one": ec.FeatureConfig(table)},
        ec.SGD(learning_rate=0.5),
        backend=backend,
    )
    model = values.astype(np.float64)
    rng = np.random.default_rng(9)
    for batch in (2, 5, 1, 3):
        rows = [
            [(int(rng.integers(VOCAB)), float(np.float32(rng.uniform(0.5, 2)))) for _ in range(k)]
            for k in rng.integers(0, 4, size=batch)
        ]
        dense = rng.integers(VOCAB, size=(batch, 1))
        ids, weights = ragged_input(rows)
        engine.enqueue({"bag": ids, "one": torch.from_numpy(dense)}, {"bag": weights, "one": None})
        acts = engine.dequeue()
        assert acts["bag"].shape == (batch, 5) and acts["one"].shape == (batch, 5)
        check(acts["bag"].detach().numpy(), ref.lookup(model, rows, "mean"))
        check(acts["one"].detach().numpy(), model[dense[:, 0]])
        g_bag = rng.standard_normal((batch, 5)).astype(np.float32)
        g_one = rng.standard_normal((batch, 5)).astype(np.float32)
        engine.apply_gradients({"bag": torch.from_numpy(g_bag), "one": torch.from_numpy(g_one)})
        grad, touched = ref.row_gradients(
            VOCAB, 5, [(rows, "mean", g_bag), (dense_samples(dense), "mean", g_one)]
        )
        ref.apply_update("sgd", {}, model, {}, grad, touched, 0.5, 1)
        check(engine.embedding_tables["t"].numpy(), model)
