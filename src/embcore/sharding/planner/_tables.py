"""The planner's view of the tables: sizes and expected ids per step, from the feature config
and, when given, lookup statistics. See ``docs/sharding.md`` ("Plans")."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from embcore.config import ResolvedFeature, ResolvedTable, resolve
from embcore.optimizers.base import Optimizer
from embcore.rows import placements, planned_memory
from embcore.sharding.schemes import PlannedTable, is_dynamic
from embcore.sharding.schemes._cost import F32_BYTES
from embcore.sharding.schemes.key_hash import INDEX_BYTES_PER_KEY

__all__ = ["DYNAMIC_EXPECTED_ROWS", "Resolved", "expected_rows", "planned_tables", "resolved"]

#: The rows the planner expects a dynamic table without ``max_rows`` to hold.
DYNAMIC_EXPECTED_ROWS = 1 << 20

#: ``(features, tables)`` as :func:`embcore.config.resolve` returns them.
Resolved = tuple[list[ResolvedFeature], list[ResolvedTable]]


def resolved(feature_config: Any, optimizer: Optimizer | None) -> Resolved:
    """``feature_config`` resolved, unless it already is a ``(features, tables)`` pair from
    :func:`embcore.config.resolve` (whose tables carry their optimizers)."""
    if (
        isinstance(feature_config, tuple)
        and len(feature_config) == 2
        and all(isinstance(part, list) for part in feature_config)
        and feature_config[0]
        and all(isinstance(f, ResolvedFeature) for f in feature_config[0])
        and all(isinstance(t, ResolvedTable) for t in feature_config[1])
    ):
        return feature_config
    return resolve(feature_config, optimizer)


def planned_tables(
    config: Resolved, batch_size: int, stats: Mapping[str, Any] | None
) -> list[PlannedTable]:
    """Every table as the cost model sees it, in table order."""
    features, tables = config
    out = []
    for t in tables:
        specs = t.optimizer.slot_specs() if t.optimizer else ()
        lengths = [features[i].config.max_sequence_length or 1 for i in t.features]
        samples = batch_size * sum(lengths)
        ids_per_example, unique_ratio = float(sum(lengths)), 1.0
        table_stats = stats.get(t.name) if stats is not None else None
        if table_stats is not None:
            ids_per_example, unique_ratio = _stat(table_stats, t.name)
        ids = batch_size * ids_per_example
        rows = expected_rows(t, table_stats)
        out.append(
            PlannedTable(
                name=t.name,
                vocab=rows,
                dim=t.dim,
                col_bytes=F32_BYTES * (1 + sum(not s.rowwise for s in specs)),
                row_bytes=F32_BYTES * sum(s.rowwise for s in specs),
                samples=float(samples),
                ids=ids,
                unique=min(float(rows), ids * unique_ratio),
                element_wise=not any(s.rowwise for s in specs),
                dynamic=is_dynamic(t),
                placements=placements(t),
                memory_of=_memory_of(t),
                index_bytes=INDEX_BYTES_PER_KEY if is_dynamic(t) else 0,
            )
        )
    return out


def _memory_of(table: ResolvedTable) -> Any:
    """``(rows, cols) -> bytes per tier`` as ``table``'s row storage reports it, or ``None``
    (the cost model's own estimate of its rows: a dynamic table in memory)."""
    if planned_memory(table, 0, table.dim) is None:
        return None
    return partial(planned_memory, table)


def expected_rows(table: ResolvedTable, stats: Any = None) -> int:
    """The rows a table holds: its vocabulary, or for a dynamic table its eviction's
    ``max_rows`` (a total over the ranks), else the rows its lookup statistics saw it hold
    (``stats``: an ``embcore.stats.TableStats`` or a dict with ``rows_held``), else
    :data:`DYNAMIC_EXPECTED_ROWS`."""
    if not is_dynamic(table):
        return table.vocabulary_size
    eviction = getattr(table.config, "eviction", None)
    max_rows = getattr(eviction, "max_rows", None)
    if max_rows is not None:
        return int(max_rows)
    held = stats.get("rows_held") if isinstance(stats, Mapping) else getattr(stats, "rows_held", 0)
    if isinstance(held, int) and not isinstance(held, bool) and held > 0:
        return held
    return DYNAMIC_EXPECTED_ROWS


def _stat(value: Any, name: str) -> tuple[float, float]:
    """``(ids per example, unique fraction)`` from an ``embcore.stats.TableStats`` or a dict."""
    if isinstance(value, Mapping):
        ipe, uniq = value.get("ids_per_example"), value.get("unique_ratio", 1.0)
    else:
        ipe, uniq = (
            getattr(value, "mean_ids_per_example", None),
            getattr(value, "unique_ratio", 1.0),
        )
    if not isinstance(ipe, (int, float)) or ipe < 0 or not 0 <= uniq <= 1:
        raise ValueError(
            f"plan: statistics of table '{name}' need ids_per_example >= 0 and unique_ratio in "
            f"[0, 1], got {ipe!r} and {uniq!r}"
        )
    return float(ipe), float(uniq)
