"""Batches on their way into the engine: :class:`PreparedBatch` and the feature-leaf test.

See docs/architecture.md for where preparing sits in a training step.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from embcore.config import FeatureConfig, ResolvedFeature, ResolvedTable
from embcore.inputs import FeatureBatch

__all__ = ["PreparedBatch", "is_feature", "stacked_shape"]

_VERSION = operator.attrgetter("_version")  # a tensor's version counter


def is_feature(x: Any) -> bool:
    """Whether ``x`` is a leaf of a feature-config structure."""
    return isinstance(x, FeatureConfig)


@dataclass(frozen=True, eq=False)
class PreparedBatch:
    """A batch validated and converted by :meth:`EmbeddingEngine.prepare`.

    Preparing is pure work on the inputs (no table is read), so it can run in another thread
    while the previous step computes; ``enqueue`` and ``forward`` accept the result.

    The batch was checked once, when it was prepared, and the kernels trust it from then on.
    Its tensors (``batches[i].values``, ``.offsets``, ``.weights``) are the engine's own
    copies; changing one in place afterwards (which moves its version counter) makes every
    later use refuse the batch (:meth:`check_unchanged`) before anything is read or written.
    """

    batches: tuple[FeatureBatch, ...]
    engine: int  # id() of the engine that prepared it
    # every tensor of the batches (feature order: values, offsets, weights if any), which
    # feature and part each is, and their version counters now
    _tensors: tuple[Tensor, ...] = field(init=False, repr=False)
    _where: tuple[tuple[int, str], ...] = field(init=False, repr=False)
    _versions: tuple[int, ...] = field(init=False, repr=False)
    _owner: object = field(default=None, init=False, repr=False)  # see seal()

    def __post_init__(self) -> None:
        held = [
            (t, (i, part))
            for i, b in enumerate(self.batches)
            for part, t in (("ids", b.values), ("offsets", b.offsets), ("weights", b.weights))
            if t is not None
        ]
        tensors = tuple(t for t, _ in held)
        object.__setattr__(self, "_tensors", tensors)
        object.__setattr__(self, "_where", tuple(w for _, w in held))
        # (an inference tensor has no version counter: EmbeddingEngine.prepare makes none)
        object.__setattr__(self, "_versions", tuple(map(_VERSION, tensors)))

    def seal(self, owner: object) -> PreparedBatch:
        """Mark the batch as checked by ``owner`` (the engine's ``prepare``, which alone calls
        this): a PreparedBatch put together by hand was never checked."""
        object.__setattr__(self, "_owner", owner)
        return self

    def check_unchanged(
        self, owner: object, features: Sequence[ResolvedFeature], caller: str
    ) -> None:
        """Raise unless ``owner`` sealed this batch and every tensor is as it was prepared (a
        few microseconds: one read of each version counter).

        Raises:
            ValueError: the batch was not made by ``prepare``, or a tensor was changed in
                place after it (naming the features and the tensors); nothing was read or
                written.
        """
        if self._owner is not owner:
            raise ValueError(
                f"EmbeddingEngine.{caller}: this PreparedBatch was not made by this engine's "
                "prepare() (one put together by hand was never checked); pass the inputs to "
                "prepare()"
            )
        now = tuple(map(_VERSION, self._tensors))
        if now == self._versions:
            return
        changed = [
            f"{part} of feature '{features[i].name}'"
            for (i, part), a, b in zip(self._where, now, self._versions, strict=True)
            if a != b
        ]
        listed = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if changed[3:] else "")
        raise ValueError(
            f"EmbeddingEngine.{caller}: this PreparedBatch was changed in place after "
            f"prepare() ({listed}); the engine checked it once, when it was prepared, and does "
            "not trust it since: change the input, then call prepare() again"
        )


def stacked_shape(
    features: Sequence[ResolvedFeature],
    tables: Sequence[ResolvedTable],
    shapes: Sequence[tuple[int, ...]],
) -> tuple[int, ...]:
    """``(*output_shape, F, dim)``: the shape of ``EmbeddingEngine.stacked``'s result for
    features with these output shapes.

    Raises:
        ValueError: the features differ in output shape or dim (naming them).
    """
    first = features[0]
    shape, dim = shapes[0], tables[first.table].dim
    for f, s in zip(features, shapes, strict=True):
        if s != shape or tables[f.table].dim != dim:
            raise ValueError(
                f"EmbeddingEngine.stacked: feature '{f.name}' has output shape "
                f"{s} and dim {tables[f.table].dim}, but feature "
                f"'{first.name}' has {shape} and {dim}; stacked() needs every feature to "
                "share both (use forward() for mixed features)"
            )
    return (*shape, len(features), dim)
