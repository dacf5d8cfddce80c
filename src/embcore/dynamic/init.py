"""Initial values of the rows a dynamic table gives to newly admitted keys.

The default initializer draws the same distribution as the fixed tables' default (a normal
with mean 0 and standard deviation ``1/sqrt(dim)``, truncated at two standard deviations),
but each value is a pure function of ``(seed, table name, key, column)``: a counter-based
hash stream, not a generator's state. A key's new row is therefore the same whatever the
batch, the insertion order, the thread count or the sharding, and a key evicted and admitted
again starts from the same values. A user initializer ``init(shape)`` is called once per
lookup with ``(n_new, dim)`` for the keys admitted in it, in ascending key order.
See docs/dynamic_tables.md.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from embcore._numba import threads
from embcore._numba.mix import mix64
from embcore.dynamic import _init_kernels
from embcore.dynamic.index import check_keys

__all__ = ["TRUNCATE_AT", "default_rows", "new_rows", "table_salt"]

#: the default initializer's normal is cut at this many standard deviations
TRUNCATE_AT = 2.0
_LO = 0.5 * math.erfc(TRUNCATE_AT / math.sqrt(2.0))  # the normal CDF at -2
_HI = 1.0 - _LO
_U64 = (1 << 64) - 1


def table_salt(seed: int, table: str) -> int:
    """The 64-bit salt of a table's streams: ``mix64(seed mod 2**64 ^ mix64(blake2b(table)))``."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"table '{table}': seed must be an int, got {seed!r}")
    name = int.from_bytes(hashlib.blake2b(table.encode(), digest_size=8).digest(), "little")
    mixed = int(mix64(np.uint64(name)))
    return int(mix64(np.uint64((seed & _U64) ^ mixed)))


def default_rows(seed: int, table: str, keys: np.ndarray, dim: int) -> np.ndarray:
    """The default initial rows of ``keys: (N,) int64``: ``(N, dim) float32``.

    Value ``[i, j]`` is ``std * Phi^-1(Phi(-2) + (Phi(2) - Phi(-2)) * U)`` with
    ``std = 1/sqrt(dim)`` and ``U`` in (0, 1) the ``j``-th SplitMix64 output of the stream
    seeded by ``mix64(mix64(key_i) ^ table_salt(seed, table))``: a truncated normal on
    ``[-2 std, 2 std]``, as the fixed tables' default initializer draws.
    """
    keys = check_keys(keys, table, "default_rows")
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
        raise ValueError(f"table '{table}': dim must be a positive int, got {dim!r}")
    out = np.empty((keys.size, dim), np.float32)
    salt = np.uint64(table_salt(seed, table))
    threads.run(
        _init_kernels.normal_rows,
        keys,
        salt,
        _LO,
        _HI,
        1.0 / math.sqrt(dim),
        out,
        workers=threads.num_workers(keys.size * dim // 64),
    )
    return out


def new_rows(
    keys: np.ndarray,
    *,
    table: str,
    dim: int,
    seed: int,
    initializer: Callable[..., Any] | None = None,
) -> np.ndarray:
    """Initial rows ``(N, dim) float32`` for the keys admitted in one lookup.

    Args:
        keys: ``(N,) int64``, strictly ascending (the order a user initializer's rows are
            assigned in).
        table: the table's name (salts the default initializer; names errors).
        dim: the table's width.
        seed: the engine's seed.
        initializer: ``None`` for :func:`default_rows`, else called as ``init((N, dim))``
            (with ``dtype=torch.float32`` when it takes a ``dtype``), returning a float tensor
            or array of that shape; not called when ``N == 0``.
    """
    keys = check_keys(keys, table, "new_rows")
    if keys.size > 1 and not bool(np.all(keys[1:] > keys[:-1])):
        raise ValueError(
            f"table '{table}': new_rows takes strictly ascending keys (one row per new key)"
        )
    if initializer is None:
        return default_rows(seed, table, keys, dim)
    if keys.size == 0:
        return np.empty((0, dim), np.float32)
    value = initializer((keys.size, dim), **_dtype_kwarg(initializer))
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    value = np.asarray(value)
    if value.shape != (keys.size, dim):
        raise ValueError(
            f"table '{table}': initializer returned shape {value.shape}, expected "
            f"{(keys.size, dim)} (one row per new key)"
        )
    if not np.issubdtype(value.dtype, np.floating):
        raise ValueError(
            f"table '{table}': initializer returned dtype {value.dtype}, expected float"
        )
    return np.ascontiguousarray(value, dtype=np.float32)


def _dtype_kwarg(initializer: Callable[..., Any]) -> dict[str, Any]:
    """``{"dtype": torch.float32}`` if the initializer takes a dtype (as the fixed tables'
    initializers are called), else ``{}``."""
    try:
        params = inspect.signature(initializer).parameters.values()
    except (TypeError, ValueError):
        return {"dtype": torch.float32}
    takes = any(p.name == "dtype" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    return {"dtype": torch.float32} if takes else {}
