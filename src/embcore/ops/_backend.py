"""The contract every kernel backend declares, and its resolution by name.

A backend is a module under ``embcore.ops`` that defines every member of :class:`Backend`;
the engine resolves its backend once, when it is built. See docs/architecture.md.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch
from torch import Tensor

from embcore.inputs import FeatureBatch
from embcore.ops.state import TableState

__all__ = ["BACKENDS", "Backend", "ResolvedBackend", "resolve"]

#: Backend name -> module path, imported lazily so optional dependencies stay optional.
BACKENDS: dict[str, str] = {
    "reference": "embcore.ops.reference",
    "cpu": "embcore.ops.cpu",
    "triton": "embcore.ops.triton",
}


class Backend(Protocol):
    """What a backend module defines (argument meanings as in :mod:`embcore.ops.reference`).

    Attributes:
        NAME: the name it is registered under in :data:`BACKENDS`.
        STORAGE_DTYPES: the dtypes it stores tables in (slots and math stay float32).
        LOOKUP_WRITES_OUT: whether ``lookup`` takes ``out=`` (preallocated activations, e.g.
            the slices of one stacked tensor) and writes into it; otherwise the dispatch copies.
        UPDATE_CHECKS_FINITE: whether ``update`` takes ``check_finite=`` (checks every
            gradient for NaN and Inf within its own pass over them, writes no table if one
            has such a value, and returns whether it applied the step); otherwise the
            dispatch checks first, with ``non_finite``.
    """

    NAME: str
    STORAGE_DTYPES: tuple[torch.dtype, ...]
    LOOKUP_WRITES_OUT: bool
    UPDATE_CHECKS_FINITE: bool

    def lookup(
        self,
        states: Sequence[TableState],
        features: Sequence[Sequence[FeatureBatch]],
        out: Sequence[Sequence[Tensor]] | None = None,
    ) -> list[list[Tensor]]:
        """For each table, one ``(S_f, dim) float32`` activation per feature of that table
        (``out=`` is passed only to backends with ``LOOKUP_WRITES_OUT``)."""
        ...

    def update(
        self,
        states: Sequence[TableState],
        features: Sequence[Sequence[FeatureBatch]],
        grads: Sequence[Sequence[Tensor]],
        lrs: Sequence[float],
        step: int,
    ) -> bool | None:
        """One optimizer step per table, on the rows its features touched, in place
        (``check_finite=`` is passed only to backends with ``UPDATE_CHECKS_FINITE``)."""
        ...

    def non_finite(self, tensors: Sequence[Tensor]) -> list[bool]:
        """For each tensor, whether it holds a NaN or an Inf."""
        ...


@dataclass(frozen=True, eq=False)
class ResolvedBackend:
    """A backend's :class:`Backend` members, read once from its module (what an engine holds;
    copying or pickling it refers to the backend by name)."""

    NAME: str
    STORAGE_DTYPES: tuple[torch.dtype, ...]
    LOOKUP_WRITES_OUT: bool
    UPDATE_CHECKS_FINITE: bool
    lookup: Callable[..., list[list[Tensor]]]
    update: Callable[..., bool | None]
    non_finite: Callable[[Sequence[Tensor]], list[bool]]

    def __reduce__(self) -> tuple[Any, ...]:
        return (resolve, (self.NAME,))

    def __deepcopy__(self, memo: dict) -> ResolvedBackend:
        return self


_MEMBERS = tuple(f.name for f in fields(ResolvedBackend))


@functools.cache
def resolve(name: str) -> ResolvedBackend:
    """The backend registered as ``name``, checked to declare the whole contract.

    Raises:
        NotImplementedError: no backend has that name.
        ImportError: the backend's optional dependency is missing.
        TypeError: the module lacks a member of :class:`Backend` (a bug in the backend).
    """
    if name not in BACKENDS:
        raise NotImplementedError(
            f"embcore.ops: unknown backend {name!r}; available: {sorted(BACKENDS)} or 'auto'"
        )
    module = importlib.import_module(BACKENDS[name])
    missing = [m for m in _MEMBERS if not hasattr(module, m)]
    if missing:
        raise TypeError(f"embcore.ops: backend {name!r} does not define {missing}")
    return ResolvedBackend(**{m: getattr(module, m) for m in _MEMBERS})
