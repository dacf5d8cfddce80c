"""Kernels behind one dispatch point.

Engine code calls :func:`lookup` and :func:`update` with a backend name and never imports a
backend. Each call covers every table of one step, so that a fused backend can work across
tables in one pass. A backend module defines:

* ``lookup(states, features) -> list[list[Tensor]]``: for each table, one ``(S_f, dim)``
  activation per feature of that table;
* ``update(states, features, grads, lrs, step) -> None``: one optimizer step per table, in
  place;
* optionally ``non_finite(tensors) -> list[bool]``: which tensors hold a NaN or an Inf (the
  reference's is used when a backend has none);
* optionally ``LOOKUP_WRITES_OUT = True``, when its ``lookup`` takes ``out=`` (preallocated
  outputs, e.g. the slices of one stacked tensor) and writes into it; otherwise the dispatch
  copies;

with the argument meanings of :mod:`embcore.ops.reference`, which is the readable yardstick
every backend is tested against.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from types import ModuleType

import torch
from torch import Tensor

from embcore.inputs import FeatureBatch
from embcore.ops.state import TableState

__all__ = [
    "BACKENDS",
    "TableState",
    "default_backend",
    "get_backend",
    "lookup",
    "non_finite",
    "update",
]

#: Backend name -> module path, imported lazily so optional dependencies stay optional.
BACKENDS: dict[str, str] = {
    "reference": "embcore.ops.reference",
    "cpu": "embcore.ops.cpu",
    "triton": "embcore.ops.triton",
}


def get_backend(name: str) -> ModuleType:
    """Import a backend by name."""
    if name not in BACKENDS:
        raise NotImplementedError(
            f"embcore.ops: unknown backend {name!r}; available: {sorted(BACKENDS)} or 'auto'"
        )
    return importlib.import_module(BACKENDS[name])


@functools.cache
def _cpu_backend_loads() -> bool:
    """Whether the fused CPU backend imports (it needs Numba)."""
    try:
        get_backend("cpu")
    except ImportError:
        return False
    return True


@functools.cache
def _triton_loads() -> bool:
    """Whether Triton (an optional dependency, ``pip install embcore[gpu]``) imports."""
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


def default_backend(device: torch.device) -> str:
    """The backend ``"auto"`` picks for tables on ``device``: the fused ``"cpu"`` backend on
    the CPU when Numba is installed, the fused ``"triton"`` backend on CUDA devices when Triton
    is installed, else ``"reference"``."""
    kind = torch.device(device).type
    if kind == "cpu" and _cpu_backend_loads():
        return "cpu"
    if kind == "cuda" and _triton_loads():
        return "triton"
    return "reference"


def lookup(
    backend: str,
    states: Sequence[TableState],
    features: Sequence[Sequence[FeatureBatch]],
    out: Sequence[Sequence[Tensor]] | None = None,
) -> list[list[Tensor]]:
    """Pooled or sequence lookups of every feature of every table.

    Args:
        out: optional ``(S_f, dim) float32`` tensors, per table per feature, to write the
            activations into (their rows may be strided: slices of a stacked output); they
            are returned.
    """
    module = get_backend(backend)
    if out is None:
        return module.lookup(states, features)
    if getattr(module, "LOOKUP_WRITES_OUT", False):
        return module.lookup(states, features, out=out)
    for dests, acts in zip(out, module.lookup(states, features), strict=True):
        for dest, act in zip(dests, acts, strict=True):
            dest.copy_(act)
    return [list(dests) for dests in out]


def update(
    backend: str,
    states: Sequence[TableState],
    features: Sequence[Sequence[FeatureBatch]],
    grads: Sequence[Sequence[Tensor]],
    lrs: Sequence[float],
    step: int,
) -> None:
    """One optimizer step for every table, on the rows its features touched (in place)."""
    get_backend(backend).update(states, features, grads, lrs, step)


def non_finite(backend: str, tensors: Sequence[Tensor]) -> list[bool]:
    """For each tensor, whether it holds a NaN or an Inf."""
    module = get_backend(backend)
    check = getattr(module, "non_finite", None)
    if check is None:
        check = get_backend("reference").non_finite
    return check(tensors)
