"""Table initialization, deterministic and independent of sharding (docs/semantics.md §6,
pitfall 27).

The default initializer is a truncated normal with mean 0 and std ``1/sqrt(dim)``, cut at two
standard deviations. Rows are drawn in fixed blocks of :data:`BLOCK_ROWS` (the last block of a
table holds only the rows left, so a small table draws only its own rows), each block from its
own generator seeded by ``(seed, table name, block index)``, so that any shard can produce
exactly its rows of the full table without drawing the rest, whatever the world size or the
order of tables.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from embcore.config import ResolvedTable
from embcore.optimizers.base import Optimizer

__all__ = ["BLOCK_ROWS", "initial_rows", "initial_slots", "slot_values"]

BLOCK_ROWS = 1 << 16


def _block_seed(seed: int, table: str, block: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{table}/{block}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def _truncated_normal_rows(
    seed: int, table: str, vocabulary_size: int, dim: int, start: int, stop: int
) -> Tensor:
    out = torch.empty(stop - start, dim, dtype=torch.float32)
    std = 1.0 / math.sqrt(dim)
    first, last = start // BLOCK_ROWS, (stop - 1) // BLOCK_ROWS if stop > start else -1
    gen = torch.Generator()
    for block in range(first, last + 1):
        lo, hi = block * BLOCK_ROWS, min((block + 1) * BLOCK_ROWS, vocabulary_size)
        a, b = max(lo, start), min(hi, stop)
        whole = (a, b) == (lo, hi)  # the block lies inside the range: draw it in place
        rows = out[a - start : b - start] if whole else torch.empty(hi - lo, dim, dtype=out.dtype)
        gen.manual_seed(_block_seed(seed, table, block))
        torch.nn.init.trunc_normal_(rows, mean=0.0, std=std, a=-2 * std, b=2 * std, generator=gen)
        if not whole:
            out[a - start : b - start] = rows[a - lo : b - lo]
    return out


def _dtype_kwarg(initializer: Callable[..., Any]) -> dict[str, Any]:
    """``{"dtype": float32}`` if the initializer takes a dtype (TensorFlow's do), else ``{}``."""
    try:
        params = inspect.signature(initializer).parameters.values()
    except (TypeError, ValueError):  # some builtins have no signature: pass the dtype
        return {"dtype": torch.float32}
    takes = any(p.name == "dtype" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    return {"dtype": torch.float32} if takes else {}


def initial_rows(
    table: str,
    vocabulary_size: int,
    dim: int,
    initializer: Callable[..., Any] | None,
    seed: int,
    start: int = 0,
    stop: int | None = None,
) -> Tensor:
    """Rows ``[start, stop)`` of a table's initial value, ``(stop - start, dim) float32``.

    A user ``initializer`` is called once with the full shape ``(vocabulary_size, dim)``, and
    ``dtype=torch.float32`` when it accepts a ``dtype``; it may return a tensor or an array.
    """
    stop = vocabulary_size if stop is None else stop
    if initializer is None:
        return _truncated_normal_rows(seed, table, vocabulary_size, dim, start, stop)
    value = initializer((vocabulary_size, dim), **_dtype_kwarg(initializer))
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if not isinstance(value, Tensor):
        value = torch.as_tensor(value)
    if tuple(value.shape) != (vocabulary_size, dim):
        raise ValueError(
            f"table '{table}': initializer returned shape {tuple(value.shape)}, expected "
            f"{(vocabulary_size, dim)}"
        )
    if not value.is_floating_point():
        raise ValueError(
            f"table '{table}': initializer returned dtype {value.dtype}, expected float"
        )
    return value[start:stop].to(torch.float32).contiguous()


def slot_values(
    optimizer: Optimizer | None, rows: int, cols: int, device: torch.device | None = None
) -> dict[str, Tensor]:
    """Every slot of ``optimizer`` at its initial value, over ``rows`` rows of ``cols``
    columns: ``{slot: (rows, cols) float32}``, ``(rows,)`` for a row-wise slot, on ``device``
    (``{}`` without an optimizer). Every table kind builds its slots' starting values here."""
    specs = optimizer.slot_specs() if optimizer is not None else ()
    return {
        s.name: torch.full(s.shape(rows, cols), s.initial_value, dtype=torch.float32, device=device)
        for s in specs
    }


def initial_slots(table: ResolvedTable, weight: Tensor) -> dict[str, Tensor]:
    """A table's optimizer slots: the built-in constants, or ``slot_variable_creation_fn``'s."""
    opt = table.optimizer
    if opt is None:
        return {}
    if opt.slot_variable_creation_fn is None:
        return slot_values(opt, table.vocabulary_size, table.dim, weight.device)
    specs = opt.slot_specs()
    shapes = {s.name: s.shape(table.vocabulary_size, table.dim) for s in specs}

    def constant(value: float):  # the built-in initializer, handed to the user's function
        return lambda shape, dtype=torch.float32: torch.full(shape, value, dtype=dtype)

    made = opt.slot_variable_creation_fn(
        weight, [s.name for s in specs], [constant(s.initial_value) for s in specs]
    )
    if not isinstance(made, dict) or set(made) != set(shapes):
        got = sorted(made) if isinstance(made, dict) else type(made).__name__
        raise ValueError(
            f"table '{table.name}': slot_variable_creation_fn must return a dict with keys "
            f"{sorted(shapes)}, got {got}"
        )
    out = {}
    for name, value in made.items():
        value = torch.as_tensor(value)
        if tuple(value.shape) != shapes[name]:
            raise ValueError(
                f"table '{table.name}': slot '{name}' from slot_variable_creation_fn has "
                f"shape {tuple(value.shape)}, expected {shapes[name]}"
            )
        out[name] = value.to(device=weight.device, dtype=torch.float32).contiguous().clone()
    return out
