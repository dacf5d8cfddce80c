"""The registry of row-storage kinds, and the one place a table's kind is chosen."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from embcore.config import ResolvedTable
from embcore.rows._contract import RowEnv, RowStore

__all__ = [
    "ROWS",
    "close_rows",
    "kind_of",
    "make_rows",
    "placements",
    "planned_memory",
    "register",
    "row_class",
]

#: Kind name -> its class, or ``"module:Class"`` imported when a table first needs it (so a
#: kind's dependencies load only when used).
ROWS: dict[str, str | type] = {
    "dense": "embcore.rows.dense:DenseRows",
    "keyed": "embcore.rows.keyed:KeyedRows",
    "disk": "embcore.rows.disk:DiskRows",
    "disk_keyed": "embcore.rows.disk_keyed:DiskKeyedRows",
}


def register(kind: str, cls: str | type) -> None:
    """Register a row-storage kind (a class following :class:`RowStore`, or
    ``"module:Class"``) under ``kind``; a table whose ``TableConfig.storage`` names it gets it."""
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"embcore.rows.register: kind must be a non-empty str, got {kind!r}")
    ROWS[kind] = cls


def kind_of(table: ResolvedTable) -> str:
    """The kind of row storage ``table`` gets: the kind its storage names (the resolved
    table's ``storage``, else its ``TableConfig.storage``: an object with a ``kind``
    attribute, and a ``keyed_kind`` for dynamic tables where they need another), else
    ``"keyed"`` for a dynamic table (``vocabulary_size=None``) and ``"dense"`` for a fixed
    one."""
    dynamic = table.config.vocabulary_size is None
    storage = getattr(table, "storage", None) or getattr(table.config, "storage", None)
    kind = getattr(storage, "keyed_kind", None) if dynamic else None
    kind = kind or getattr(storage, "kind", None)
    if kind is not None:
        return kind
    return "keyed" if dynamic else "dense"


def _class(kind: str, table: str) -> Any:
    if kind not in ROWS:
        raise ValueError(
            f"table '{table}': no row storage of kind {kind!r} is registered (known: "
            f"{sorted(ROWS)}); register one with embcore.rows.register"
        )
    cls = ROWS[kind]
    if isinstance(cls, str):
        module, name = cls.split(":")
        cls = ROWS[kind] = getattr(importlib.import_module(module), name)
    return cls


def row_class(table: ResolvedTable) -> type[RowStore]:
    """The class of ``table``'s row storage (its ``records``, without building one)."""
    return _class(kind_of(table), table.name)


def make_rows(table: ResolvedTable, env: RowEnv, **part: Any) -> RowStore:
    """The row storage of ``table`` on this process, of the kind :func:`kind_of` picks.

    Args:
        part: which part of the table it holds, as the kind takes it: nothing for the whole
            table in one process; ``piece=`` (:class:`embcore.rows.Piece`) for a dense
            shard; ``shard=True`` for one key shard of a keyed table.
    """
    return row_class(table)(table, env, **part)  # type: ignore[call-arg]


def planned_memory(table: ResolvedTable, rows: int, cols: int) -> dict[str, int] | None:
    """Bytes per tier (``{"ram": ...}``, ``{"ram": ..., "disk": ...}``) that a piece of
    ``rows`` rows and ``cols`` columns of ``table`` takes, as its row storage's
    :meth:`~RowStore.memory` reports it once built and filled (the kind's classmethod
    ``planned_memory``); ``None`` when the kind does not say."""
    plan = getattr(row_class(table), "planned_memory", None)
    return None if plan is None else plan(table, rows, cols)


def placements(table: ResolvedTable) -> tuple[str, ...] | None:
    """The sharding placements whose pieces ``table``'s kind can hold, named as the
    planner's overrides name them (``"table_wise"``, ``"row_wise:div"``); ``None``: all."""
    return getattr(row_class(table), "placements", None)


def close_rows(rows: Iterable[Any]) -> None:
    """Release what each row storage holds outside memory (its ``close()``, where the kind
    has one: files, locks)."""
    for r in rows:
        close = getattr(r, "close", None)
        if close is not None:
            close()
