"""Activation gradients on their way into an update: checks, and the non-finite policy.

Every gradient is checked before any table is written: a wrong type or shape raises naming the
feature; a NaN or an Inf raises (``non_finite_gradients="raise"``) or drops the step
(``"skip"``), on every rank alike. :class:`UpdatePath` gives the engine the step from checked
gradients to its update. See docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from embcore import ops
from embcore.config import ResolvedFeature, ResolvedTable
from embcore.engine._rates import learning_rates
from embcore.inputs import FeatureBatch

__all__ = [
    "POLICIES",
    "UpdatePath",
    "check_gradients",
    "check_policy",
    "folds_finite_check",
    "non_finite_error",
    "non_finite_features",
]

#: what a step with a NaN or Inf gradient does
POLICIES = ("raise", "skip")


def check_policy(value: Any) -> str:
    if value not in POLICIES:
        raise ValueError(
            f"EmbeddingEngine: non_finite_gradients must be 'raise' or 'skip', got {value!r}"
        )
    return value


def _check(
    feature: ResolvedFeature, batch: FeatureBatch, grad: Any, dim: int, device: torch.device
) -> Tensor:
    """A ``(S, dim) float32`` gradient on ``device`` (``None``: zeros), or a clear error."""
    expected = (*batch.output_shape, dim)
    if grad is None:
        return torch.zeros(batch.num_samples, dim, device=device)
    if not isinstance(grad, Tensor):
        raise ValueError(
            f"gradient for feature '{feature.name}': found non-tensor type "
            f"{type(grad).__name__}, expected a tensor of shape {expected}"
        )
    if tuple(grad.shape) != expected:
        raise ValueError(
            f"gradient for feature '{feature.name}': expected shape {expected} (the "
            f"activation's), got {tuple(grad.shape)}"
        )
    if not grad.is_floating_point():
        raise TypeError(
            f"gradient for feature '{feature.name}': expected a float tensor, got {grad.dtype}"
        )
    grad = grad.detach().to(device=device, dtype=torch.float32)
    return grad.reshape(batch.num_samples, dim)


def check_gradients(
    features: Sequence[ResolvedFeature],
    tables: Sequence[ResolvedTable],
    batches: Sequence[FeatureBatch],
    grads: Sequence[Any],
    device: torch.device,
) -> tuple[list[Tensor], Exception | None]:
    """Every feature's ``(S, dim) float32`` gradient, and the first error found (the features
    with a bad gradient get zeros, so that every rank can still agree before raising)."""
    checked, error = [], None
    for f, b, g in zip(features, batches, grads, strict=True):
        dim = tables[f.table].dim
        try:
            checked.append(_check(f, b, g, dim, device))
        except (ValueError, TypeError) as e:
            error = error or e
            checked.append(torch.zeros(b.num_samples, dim, device=device))
    return checked, error


def non_finite_features(
    backend: ops.Backend,
    features: Sequence[ResolvedFeature],
    tables: Sequence[ResolvedTable],
    grads: Sequence[Tensor],
    whole: Tensor | None = None,
) -> list[str]:
    """The features whose gradient holds a NaN or an Inf, described for messages.

    ``whole``, when given, holds every gradient (a stacked one): it is checked in one
    contiguous pass, the features only if it fails.
    """
    if whole is not None and not ops.non_finite(backend, [whole])[0]:
        return []
    return [
        f"'{f.name}' (table '{tables[f.table].name}')"
        for f, bad in zip(features, ops.non_finite(backend, grads), strict=True)
        if bad
    ]


def folds_finite_check(store: Any, pipelined: bool, tables: Sequence[ResolvedTable]) -> bool:
    """Whether the store's update itself checks the gradients for NaN and Inf, in the
    backend's own pass over them, instead of the engine in a pass before it: where the store
    can (``folds_finite_check``: one process, so no other rank must agree first), the update
    is not deferred (pipelined, the step's error is due now) and no learning rate is a
    callable (it is read before the update, and must be read only on steps that apply)."""
    return (
        getattr(store, "folds_finite_check", False)
        and not pipelined
        and not any(callable(t.optimizer.learning_rate) for t in tables)  # type: ignore[union-attr]
    )


def non_finite_error(features: list[str], ranks: Sequence[int]) -> ValueError:
    """The error of the ``"raise"`` policy: this rank's features, or the other ranks."""
    if features:
        return ValueError(
            f"gradients for features {', '.join(features)} have NaN or Inf values; the tables "
            "were not updated (non_finite_gradients='skip' drops such steps instead)"
        )
    return ValueError(
        f"gradients on rank(s) {list(ranks)} have NaN or Inf values; no rank updated its tables "
        "(non_finite_gradients='skip' drops such steps instead)"
    )


class UpdatePath:
    """The step from checked gradients to the update, for :class:`EmbeddingEngine`: the
    non-finite policy (settled on every rank first, or within the update's own pass over the
    gradients where :func:`folds_finite_check` allows), the learning rates, and the update,
    applied now or deferred (pipelined)."""

    def _update(
        self: Any,
        batches: list[FeatureBatch],
        grads: list[Tensor],
        error: Exception | None,
        whole: Tensor | None,
    ) -> None:
        self._check_open()  # a closed engine (EmbeddingEngine.close) takes no update

        def check() -> list[str]:
            return non_finite_features(self._backend, self._features, self._tables, grads, whole)

        folded = folds_finite_check(self.store, self.pipelined, self._tables)
        bad = [] if error or folded else check()
        ranks = self.store.agree(error, bool(bad))
        if not ranks:
            rates = learning_rates(self._tables, self._step + 1)
            if self.pipelined:
                self._pipeline.defer(self._apply_update, batches, grads, rates)  # one may run
                return
            if self._apply_update(batches, grads, rates, check_finite=folded):
                return
            bad, ranks = check(), [self.rank]  # the update found a NaN or an Inf: no change
        if self.non_finite_gradients == "raise":
            raise non_finite_error(bad, ranks)
        self.skipped_steps += 1

    def _apply_update(
        self: Any,
        batches: list[FeatureBatch],
        grads: list[Tensor],
        rates: list[float],
        check_finite: bool = False,
    ) -> bool:
        """Apply the update (``check_finite``: the store checks the gradients first, within
        its own pass, and drops a step with a NaN or an Inf); whether it was applied."""
        with torch.no_grad():
            step = int(self._step) + 1
            args = (self._by_table(batches), self._by_table(grads), rates, step)
            if not check_finite:
                self.store.update(*args)
            elif not self.store.update(*args, check_finite=True):
                return False
            self._step.add_(1)
        return True
