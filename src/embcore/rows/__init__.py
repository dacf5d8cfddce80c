"""How one table holds its rows: the :class:`RowStore` contract, its kinds and their registry.

The layer under the table stores (docs/architecture.md)::

    engine -> store (local, sharded) -> row storage (one per table or piece) -> ops kernels

* :mod:`._contract`: :class:`RowStore`, what every kind provides; :class:`RowEnv`;
  :class:`StoredTensor` and :data:`Chunks` (checkpoint records), :class:`TouchedRows` (what a
  tensor offers so that a delta holds only its rows written since the base);
* :mod:`._registry`: :data:`ROWS`, :func:`register`, :func:`kind_of` (the one place a
  table's kind is chosen from its config), :func:`make_rows`;
* :mod:`.dense`: rows in one dense tensor (a whole table, or a shard's piece);
* :mod:`.keyed`: a key index in front of growable rows (dynamic tables);
* :mod:`._mapped`: :func:`~._mapped.split_mapped`, a call's batches with their ids mapped
  to rows or cache slots (every kind that maps ids);
* :mod:`.disk`, :mod:`.disk_keyed`: rows on local disk behind a bounded RAM row cache (fixed
  tables; dynamic tables, their key index in RAM).

A new kind is one module defining a class that follows :class:`RowStore`, one entry in
:data:`ROWS` (or a call to :func:`register`), and its tests.
"""

from embcore.rows._contract import (
    Chunks,
    Records,
    RowEnv,
    RowStore,
    StoredTensor,
    TouchedRows,
    stored_names,
)
from embcore.rows._registry import (
    ROWS,
    close_rows,
    kind_of,
    make_rows,
    placements,
    planned_memory,
    register,
    row_class,
)

__all__ = [
    "ROWS",
    "Chunks",
    "Records",
    "RowEnv",
    "RowStore",
    "StoredTensor",
    "TouchedRows",
    "close_rows",
    "kind_of",
    "make_rows",
    "placements",
    "planned_memory",
    "register",
    "row_class",
    "stored_names",
]
