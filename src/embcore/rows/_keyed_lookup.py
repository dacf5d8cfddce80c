"""The training lookup and the step boundary of every table of a step, the keyed ones in one
kernel call each.

:func:`map_training` maps each row storage's batches to rows (``store.map(batches, True)``,
in table order), but finds or inserts the keys of every :class:`~.keyed.KeyedRows` that
admits on first sight in one call of :func:`embcore.dynamic.batch.train_many`, which also
writes their new rows' default values. :func:`end_steps` ends each row storage's step
(``store.end_step()``), those tables' eviction and sink reset in one call of
:func:`embcore.dynamic.boundary.end_many`. See docs/dynamic_tables.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from embcore.dynamic.batch import Fill, train_many
from embcore.dynamic.boundary import end_many
from embcore.dynamic.keyspace import Admitted
from embcore.inputs import FeatureBatch
from embcore.rows._mapped import split_mapped
from embcore.rows.keyed import KeyedRows, _keys_of

__all__ = ["end_steps", "map_training"]


def map_training(stores: Sequence[Any], features: Sequence[Sequence[FeatureBatch]]) -> list:
    """Every row storage's training lookup of its batches (``store.map(batches, True)``, in
    table order), with the :attr:`KeyedRows.batched` tables' keys found or inserted in one
    kernel call (:func:`embcore.dynamic.batch.train_many`) that also writes their new rows'
    default values. Room is made in every table before any table changes.

    Raises:
        IndexMemoryError: a table could not grow; no table has changed.
    """
    fast = _batched(stores)
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


def end_steps(stores: Sequence[Any]) -> None:
    """Every row storage's :meth:`end_step`, in table order, with the :attr:`KeyedRows.batched`
    tables that evict ending their step (eviction, and sink reset for float32 rows) in one
    kernel call
    (:func:`embcore.dynamic.boundary.end_many`)."""
    # tables that never evict keep their own end_step (two torch calls): describing them to
    # the kernel cost more than it saved (0.78 against 0.56 ms a step over W3's 26 tables)
    fast = [i for i in _batched(stores) if stores[i].flush_before_training_lookup]
    taken = set(fast)
    for i, store in enumerate(stores):
        if i not in taken:
            store.end_step()
    if not fast:
        return
    sinks = [stores[i].sink() for i in fast]
    for i, sink in zip(fast, sinks, strict=True):
        if sink is None:  # reset here: other dtypes than the kernel's
            stores[i].reset_sink()
    end_many([stores[i].space for i in fast], sinks)


def _batched(stores: Sequence[Any]) -> list[int]:
    """The tables whose lookup and step boundary run in the shared kernel calls."""
    return [i for i, s in enumerate(stores) if isinstance(s, KeyedRows) and s.batched]
