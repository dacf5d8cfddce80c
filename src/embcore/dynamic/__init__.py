"""Dynamic-vocabulary tables: any int64 key gets its own row, with admission and eviction.

The parts keyed rows (:mod:`embcore.rows.keyed`) are built from: :mod:`.index` (a hash
index from keys to row numbers), :mod:`.policy` (admission and eviction configs and their
exact rules), :mod:`.keyspace` (one table's keys, counts and rows over a step sequence),
:mod:`.init` (new rows as a pure function of seed, table name and key). ``CountAdmission``
and ``Eviction`` are public as ``embcore.CountAdmission`` and ``embcore.Eviction``. See
docs/dynamic_tables.md.

Numba kernels are first imported here, inside a compile-cache directory keyed by the sources
of this package and of the CPU backend (whose helpers they inline).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from embcore.ops.cpu._cache import kernel_cache_dir, kernels_cached_in, source_key


def _kernel_dir() -> Path:
    path = kernel_cache_dir() / f"dynamic-{source_key(Path(__file__).resolve().parent)}"
    with contextlib.suppress(OSError):  # unwritable: Numba then compiles without caching
        path.mkdir(parents=True, exist_ok=True)
    return path


with kernels_cached_in(_kernel_dir()):
    from embcore.dynamic import _digest_kernels, _init_kernels, _kernels  # noqa: F401
