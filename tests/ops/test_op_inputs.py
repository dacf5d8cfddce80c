"""``torch.ops.embcore.lookup`` / ``update`` called directly, with what no engine conversion
would produce: offsets past the ids, decreasing, negative or not starting at 0 (which made the
kernels read and write outside the batch, abort on a corrupted heap, or spin), ids outside the
table, weights of the wrong length, dtype or value, unknown or foreign combiner codes, the
wrong number of features, gradients of the wrong structure. Each is one ``ValueError`` naming
the operator and the feature, before any kernel runs; tables and slots stay unchanged."""

from __future__ import annotations

import pytest
import torch

import embcore as ec
from embcore.ops import _library


def _engine() -> ec.EmbeddingEngine:
    a = ec.TableConfig(vocabulary_size=20, dim=4, name="a", combiner="mean")
    b = ec.TableConfig(vocabulary_size=30, dim=4, name="b")
    features = {"x": ec.FeatureConfig(a), "y": ec.FeatureConfig(a), "z": ec.FeatureConfig(b)}
    return ec.EmbeddingEngine(features, optimizer=ec.Adagrad(learning_rate=0.5), backend="cpu")


def _good(engine: ec.EmbeddingEngine) -> dict:
    """The operators' arguments for a prepared batch of 3 samples per feature."""
    ragged = ec.RaggedIds.from_lists([[1, 2, 2], [], [5]])
    prepared = engine.prepare({"x": ragged, "y": torch.tensor([3, 4, 5]), "z": ragged})
    batches = prepared.batches
    return {
        "values": [b.values.clone() for b in batches],
        "offsets": [b.offsets.clone() for b in batches],
        "weights": [b.weights for b in batches],
        "combiners": [_library.COMBINERS.index(b.combiner) for b in batches],
        "stacked": False,
    }


def _lookup(engine, args, training=False):
    anchor = torch.zeros(0)
    return torch.ops.embcore.lookup(
        engine._handle, args["values"], args["offsets"], args["weights"], args["combiners"],
        args["stacked"], training, anchor,
    )  # fmt: skip


def _update(engine, args, grads):
    return torch.ops.embcore.update(
        engine._handle, args["values"], args["offsets"], args["weights"], args["combiners"],
        args["stacked"], grads,
    )  # fmt: skip


def _set(args: dict, key: str, f: int, value) -> dict:
    out = {k: list(v) if isinstance(v, list) else v for k, v in args.items()}
    out[key][f] = value
    return out


def _i64(*v: int) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.int64)


#: (case, edit of the good arguments, what the message says)
BAD = [
    ("offsets past the ids", lambda a: _set(a, "offsets", 0, _i64(0, 3, 3, 1_000_000)),
     r"feature 'x': offsets must start at 0 and end at len\(values\)=4, got 0 \.\.\. 1000000"),
    ("offsets decreasing", lambda a: _set(a, "offsets", 0, _i64(0, 3, 1, 4)),
     r"feature 'x': offsets must never decrease, got offsets\[2\]=1 < offsets\[1\]=3"),
    ("offsets negative", lambda a: _set(a, "offsets", 2, _i64(0, -5, 3, 4)),
     r"feature 'z': offsets must never decrease"),
    ("offsets not from 0", lambda a: _set(a, "offsets", 1, _i64(1, 1, 2, 3)),
     r"feature 'y': offsets must start at 0"),
    ("offsets of int32", lambda a: _set(a, "offsets", 1, _i64(0, 1, 2, 3).int()),
     r"feature 'y': offsets must be a 1-D torch.int64 tensor, got torch.int32"),
    ("offsets empty", lambda a: _set(a, "offsets", 1, _i64()),
     r"feature 'y': offsets must be a 1-D integer tensor of length B\+1"),
    ("offsets 2-D", lambda a: _set(a, "offsets", 1, _i64(0, 1, 2, 3).reshape(2, 2)),
     r"feature 'y': offsets must be a 1-D torch.int64 tensor, got torch.int64 of shape \(2, 2\)"),
    ("an id past the table", lambda a: _set(a, "values", 2, _i64(1, 2, 30, 5)),
     r"feature 'z': id 30 at position 2 is out of range for table 'b' with vocabulary_size 30"),
    ("a negative id", lambda a: _set(a, "values", 0, _i64(1, -2, 2, 5)),
     r"feature 'x': id -2 at position 1 is out of range for table 'a'"),
    ("ids of int32", lambda a: _set(a, "values", 1, torch.tensor([3, 4, 5], dtype=torch.int32)),
     r"feature 'y': values must be a 1-D torch.int64 tensor, got torch.int32"),
    ("ids of float", lambda a: _set(a, "values", 1, torch.tensor([3.0, 4.0, 5.0])),
     r"feature 'y': values must be a 1-D torch.int64 tensor, got torch.float32"),
    ("weights too short", lambda a: _set(a, "weights", 0, torch.ones(2)),
     r"feature 'x': 2 weights for 4 ids"),
    ("weights of float64", lambda a: _set(a, "weights", 0, torch.ones(4, dtype=torch.float64)),
     r"feature 'x': weights must be a 1-D torch.float32 tensor, got torch.float64"),
    ("weights NaN", lambda a: _set(a, "weights", 2, torch.tensor([1.0, float("nan"), 1.0, 1.0])),
     r"feature 'z': weights must be finite, got nan at position 1"),
    ("an unknown combiner code", lambda a: _set(a, "combiners", 0, 7),
     r"feature 'x': combiner code 7 is not one of 0\.\.2"),
    ("a negative combiner code", lambda a: _set(a, "combiners", 2, -1),
     r"feature 'z': combiner code -1 is not one of 0\.\.2"),
    ("another feature's combiner", lambda a: _set(a, "combiners", 0, 0),
     r"feature 'x': combiner code 0 \('sum'\) differs from the feature's 'mean' \(code 1\)"),
    ("too few features", lambda a: {**a, "values": a["values"][:2]},
     r"2 features given, the engine has 3"),
    ("too many features", lambda a: {**a, "values": [*a["values"], _i64(1)]},
     r"4 features given, the engine has 3"),
    ("offsets for 2 of 3 features", lambda a: {**a, "offsets": a["offsets"][:2]},
     r"2 offsets given for 3 features"),
    ("combiners for 2 of 3 features", lambda a: {**a, "combiners": a["combiners"][:2]},
     r"2 combiners given for 3 features"),
    ("weights for 2 of 3 features", lambda a: {**a, "weights": a["weights"][:2]},
     r"2 weights given for 3 features"),
    ("stacked, samples differ", lambda a: {**_set(a, "offsets", 1, _i64(0, 1, 2)), "stacked": True,
     "values": [a["values"][0], _i64(3, 4), a["values"][2]]},
     r"feature 'y': stacked needs every feature to have 3 samples of dim 4"),
    ("raw ids with weights", lambda a: {**a, "offsets": []},
     r"raw dense ids \(offsets empty\) take no weights and no combiners"),
]  # fmt: skip


def _state(engine: ec.EmbeddingEngine) -> list[torch.Tensor]:
    tables = [t.clone() for t in engine.embedding_tables.values()]
    slots = [s.clone() for t in engine.slot_variables.values() for s in t.values()]
    return [*tables, *slots, torch.tensor(engine.step)]


@pytest.mark.parametrize(("case", "edit", "message"), BAD, ids=[c for c, _, _ in BAD])
def test_a_bad_operator_argument_is_one_clear_error(case, edit, message) -> None:
    engine = _engine()
    good = _good(engine)
    _lookup(engine, good)  # the good arguments work
    args = edit(good)
    before = _state(engine)
    with pytest.raises(ValueError, match=r"embcore::lookup: .*" + message):
        _lookup(engine, args, training=True)
    stacked = args["stacked"]
    grads = [torch.ones(3, 3, 4)] if stacked else [torch.ones(3, 4) for _ in range(3)]
    with pytest.raises(ValueError, match=r"embcore::update: .*" + message):
        _update(engine, args, grads)
    assert all(torch.equal(a, b) for a, b in zip(before, _state(engine), strict=True))


def test_gradients_of_the_wrong_structure_are_refused() -> None:
    engine = _engine()
    good = _good(engine)
    before = _state(engine)
    with pytest.raises(ValueError, match=r"embcore::update: 2 gradients given for 3 features"):
        _update(engine, good, [torch.ones(3, 4)] * 2)
    stacked = {**good, "stacked": True}
    with pytest.raises(ValueError, match=r"the stacked gradient must have shape \(3, 3, 4\), got"):
        _update(engine, stacked, [torch.ones(3, 2, 4)])
    with pytest.raises(ValueError, match=r"stacked takes one gradient, got 3"):
        _update(engine, stacked, [torch.ones(3, 4)] * 3)
    assert all(torch.equal(a, b) for a, b in zip(before, _state(engine), strict=True))
    _update(engine, good, [torch.ones(3, 4)] * 3)  # the good arguments update
    assert engine.step == 1


def test_the_checked_operators_still_match_the_engine() -> None:
    """A direct call with good arguments gives the engine's own activations."""
    engine = _engine()
    good = _good(engine)
    ragged = ec.RaggedIds.from_lists([[1, 2, 2], [], [5]])
    with torch.no_grad():
        want = engine({"x": ragged, "y": torch.tensor([3, 4, 5]), "z": ragged})
    got = _lookup(engine, good)
    for name, act in zip(("x", "y", "z"), got, strict=True):
        torch.testing.assert_close(act, want[name], rtol=0, atol=0)


def test_a_lookup_only_engine_refuses_training_and_updates() -> None:
    table = ec.TableConfig(vocabulary_size=10, dim=2, name="a", safe_lookup=True)
    engine = ec.EmbeddingEngine({"x": ec.FeatureConfig(table)}, optimizer=None)
    args = {"values": [_i64(1, 2)], "offsets": [_i64(0, 1, 2)], "weights": [None],
            "combiners": [1], "stacked": False}  # fmt: skip
    before = _state(engine)
    with pytest.raises(RuntimeError, match=r"embcore::update: tables \['a'\] have no optimizer"):
        _update(engine, args, [torch.ones(2, 2)])
    with pytest.raises(RuntimeError, match=r"embcore::lookup \(training\): tables \['a'\] have no"):
        _lookup(engine, args, training=True)
    assert all(torch.equal(a, b) for a, b in zip(before, _state(engine), strict=True))
    assert _lookup(engine, args)[0].shape == (2, 2)
    # the operators take ids already pruned: no advice to turn on what is on
    with pytest.raises(ValueError, match=r"ids must be in \[0, 10\)$"):
        _lookup(engine, _set(args, "values", 0, _i64(-1, 2)))


def _dense(engine: ec.EmbeddingEngine, ids: torch.Tensor) -> dict:
    """The operators' arguments for dense ids prepared, one per sample: each feature's ids a
    row of one ``(F, B)`` copy, all features sharing one offsets tensor (what the checks read
    in one pass)."""
    prepared = engine.prepare({"x": ids[0], "y": ids[1], "z": ids[2]})
    batches = prepared.batches
    assert batches[0].values.data_ptr() + 8 * ids.shape[1] == batches[1].values.data_ptr()
    assert batches[0].offsets is batches[2].offsets
    return {
        "values": [b.values for b in batches],
        "offsets": [b.offsets for b in batches],
        "weights": [None] * 3,
        "combiners": [_library.COMBINERS.index(b.combiner) for b in batches],
        "stacked": True,
    }


@pytest.mark.parametrize(("f", "bad", "name", "table"), [(1, 20, "y", "a"), (2, -1, "z", "b")])
def test_a_bad_id_among_rows_of_one_block_names_its_feature(f, bad, name, table) -> None:
    engine = _engine()
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    args = _dense(engine, ids)
    _lookup(engine, args)  # the good arguments work
    before = _state(engine)
    args["values"][f][3] = bad  # in place: the rows stay one block
    message = rf"feature '{name}': id {bad} at position 3 is out of range for table '{table}'"
    with pytest.raises(ValueError, match=r"embcore::lookup: " + message):
        _lookup(engine, args, training=True)
    with pytest.raises(ValueError, match=r"embcore::update: " + message):
        _update(engine, args, [torch.ones(4, 3, 4)])
    assert all(torch.equal(a, b) for a, b in zip(before, _state(engine), strict=True))


def test_the_first_bad_feature_is_named_whatever_its_fault() -> None:
    """Ids are range-checked for all features at once, after the other checks: a bad id of
    feature 'x' is still the error when feature 'y' has ids of the wrong dtype."""
    engine = _engine()
    args = _set(_good(engine), "values", 0, _i64(1, 2, 99, 5))
    args = _set(args, "values", 1, torch.tensor([3, 4, 5], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"feature 'x': id 99 at position 2 is out of range"):
        _lookup(engine, args)


def test_one_offsets_tensor_is_checked_against_each_feature_ids() -> None:
    """Features may share one offsets tensor; it must fit the ids of each of them."""
    engine = _engine()
    args = _dense(engine, torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]))
    args = _set(args, "values", 2, _i64(1, 2, 3))
    with pytest.raises(ValueError, match=r"feature 'z': offsets must start at 0 and end at len"):
        _lookup(engine, {**args, "stacked": False})


def test_a_stacked_gradient_through_the_operator_is_checked_as_in_eager_mode() -> None:
    """``embcore::update`` with one ``(S, F, dim)`` gradient: a NaN raises naming its feature
    and changes nothing; a float64 gradient updates as the same values in float32; an update
    matches the eager path's (``engine.stacked`` and autograd) on the same batch."""
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    grad = torch.linspace(-1, 1, 4 * 3 * 4).reshape(4, 3, 4)
    engine = _engine()
    args = _dense(engine, ids)
    before = _state(engine)
    nan = grad.clone()
    nan[1, 2, 3] = float("nan")  # feature z (table b)
    with pytest.raises(ValueError, match=r"features 'z' \(table 'b'\) have NaN or Inf"):
        _update(engine, args, [nan])
    assert all(torch.equal(a, b) for a, b in zip(before, _state(engine), strict=True))
    _update(engine, args, [grad.double()])
    eager = _engine()
    (eager.stacked({"x": ids[0], "y": ids[1], "z": ids[2]}) * grad).sum().backward()
    for a, b in zip(_state(engine), _state(eager), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
