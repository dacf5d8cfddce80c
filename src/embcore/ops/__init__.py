"""Kernels behind one dispatch point.

Engine code calls :func:`lookup`, :func:`update` and :func:`non_finite` with a backend (its
name, or the module :func:`resolve` returns once per engine) and never imports a backend.
Each call covers every table of one step, so that a fused backend can work across tables in
one pass. Every backend declares the whole :class:`Backend` contract, with the argument
meanings of :mod:`embcore.ops.reference`, the readable yardstick every backend is tested
against. See docs/architecture.md.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Sequence
from types import ModuleType

import torch
from torch import Tensor

from embcore.inputs import FeatureBatch
from embcore.ops._backend import BACKENDS, Backend, ResolvedBackend, resolve
from embcore.ops._math import gains
from embcore.ops.state import TableState

__all__ = [
    "BACKENDS",
    "Backend",
    "ResolvedBackend",
    "TableState",
    "default_backend",
    "gains",
    "get_backend",
    "lookup",
    "non_finite",
    "resolve",
    "update",
]


def get_backend(name: str) -> ModuleType:
    """Import a backend module by name (:func:`resolve` gives what an engine holds)."""
    resolve(name)  # checks the name and the module's contract
    return importlib.import_module(BACKENDS[name])


@functools.cache
def _cpu_backend_loads() -> bool:
    """Whether the fused CPU backend imports (it needs Numba)."""
    try:
        resolve("cpu")
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


def _resolved(backend: str | Backend) -> Backend:
    # a name (the sharding schemes), or what resolve() returned once (the engine's stores)
    return resolve(backend) if isinstance(backend, str) else backend


def lookup(
    backend: str | Backend,
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
    module = _resolved(backend)
    if out is None:
        return module.lookup(states, features)
    if module.LOOKUP_WRITES_OUT:
        return module.lookup(states, features, out=out)
    for dests, acts in zip(out, module.lookup(states, features), strict=True):
        for dest, act in zip(dests, acts, strict=True):
            dest.copy_(act)
    return [list(dests) for dests in out]


def update(
    backend: str | Backend,
    states: Sequence[TableState],
    features: Sequence[Sequence[FeatureBatch]],
    grads: Sequence[Sequence[Tensor]],
    lrs: Sequence[float],
    step: int,
    check_finite: bool = False,
) -> bool:
    """One optimizer step for every table, on the rows its features touched (in place).

    Args:
        check_finite: if any gradient holds a NaN or an Inf, write no table and return
            ``False`` (checked within the update's own pass over the gradients where the
            backend has ``UPDATE_CHECKS_FINITE``, else by a pass before it).

    Returns:
        Whether the step was applied.
    """
    module = _resolved(backend)
    if check_finite and module.UPDATE_CHECKS_FINITE:
        return bool(module.update(states, features, grads, lrs, step, check_finite=True))
    if check_finite and any(module.non_finite([g for per_table in grads for g in per_table])):
        return False
    module.update(states, features, grads, lrs, step)
    return True


def non_finite(backend: str | Backend, tensors: Sequence[Tensor]) -> list[bool]:
    """For each tensor, whether it holds a NaN or an Inf."""
    return _resolved(backend).non_finite(tensors)
