"""Property-based fuzzing of engine inputs (issue 8): every input gets a correct result or a
clear error naming the feature, and an error leaves tables and slots unchanged.

Sparse COO inputs are also built the way torch builds them by default, without checking their
invariants: entries shuffled, indices repeated, negative or outside a dense_shape drawn too
small.

The oracle is independent: validity is decided here from the raw input, and results are
compared with the NumPy model of ``numpy_reference`` (docs/semantics.md §2).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from numpy_reference import lookup, safe_prune

import embcore as ec

FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)

ID = st.one_of(
    st.integers(-3, 12),
    st.sampled_from([-(2**40), 2**40, 2**62]),
)
WEIGHT = st.one_of(
    st.floats(-2, 2, allow_nan=False, width=32),
    st.floats(-2, 2, allow_nan=False),  # often not exactly a float32
    st.sampled_from([0.0, float("nan"), float("inf"), -float("inf")]),
)


@st.composite
def cases(draw):
    vocab = draw(st.integers(1, 10))
    dim = draw(st.integers(1, 4))
    combiner = draw(st.sampled_from(["sum", "mean", "sqrtn"]))
    safe = draw(st.booleans())
    kind = draw(st.sampled_from(["dense", "dense_b1", "ragged", "sparse", "sparse_unchecked"]))
    rows = draw(st.lists(st.lists(ID, min_size=0, max_size=4), min_size=0, max_size=5))
    if kind.startswith("dense"):
        rows = [[draw(ID)] for _ in rows]
    weighted = kind in ("ragged", "sparse", "sparse_unchecked") and draw(st.integers(0, 3)) > 0
    weights = [[draw(WEIGHT) for _ in r] for r in rows] if weighted else None
    misalign = weighted and bool(rows) and draw(st.integers(0, 3)) == 0
    id_dtype = draw(st.sampled_from([torch.int64, torch.int32, torch.float32]))
    weight_dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    fault = None
    if kind == "sparse_unchecked":
        faults = ["shuffle", "repeat", "negative", "shrink_rows", "shrink_cols"]
        fault = draw(st.sampled_from(faults))
        fault = (fault, draw(st.integers(0, 2**16)))
    return vocab, dim, combiner, safe, kind, rows, weights, misalign, id_dtype, weight_dtype, fault


def coo_layout(rows, fault):
    """Entry indices, dense_shape and entry order of a rank-2 COO tensor, with ``fault``."""
    idx = [[r, c] for r, row in enumerate(rows) for c in range(len(row))]
    shape = [len(rows), max([len(r) for r in rows] + [1])]
    order = list(range(len(idx)))
    if fault is None:
        return idx, tuple(shape), order
    what, seed = fault
    rng = np.random.default_rng(seed)
    if what == "shuffle":
        rng.shuffle(order)
    elif what == "repeat":  # an index repeated within its row: two ids of one sample
        same_row = [k for k in range(1, len(idx)) if idx[k][0] == idx[k - 1][0]]
        if same_row:
            k = same_row[int(rng.integers(len(same_row)))]
            idx[k] = list(idx[k - 1])
        rng.shuffle(order)
    elif what == "negative" and idx:
        idx[int(rng.integers(len(idx)))][int(rng.integers(2))] = -int(rng.integers(1, 3))
    elif what == "shrink_rows":
        shape[0] = max(shape[0] - int(rng.integers(1, 3)), 0)
    elif what == "shrink_cols":
        shape[1] = max(shape[1] - 1, 0)
    return idx, tuple(shape), order


def build_input(kind, rows, weights, misalign, id_dtype, weight_dtype, fault=None):
    flat = [i for r in rows for i in r]
    fits = all(abs(i) < 2**31 for i in flat) or id_dtype == torch.int64
    ids_t = torch.tensor(flat, dtype=torch.int64).to(id_dtype) if fits else None
    if ids_t is None:
        return None, None
    w = None
    if weights is not None:
        wflat = [x for r in weights for x in r] + ([1.0] if misalign else [])
        w = torch.tensor(wflat, dtype=torch.float64).to(weight_dtype)
    if kind == "dense":
        return ids_t, None
    if kind == "dense_b1":
        return ids_t.reshape(-1, 1), None
    splits = torch.tensor(
        np.concatenate([[0], np.cumsum([len(r) for r in rows])]), dtype=torch.int64
    )
    if kind == "ragged":
        wr = None
        if w is not None:
            wsplits = splits.clone()
            wsplits[-1] += int(misalign)
            wr = ec.RaggedIds(w, wsplits)
        return ec.RaggedIds(ids_t, splits), wr
    idx, shape, order = coo_layout(rows, fault)
    indices = torch.tensor(idx, dtype=torch.int64).reshape(-1, 2).T[:, order]
    checked = kind == "sparse"
    sp = torch.sparse_coo_tensor(indices, ids_t[order], shape, check_invariants=checked)
    wsp = None
    if w is not None:
        windices = (
            indices
            if not misalign
            else torch.cat([indices, torch.zeros(2, 1, dtype=torch.int64)], 1)
        )
        wvalues = w if misalign else w[order]
        wsp = torch.sparse_coo_tensor(windices, wvalues, shape, check_invariants=checked)
    return sp, wsp


def expected_error(vocab, combiner, safe, rows, weights, misalign, id_dtype, weight_dtype, fault):
    """Why the input is invalid (None if it is valid), decided from the raw values."""
    if id_dtype == torch.float32:
        return "integers"
    if fault is not None:
        idx, shape, _ = coo_layout(rows, fault)
        if any(not 0 <= i < n for index in idx for i, n in zip(index, shape, strict=True)):
            return "outside dense_shape"
    if misalign:
        return "aligned"
    if weights is not None:
        flat = [x for r in weights for x in r]
        if any(not math.isfinite(x) for x in flat):
            return "finite"
        if weight_dtype == torch.float64 and any(float(np.float32(x)) != x for x in flat):
            return "not exactly representable"
    for r, row in enumerate(rows):
        for c, i in enumerate(row):
            w = 1.0 if weights is None else weights[r][c]
            pruned = safe and (i < 0 or (combiner != "sum" and w <= 0))
            if not pruned and not 0 <= i < vocab:
                return "out of range"
    return None


@FUZZ
@given(cases())
def test_any_input_gives_a_correct_result_or_a_clear_error(case):
    vocab, dim, combiner, safe, kind, rows, weights, misalign, id_dtype, weight_dtype, fault = case
    ids, w = build_input(kind, rows, weights, misalign, id_dtype, weight_dtype, fault)
    if ids is None:  # a huge id that int32 cannot hold: nothing to feed
        return
    values = np.arange(vocab * dim, dtype=np.float32).reshape(vocab, dim) / 7
    table = ec.TableConfig(
        vocabulary_size=vocab,
        dim=dim,
        combiner=combiner,
        safe_lookup=safe,
        name="t",
        initializer=lambda shape, dtype: torch.from_numpy(values.copy()),
    )
    emb = ec.EmbeddingEngine({"feat": ec.FeatureConfig(table=table)}, optimizer=ec.Adagrad())
    before = {k: v.clone() for k, v in emb.state_dict().items()}
    why = expected_error(
        vocab, combiner, safe, rows, weights, misalign, id_dtype, weight_dtype, fault
    )
    event(f"{kind}{'' if fault is None else '/' + fault[0]}: {why or 'valid'}")  # statistics
    try:
        acts = emb({"feat": ids}, weights=None if w is None else {"feat": w})["feat"]
    except (ValueError, TypeError) as error:
        assert why is not None, f"valid input rejected: {error}"
        assert "'feat'" in str(error), error
        assert why in str(error), (why, error)
        for key, value in emb.state_dict().items():
            assert torch.equal(value, before[key]), key
        return
    assert why is None, f"invalid input accepted ({why})"
    samples = [
        [
            (i, 1.0 if weights is None else float(np.float32(weights[r][c])))
            for c, i in enumerate(row)
        ]
        for r, row in enumerate(rows)
    ]
    if fault is not None:  # a dense_shape drawn smaller than the rows: only its rows come back
        samples = samples[: coo_layout(rows, fault)[1][0]]
    if safe:
        samples = safe_prune(samples, combiner)
    want = lookup(values, samples, combiner)
    np.testing.assert_allclose(acts.detach().numpy(), want, rtol=1e-5, atol=1e-6)
    # training on it never writes a non-finite value
    (acts**2).sum().backward()
    assert all(
        bool(torch.isfinite(v).all()) for v in emb.state_dict().values() if v.is_floating_point()
    )
