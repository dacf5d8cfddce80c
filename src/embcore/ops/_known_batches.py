"""Batches the custom operators need not check again: :class:`KnownBatches`.

``torch.ops.embcore.lookup`` and ``update`` check every argument (:mod:`._op_inputs`), a pass
over each feature's ids and offsets. In a compiled training step that work is done already
twice over: the engine validated the batch when it prepared it (``engine.prepare``; the
eager path then only checks that no tensor of it changed since), and the update in the
lookup's backward is given the very tensors the lookup was. So each engine's operators hold,
weakly, the batches known good, its own prepared batches and the batches a lookup checked, and
skip the per-feature checks for them (the number of features and the stacked shape are still
checked).

A batch is known while every tensor it was given as is alive and unchanged: its version
counter, which every in-place change through PyTorch moves, is what it was. A tensor given to
an operator matches the one held when it is that very tensor, or an alias of it: the same
storage, offset, shape, strides and dtype (:meth:`torch.Tensor.is_set_to`) and the same
version (a compiled graph hands its backward such aliases of its inputs). A tensor that was
freed is never matched, even where a new one took its memory. As for a ``PreparedBatch`` in
eager mode (refused once changed), writes that bypass the version counter (through
``.numpy()``, ``.data`` or another framework) are not seen. Inference tensors
(``torch.inference_mode``) have no version counter: they are never held, always checked.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Sequence
from typing import Any

from torch import Tensor

__all__ = ["KnownBatches"]

#: one tensor held: a weak reference to it and its version then (``None``: no weights)
_Held = tuple[weakref.ref, int] | None


class KnownBatches:
    """The last ``size`` batches known good, each as the operators take it: per feature
    ``values``, ``offsets``, ``weights`` (or ``None``) and a combiner code. Called from any
    thread (an input pipeline prepares batches in its own): one append or one snapshot of a
    bounded deque, each atomic."""

    def __init__(self, size: int = 8) -> None:
        # (held tensors: values, offsets, weights; their list lengths; combiner codes)
        self._recent: collections.deque[tuple[tuple[_Held, ...], tuple[int, ...], tuple]] = (
            collections.deque(maxlen=size)
        )

    def remember(
        self,
        values: Sequence[Tensor],
        offsets: Sequence[Tensor],
        weights: Sequence[Tensor | None],
        combiners: Sequence[int],
    ) -> None:
        """Hold a batch checked or prepared just now (not one of inference tensors)."""
        try:
            held = tuple(
                None if t is None else (weakref.ref(t), t._version)
                for t in (*values, *offsets, *weights)
            )
        except RuntimeError:  # an inference tensor: no version counter
            return
        sizes = (len(values), len(offsets), len(weights))
        self._recent.append((held, sizes, tuple(combiners)))

    def holds(
        self,
        values: Sequence[Any],
        offsets: Sequence[Any],
        weights: Sequence[Any],
        combiners: Sequence[Any],
    ) -> bool:
        """Whether this batch is one held, every tensor in its place and unchanged."""
        given = (*values, *offsets, *weights)
        sizes = (len(values), len(offsets), len(weights))
        codes = tuple(combiners)
        try:
            for held, was_sizes, was_codes in reversed(tuple(self._recent)):  # (a snapshot)
                if was_sizes == sizes and was_codes == codes and all(map(_same, held, given)):
                    return True
        except RuntimeError:  # an inference tensor given: no version counter
            pass
        return False


def _same(held: _Held, t: Any) -> bool:
    """Whether ``t`` is the tensor ``held`` (or an alias of it), unchanged since."""
    if held is None:
        return t is None
    ref, version = held
    was = ref()
    if was is None or was._version != version:
        return False  # freed (its memory may hold anything now), or changed
    if t is was:
        return True
    return (
        isinstance(t, Tensor)
        and t._version == version
        and t.dtype == was.dtype
        and t.is_set_to(was)  # the same storage, offset, shape and strides
    )
