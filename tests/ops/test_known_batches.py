"""The operators skip the per-feature checks of a batch known good (:mod:`embcore.ops.
_known_batches`: the engine's prepared batches, a lookup's checked tensors) and of nothing
else: a tensor changed in place since, a freed one whose memory a new tensor took, or an
alias written through is checked again and refused with the usual error; an unchanged alias
is known; the batches are held weakly and a bounded number of them."""

from __future__ import annotations

import gc
import sys
import threading
import weakref

import numpy as np
import pytest
import torch
from test_op_inputs import _engine, _good, _lookup, _state, _update

import embcore as ec
from embcore.ops import _known_batches, _library

#: the message of the id made bad below (feature 'z', position 2, table 'b' of 30 rows)
BAD_ID = r"feature 'z': id 30 at position 2 is out of range for table 'b' with vocabulary_size 30"
RAGGED = ec.RaggedIds.from_lists([[1, 2, 2], [], [5]])


def _prepared(engine: ec.EmbeddingEngine) -> dict:
    """The operators' arguments: the very tensors of a batch the engine prepared."""
    batches = engine.prepare({"x": RAGGED, "y": torch.tensor([3, 4, 5]), "z": RAGGED}).batches
    return {
        "values": [b.values for b in batches],
        "offsets": [b.offsets for b in batches],
        "weights": [b.weights for b in batches],
        "combiners": [_library.COMBINERS.index(b.combiner) for b in batches],
        "stacked": False,
    }


def _grads() -> list[torch.Tensor]:
    return [torch.ones(3, 4) for _ in range(3)]


def test_a_prepared_batch_is_not_checked_until_changed_in_place(op_feature_checks) -> None:
    engine = _engine()
    _lookup(engine, _good(engine))  # the operators are in use: prepared batches are held
    args = _prepared(engine)
    _lookup(engine, args, training=True)
    _update(engine, args, _grads())
    assert op_feature_checks == ["lookup"]  # the first call's own arguments only
    args["values"][2][2] = 30  # in place, after the engine validated it
    before = _state(engine)
    with pytest.raises(ValueError, match=r"embcore::lookup: " + BAD_ID):
        _lookup(engine, args, training=True)
    with pytest.raises(ValueError, match=r"embcore::update: " + BAD_ID):
        _update(engine, args, _grads())
    assert all(torch.equal(a, b) for a, b in zip(before, _state(engine), strict=True))


def test_a_checked_batch_is_known_to_the_update_until_changed_in_place(op_feature_checks) -> None:
    engine = _engine()
    args = _good(engine)
    _lookup(engine, args, training=True)
    _update(engine, args, _grads())  # what the lookup's backward does
    assert op_feature_checks == ["lookup"]
    args["offsets"][0][1] = 7  # past the ids: the kernels would read outside the batch
    with pytest.raises(ValueError, match=r"embcore::update: feature 'x': offsets must never"):
        _update(engine, args, _grads())
    assert op_feature_checks == ["lookup", "update"]


def test_a_freed_tensor_is_not_trusted_where_a_new_one_took_its_memory(op_feature_checks) -> None:
    """A new tensor at the freed one's address, with its shape, strides, dtype and version
    (as an allocator reusing the memory makes one) is checked."""
    engine = _engine()
    args = _good(engine)
    ids = np.array([1, 2, 2, 5])
    args["values"][2] = torch.from_numpy(ids)
    _lookup(engine, args)
    freed = weakref.ref(args["values"][2])
    args["values"][2] = None
    gc.collect()
    assert freed() is None
    ids[2] = 30  # through NumPy: the memory, not any tensor
    args["values"][2] = torch.from_numpy(ids)  # at the freed tensor's address, version 0
    with pytest.raises(ValueError, match=r"embcore::lookup: " + BAD_ID):
        _lookup(engine, args)
    assert op_feature_checks == ["lookup", "lookup"]


def test_an_alias_is_known_while_unchanged(op_feature_checks) -> None:
    """An alias of a checked tensor (the same memory, shape and strides: what a compiled
    graph hands its backward) is known; one written through, or one of other memory, is not."""
    engine = _engine()
    args = _good(engine)
    _lookup(engine, args)
    alias = {**args, "values": [v.detach() for v in args["values"]]}
    _lookup(engine, alias)
    assert op_feature_checks == ["lookup"]
    shifted = torch.tensor([0, 1, 2, 2, 5])[1:]  # equal values, other memory
    _lookup(engine, {**args, "values": [*args["values"][:2], shifted]})
    assert op_feature_checks == ["lookup", "lookup"]
    alias["values"][2][2] = 30  # through the alias: the original changed too
    for given in (alias, args):
        with pytest.raises(ValueError, match=r"embcore::lookup: " + BAD_ID):
            _lookup(engine, given)


def test_inference_tensors_are_always_checked(op_feature_checks) -> None:
    """Tensors made under ``torch.inference_mode`` have no version counter: never held
    (``engine.prepare`` makes normal tensors even there, so these are copies)."""
    engine = _engine()
    _lookup(engine, _good(engine))
    with torch.inference_mode():
        args = _prepared(engine)
        for key in ("values", "offsets"):
            args[key] = [t.clone() for t in args[key]]
        assert all(t.is_inference() for t in args["values"])
        acts = _lookup(engine, args)
        _lookup(engine, args)
    with torch.no_grad():
        want = engine({"x": RAGGED, "y": torch.tensor([3, 4, 5]), "z": RAGGED})
    torch.testing.assert_close(acts[2], want["z"], rtol=0, atol=0)
    assert op_feature_checks == ["lookup", "lookup", "lookup"]


def _batch(n: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return [torch.arange(n)], [torch.tensor([0, n])]


def test_the_batches_are_held_weakly_and_a_bounded_number() -> None:
    known = _known_batches.KnownBatches(size=2)
    kept = [_batch(n) for n in (1, 2, 3)]
    for batch in kept:
        known.remember(*batch, [None], [0])
    held = [known.holds(*batch, [None], [0]) for batch in kept]
    assert held == [False, True, True]  # the oldest dropped
    gone = weakref.ref(kept[2][0][0])
    del kept[2], batch
    gc.collect()
    assert gone() is None  # held, but not kept alive
    assert known.holds(*kept[1], [None], [0])
    assert not known.holds(*kept[1], [None], [1])  # another combiner code


def test_a_batch_prepared_in_another_thread_is_known() -> None:
    """An input pipeline prepares in its own thread while the step runs in the caller's: the
    threads switch as often as they can, no call fails and the last batch is known."""
    known = _known_batches.KnownBatches(size=4)
    first, last = _batch(1), _batch(2)
    known.remember(*first, [None], [0])

    def prepare() -> None:
        batches = [_batch(3) for _ in range(4)]  # alive, so the deque holds live batches
        for i in range(20_000):
            known.remember(*batches[i % 4], [None], [0])
        known.remember(*last, [None], [0])

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        worker = threading.Thread(target=prepare)
        worker.start()
        while worker.is_alive():
            known.holds(*first, [None], [0])  # reads the deque while it changes
        worker.join()
    finally:
        sys.setswitchinterval(interval)
    assert known.holds(*last, [None], [0])
