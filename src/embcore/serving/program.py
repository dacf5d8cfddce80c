"""Exported programs: a model with its engines swapped for :class:`ServingLookup`, traced by
``torch.export`` for any batch size, and compiled ahead of time by AOTInductor.

See docs/serving.md.
"""

from __future__ import annotations

import copy
import io
import os
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.fx.experimental._config as fx_config
from torch import nn
from torch.export import Dim, ExportedProgram

from embcore import nest
from embcore._atomic import write_atomic
from embcore.config import FeatureConfig
from embcore.serving.lookup import ServingLookup

__all__ = ["compile_package", "export", "lookup_dynamic_shapes", "save_program", "serving_module"]


def serving_module(model: nn.Module) -> nn.Module:
    """An eval-mode copy of ``model`` in which every :class:`embcore.EmbeddingEngine` is a
    :class:`ServingLookup` over the same table tensors (the dense weights are copied, the
    tables shared). An engine itself becomes its ``ServingLookup``."""
    from embcore.engine import EmbeddingEngine

    if isinstance(model, EmbeddingEngine):
        return ServingLookup(model).eval()
    memo: dict[int, Any] = {
        id(m): ServingLookup(m) for m in model.modules() if isinstance(m, EmbeddingEngine)
    }
    return copy.deepcopy(model, memo).eval()  # memo: each engine "copies" to its lookup


def lookup_dynamic_shapes(engine: Any, features: Any, batch: Dim | None = None) -> Any:
    """``torch.export`` dynamic shapes for an engine's ``features`` argument: every feature
    shares the batch dimension ``batch`` (default ``Dim("batch")``), each ragged feature's
    ``values`` (and weights) have a length of their own and its row splits ``batch + 1``."""
    batch = Dim("batch", min=0) if batch is None else batch
    leaves = nest.map_up_to(engine.structure, features, "features", is_leaf=_is_feature)
    specs: list[Any] = []
    for f, x in zip(engine.features, leaves, strict=True):
        if isinstance(x, torch.Tensor):
            specs.append({0: batch})
        else:
            ids = Dim(f"ids_{f.index}", min=0)
            specs.append(({0: ids}, {0: batch + 1}, *([{0: ids}] if len(x) == 3 else [])))
    return nest.pack(engine.structure, specs, is_leaf=_is_feature)


def _is_feature(x: Any) -> bool:
    return isinstance(x, FeatureConfig)


def export(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic_shapes: Any = None,
) -> ExportedProgram:
    """``torch.export.export`` of :func:`serving_module` ``(model)`` on example ``args``.

    Sizes marked dynamic in ``dynamic_shapes`` (``torch.export.Dim``) stay symbolic even when
    an example has size 0 or 1 (``backed_size_oblivious``), so one program serves every batch
    size, a batch of one included.
    """
    module = serving_module(model)
    with torch.no_grad(), fx_config.patch(backed_size_oblivious=True):
        return torch.export.export(module, args, kwargs, dynamic_shapes=dynamic_shapes)


def compile_package(program: ExportedProgram, path: str | os.PathLike) -> Path:
    """Compile ``program`` ahead of time with AOTInductor into the package ``path`` (a
    ``.pt2`` zip holding a shared library; load it with ``torch._inductor.aoti_load_package``).
    Needs a C++ compiler; takes minutes on a small CPU.

    The package is built in memory and then written atomically (:func:`embcore._atomic.
    write_atomic`): PyTorch's zip writer aborts the process when a write to a file fails
    (its destructor throws), so it never writes to the disk here; a full disk raises
    :class:`embcore._atomic.DiskFullError` and leaves no file at ``path``."""
    from torch._inductor import aoti_compile_and_package

    buffer = io.BytesIO()
    with warnings.catch_warnings():  # PyTorch's own (its graph copies, its imports): not ours
        warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)`", FutureWarning)
        warnings.filterwarnings("ignore", r"`torch.jit.script_method`", DeprecationWarning)
        aoti_compile_and_package(program, package_path=buffer)
    return write_atomic(path, buffer.getvalue())


def save_program(program: ExportedProgram, path: str | os.PathLike) -> Path:
    """``torch.export.save(program, path)``, built in memory and written atomically (see
    :func:`compile_package`: a full disk raises :class:`embcore._atomic.DiskFullError`
    instead of aborting the process)."""
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    return write_atomic(path, buffer.getvalue())
