"""The TPU embedding API's calls: ``enqueue`` a batch, ``dequeue`` its activations, then
``apply_gradients`` with d(loss)/d(activation).

:class:`EnqueueDequeue` gives :class:`embcore.EmbeddingEngine` these three methods. They run
the engine's own lookup and its one path from gradients to the update (``_batches``,
``_lookup``, ``_pack``, ``_apply_gradients``), so the update is exactly the one
``loss.backward()`` applies after ``forward``.
See docs/architecture.md.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from embcore.engine._batch import PreparedBatch
from embcore.inputs import FeatureBatch

__all__ = ["EnqueueDequeue", "Pending"]


@dataclass
class Pending:
    """A batch between ``enqueue`` and ``apply_gradients`` (or ``dequeue`` for inference)."""

    batches: list[FeatureBatch]
    training: bool
    prepared: PreparedBatch | None  # the batch as given, when prepared (checked at each use)
    dequeued: bool = False


class EnqueueDequeue:
    """``enqueue`` / ``dequeue`` / ``apply_gradients`` of :class:`EmbeddingEngine`."""

    _pending: Pending | None
    _features: Any
    _ops: Any

    def enqueue(self, features: Any, weights: Any = None, training: bool = True) -> None:
        """Validate and convert a batch for the next :meth:`dequeue`.

        Args:
            features: ids in the structure of the feature config: dense integer tensors,
                ``torch.sparse_coo_tensor`` or :class:`RaggedIds`, one per feature.
            weights: ``None``, or per-id float weights in the same structure; ``None`` entries
                and absent dict keys mean unweighted; sparse weights share the ids' indices,
                ragged weights their row splits.
            training: True when :meth:`apply_gradients` will follow.

        Raises:
            RuntimeError: a training batch is still waiting for ``apply_gradients``, or a batch
                was never dequeued.
        """
        if self._pending is not None:
            if self._pending.training:
                raise RuntimeError(
                    "EmbeddingEngine.enqueue: the previous training batch has not been applied; "
                    "call dequeue() and apply_gradients() before the next enqueue()"
                )
            if not self._pending.dequeued:
                raise RuntimeError(
                    "EmbeddingEngine.enqueue: the previous batch was never dequeued; call "
                    "dequeue() first"
                )
        if training:
            self._require_optimizers("enqueue(training=True)")
        batches = self._batches(features, weights, "enqueue")
        prepared = features if isinstance(features, PreparedBatch) else None
        self._pending = Pending(batches, bool(training), prepared)

    def dequeue(self) -> Any:
        """The activations of the enqueued batch, in the feature config's structure.

        Each is ``output_shape + (dim,)``: ``(B, dim)`` pooled, ``(B, L, dim)`` for sequences.
        After a training enqueue they are leaf tensors that require grad, so that
        ``torch.autograd.grad(loss, activations)`` gives the gradients to apply.
        """
        pending = self._pending
        if pending is None or pending.dequeued:
            raise RuntimeError("EmbeddingEngine.dequeue: no batch enqueued; call enqueue() first")
        self._check_pending(pending, "dequeue")
        flat = self._lookup(pending.batches, training=pending.training)
        if pending.training:
            flat = [a.requires_grad_(True) for a in flat]
            pending.dequeued = True
        else:
            self._pending = None
        return self._pack(flat, pending.batches)

    def apply_gradients(self, gradients: Any) -> None:
        """Update the tables with d(loss)/d(activation) of the dequeued training batch.

        Args:
            gradients: the structure of the feature config, each entry a tensor shaped like
                its activation, or ``None`` for zeros (which still touch the looked-up rows:
                Adam, AdagradMomentum and FTRL rows move, docs/semantics.md §3.15).

        Raises:
            RuntimeError: no training batch was enqueued and dequeued.
            ValueError, TypeError: a gradient is missing, of the wrong type or shape, or not
                finite. Nothing is updated and the batch stays pending.
        """
        pending = self._pending
        if pending is None or not pending.training:
            raise RuntimeError(
                "EmbeddingEngine.apply_gradients: no training batch to apply; call "
                "enqueue(batch, training=True) and dequeue() first"
            )
        if not pending.dequeued:
            raise RuntimeError(
                "EmbeddingEngine.apply_gradients: call dequeue() before apply_gradients()"
            )

        def missing(none: list[str]) -> None:
            warnings.warn(
                f"EmbeddingEngine.apply_gradients: no gradient for features {none}; zeros are "
                "applied, which still update the looked-up rows of optimizers with state",
                UserWarning,
                stacklevel=4,  # the caller of apply_gradients
            )

        self._check_pending(pending, "apply_gradients")
        flat = self._flatten(gradients, "gradients")
        self._apply_gradients(pending.batches, flat, missing=missing)
        self._pending = None

    def _check_pending(self, pending: Pending, caller: str) -> None:
        """Refuse an enqueued PreparedBatch changed in place since: nothing is looked up or
        updated, and the batch is dropped (it can never be used), so ``enqueue`` works again."""
        if pending.prepared is None:
            return
        try:
            pending.prepared.check_unchanged(self._ops, self._features, caller)
        except ValueError:
            self._pending = None
            raise

    def _require_optimizers(self, what: str) -> None:
        missing = [t.name for t in self._tables if t.optimizer is None]
        if missing:
            raise RuntimeError(
                f"EmbeddingEngine.{what}: tables {missing} have no optimizer; pass optimizer= to "
                "the engine or to their TableConfig, or use training=False"
            )
