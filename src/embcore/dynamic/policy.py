"""Admission and eviction of dynamic tables: their configs and their exact rules.

``CountAdmission(min_count=k)``: a key gets its row in the training lookup in which the number
of its occurrences in training lookups reaches ``k`` (default 1: on first sight).
``Eviction(steps_to_live=S, max_rows=M)``, at the end of every step: a key last looked up in
step ``t`` is removed at the end of step ``t + S``; then, while more than ``M`` rows remain,
the least frequently used go first (ties: least recently used, then smallest key). Both
fields are optional (``None``: no such limit). The functions here are the rules over NumPy
arrays; :mod:`.keyspace` applies them to a table's state. The configs themselves live with the
other configs (:mod:`embcore.config`). See docs/dynamic_tables.md.
"""

from __future__ import annotations

import numpy as np

from embcore.config import CountAdmission, Eviction

__all__ = ["CountAdmission", "Eviction", "expired", "least_used"]


def expired(last_seen: np.ndarray, step: int, steps_to_live: int | None) -> np.ndarray:
    """At the end of step ``step``: which keys' time is up, ``(R,) bool``.

    ``last_seen: (R,) int64`` is the step of each key's last training lookup; a key last seen
    in step ``t`` expires at the end of step ``t + steps_to_live``.
    """
    if steps_to_live is None:
        return np.zeros(last_seen.shape, np.bool_)
    return last_seen <= step - steps_to_live


def least_used(keys: np.ndarray, freq: np.ndarray, last_seen: np.ndarray, count: int) -> np.ndarray:
    """Positions of the ``count`` keys to evict first: ``(count,) int64``, in eviction order.

    Order: lowest ``freq`` first, then lowest ``last_seen``, then smallest key (all ``(R,)
    int64``); keys are distinct, so the order is total and the result unique.
    """
    n = keys.size
    if count <= 0:
        return np.empty(0, np.int64)
    if count >= n:
        return np.lexsort((keys, last_seen, freq)).astype(np.int64)
    # only keys whose frequency is at most the count-th smallest can be chosen (a sort, not
    # np.partition: its selection slows down tenfold on the many equal counts usual here)
    cut = np.sort(freq)[count - 1]
    candidates = np.flatnonzero(freq <= cut)
    order = np.lexsort((keys[candidates], last_seen[candidates], freq[candidates]))
    return candidates[order[:count]].astype(np.int64)
