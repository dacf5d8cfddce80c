"""The training lookup of every table of a step, the keyed ones in one kernel call.

:func:`map_training` maps each row storage's batches to rows (``store.map(batches, True)``,
in table order), but finds or inserts the keys of every :class:`~.keyed.KeyedRows` that
admits on first sight in one call of :func:`embcore.dynamic.batch.train_many`, which also
writes their new rows' default values. See docs/dynamic_tables.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from embcore.dynamic.batch import Fill, train_many
from embcore.dynamic.keyspace import Admitted
from embcore.inputs import FeatureBatch
from embcore.rows._mapped import split_mapped
from embcore.rows.keyed import KeyedRows, _keys_of

__all__ = ["map_training"]


def map_training(stores: Sequence[Any], features: Sequence[Sequence[FeatureBatch]]) -> list:
    """Every row storage's training lookup of its batches (``store.map(batches, True)``, in
    table order), with the :attr:`KeyedRows.batched` tables' keys found or inserted in one
    kernel call (:func:`embcore.dynamic.batch.train_many`) that also writes their new rows'
    default values. Room is made in every table before any table changes.

    Raises:
        IndexMemoryError: a table could not grow; no table has changed.
    """
    fast = [i for i, s in enumerate(stores) if isinstance(s, KeyedRows) and s.batched]
    taken = set(fast)
    for i, (store, batches) in enumerate(zip(stores, features, strict=True)):
        if i not in taken:
            store.reserve(batches)
    admitted: dict[int, Admitted] = {}
    filled: set[int] = set()
    if fast:

        def prepare(j: int, rows: int) -> Fill | None:
            store = stores[fast[j]]
            store._reserve(rows)
            fill = store.fill()
            if fill is not None:
                filled.add(fast[j])
            return fill

        spaces = [stores[i].space for i in fast]
        keys = [_keys_of(features[i]) for i in fast]
        admitted = dict(zip(fast, train_many(spaces, keys, 1, prepare), strict=True))
    out = []
    for i, (store, batches) in enumerate(zip(stores, features, strict=True)):
        got = admitted.get(i)
        if got is None:
            out.append(store.map(batches, True))
            continue
        if i not in filled:  # a user initializer, called in table order as before
            store._initialise(got.new_keys, got.new_rows)
        out.append(store._trained_as(batches, split_mapped(batches, got.rows), 0))
    return out
