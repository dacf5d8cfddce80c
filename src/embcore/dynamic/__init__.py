"""Dynamic-vocabulary tables: any int64 key gets its own row, with admission and eviction.

The parts keyed rows (:mod:`embcore.rows.keyed`) are built from: :mod:`.index` (a hash
index from keys to row numbers), :mod:`.policy` (admission and eviction configs and their
exact rules), :mod:`.keyspace` (one table's keys, counts and rows over a step sequence),
:mod:`.init` (new rows as a pure function of seed, table name and key). ``CountAdmission``
and ``Eviction`` are public as ``embcore.CountAdmission`` and ``embcore.Eviction``. See
docs/dynamic_tables.md.

Numba kernels are first imported here, inside a compile-cache directory keyed by the sources
of this package and of the shared Numba helpers they inline (:mod:`embcore._numba`).
"""

from __future__ import annotations

from pathlib import Path

from embcore._numba.cache import kernels_cached_in, package_cache_dir

with kernels_cached_in(package_cache_dir("dynamic", Path(__file__).resolve().parent)):
    from embcore.dynamic import _evict_kernels, _init_kernels, _kernels, _train_kernels  # noqa: F401
