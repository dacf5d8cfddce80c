"""The serving lookup: an engine's tables looked up with plain PyTorch operations.

:class:`ServingLookup` computes exactly what a lookup-only :class:`embcore.EmbeddingEngine`
returns (docs/semantics.md §2.3: ``activation[s] = sum_j gain_j * table[id_j]``), but with
``index_select``, ``searchsorted`` and ``index_add`` on tensors only: no NumPy, no Numba, no
Python decision on a tensor's values. ``torch.export`` traces it into a program that runs with
PyTorch alone, for any batch size. See docs/serving.md.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from embcore import nest
from embcore._input_checks import check_ids
from embcore.config import FeatureConfig, ResolvedFeature, ResolvedTable
from embcore.inputs import RaggedIds
from embcore.keyed_jagged import unpack_keyed_jagged

__all__ = ["ServingLookup"]


def _is_feature(x: Any) -> bool:
    return isinstance(x, FeatureConfig)


class ServingLookup(nn.Module):
    """A lookup-only view of an engine's tables, traceable by ``torch.export``.

    Each feature's input is one of (docs/serving.md)::

        ids                      (B,) or (B, 1) integers: one id per sample -> (B, dim)
        (values, row_splits)     (N,) ids and (B+1,) CSR row splits -> (B, dim), or
                                 (B, L, dim) for a sequence feature (max_sequence_length L)
        (values, row_splits, weights)   the same with (N,) float32 per-id weights

    and, in eager calls, :class:`embcore.RaggedIds` or a TorchRec ``KeyedJaggedTensor``.
    Pooled rows are combined with the table's combiner (sum, mean, sqrtn), safe_lookup tables
    prune ids < 0 (and weights <= 0 for mean and sqrtn), sequence features place position
    ``p < L`` of row ``b`` at ``[b, p]``: all as the engine does (docs/semantics.md §2).

    Bad values (an id outside ``[0, vocab)``, row splits that do not run from 0 to ``N`` without
    decreasing, non-finite weights) raise ``RuntimeError`` naming the feature and table, in
    eager calls and in the exported program alike (``torch._assert_async``).

    Args:
        engine: an :class:`embcore.EmbeddingEngine`. Its table tensors are shared, not copied.

    Raises:
        ValueError: a feature has a configured ``output_shape`` (not supported here).
    """

    def __init__(self, engine: Any) -> None:
        super().__init__()
        for f in engine.features:
            if f.config.output_shape is not None:
                raise ValueError(
                    f"ServingLookup: feature '{f.name}' has output_shape "
                    f"{list(f.config.output_shape)}; serving lookups support features without "
                    "an output_shape only (reshape the activations in the model instead)"
                )
        self._structure = engine.structure
        self._features: tuple[ResolvedFeature, ...] = engine.features
        self._tables: tuple[ResolvedTable, ...] = engine.tables
        #: the tables whose ids are keys (looked up among sorted keys), by index
        self._keyed: set[int] = set()
        for snap in engine.snapshot():
            t, weight, keys = snap.table, snap.weight, snap.keys
            if keys is not None:  # rows in ascending key order, then the zero sink row
                self._keyed.add(t.index)
                self.register_buffer(f"keys_{t.index}", torch.cat([keys, keys.new_zeros(1)]))
                weight = torch.cat([weight, weight.new_zeros(1, t.dim)])
            self.register_buffer(f"table_{t.index}", weight.detach())

    def load_dynamic(self, name: str, keys: Tensor, rows: Tensor) -> None:
        """Serve dynamic table ``name`` from ``keys`` and their ``rows`` (a serving bundle's
        tensors) instead of the snapshot taken from the engine.

        Args:
            keys: ``(R,) int64``, strictly ascending (``engine.table_keys``' order).
            rows: ``(R, dim) float32``, row ``i`` the row of ``keys[i]``.

        Raises:
            ValueError: ``name`` is not a dynamic table, or the tensors do not fit it (naming
                the table, the shapes and dtypes, or the first key out of order).
        """
        table = next((t for t in self._tables if t.name == name), None)
        if table is None or table.index not in self._keyed:
            raise ValueError(f"ServingLookup.load_dynamic: '{name}' is not a dynamic table")
        if keys.dtype != torch.int64 or keys.dim() != 1:
            raise ValueError(
                f"table '{name}': keys must be (R,) int64, got {keys.dtype} {tuple(keys.shape)}"
            )
        if rows.dtype != torch.float32 or tuple(rows.shape) != (keys.shape[0], table.dim):
            raise ValueError(
                f"table '{name}': rows must be ({keys.shape[0]}, {table.dim}) float32 (one "
                f"per key), got {rows.dtype} {tuple(rows.shape)}"
            )
        out_of_order = (keys[1:] <= keys[:-1]).nonzero()
        if out_of_order.numel():
            i = int(out_of_order[0]) + 1
            raise ValueError(
                f"table '{name}': keys must be strictly ascending, got key {int(keys[i])} at "
                f"position {i} after {int(keys[i - 1])}"
            )
        self.register_buffer(f"keys_{table.index}", torch.cat([keys, keys.new_zeros(1)]))
        self.register_buffer(
            f"table_{table.index}", torch.cat([rows, rows.new_zeros(1, table.dim)])
        )

    @property
    def feature_names(self) -> list[str]:
        """Feature names in ``tf.nest`` order, as the engine's."""
        return [f.name for f in self._features]

    def extra_repr(self) -> str:
        parts = []
        for t in self._tables:
            rows = getattr(self, f"table_{t.index}").shape[0]
            size = f"dynamic {rows - 1}" if t.index in self._keyed else str(rows)
            parts.append(f"{t.name}: {size}x{t.dim} {t.combiner}")
        return f"tables=[{'; '.join(parts)}]"

    def forward(self, features: Any, weights: Any = None) -> Any:
        """Activations in the structure of the engine's feature config.

        Args:
            features: the engine's structure with one input per feature (class docstring).
            weights: optional, as the engine's: a structure of ``RaggedIds`` (or ``(N,)``
                tensors) of per-id weights; a 3-tuple input carries its own.
        """
        return nest.pack(self._structure, self._flat(features, weights), is_leaf=_is_feature)

    def stacked(self, features: Any, weights: Any = None) -> Tensor:
        """``(*output_shape, F, dim)``: feature ``f``'s activation at ``[..., f, :]``, as
        ``EmbeddingEngine.stacked`` (features in :attr:`feature_names` order)."""
        dims = {self._tables[f.table].dim for f in self._features}
        if len(dims) != 1:
            raise ValueError(
                f"ServingLookup.stacked: the features' tables have dims {sorted(dims)}; "
                "stacked() needs one dim (use forward() for mixed features)"
            )
        return torch.stack(self._flat(features, weights), dim=-2)

    # ---------------------------------------------------------------------------- lookups
    def _flat(self, features: Any, weights: Any) -> list[Tensor]:
        features, weights = unpack_keyed_jagged(features, weights)  # TorchRec's KJT, by key
        ids = nest.map_up_to(self._structure, features, "features", is_leaf=_is_feature)
        if weights is None:
            ws: list[Any] = [None] * len(ids)
        else:
            ws = nest.map_up_to(
                self._structure, weights, "weights", is_leaf=_is_feature, missing_ok=True
            )
        return [self._feature(f, x, w) for f, x, w in zip(self._features, ids, ws, strict=True)]

    def _feature(self, feature: ResolvedFeature, x: Any, w: Any) -> Tensor:
        table = self._tables[feature.table]
        weight: Tensor = getattr(self, f"table_{table.index}")
        if isinstance(x, RaggedIds):
            x = (x.values, x.row_splits)
        if isinstance(x, Tensor):
            if w is not None:
                raise ValueError(
                    f"feature '{feature.name}': weights were given for dense input; dense ids "
                    "take no weights (use (values, row_splits, weights))"
                )
            return self._dense(feature, table, weight, x)
        if not isinstance(x, (tuple, list)) or len(x) not in (2, 3):
            raise TypeError(
                f"feature '{feature.name}': expected an id tensor, (values, row_splits), "
                f"(values, row_splits, weights) or RaggedIds, got {type(x).__name__}"
            )
        values, splits, *rest = x
        if w is not None and rest:
            raise ValueError(f"feature '{feature.name}': weights were given twice")
        w = rest[0] if rest else (w.values if isinstance(w, RaggedIds) else w)
        return self._ragged(feature, table, weight, values, splits, w)

    def _dense(
        self, feature: ResolvedFeature, table: ResolvedTable, weight: Tensor, ids: Tensor
    ) -> Tensor:
        """One id per sample: ``(B,)`` or ``(B, ..., 1)`` -> ``(B, ..., dim)`` (gain 1)."""
        name = feature.name
        if feature.config.max_sequence_length > 0:
            raise ValueError(
                f"feature '{name}' is a sequence feature (max_sequence_length="
                f"{feature.config.max_sequence_length}); feed (values, row_splits)"
            )
        if ids.dim() == 0 or (ids.dim() >= 2 and ids.shape[-1] != 1):
            raise ValueError(
                f"feature '{name}': dense ids must have shape (B,) or (B, ..., 1), got "
                f"{tuple(ids.shape)}"
            )
        ids = check_ids(name, ids, "ids")
        if ids.dim() >= 2:
            ids = ids.squeeze(-1)  # (B, ..., 1) -> (B, ...): no reshape, no size guard
        ids = self._row_numbers(table, name, ids)
        if not table.config.safe_lookup:
            return nn.functional.embedding(ids, weight).float()
        keep = ids >= 0  # pruned: the sample is empty, its activation zeros
        rows = nn.functional.embedding(ids.clamp(min=0), weight).float()
        return torch.where(keep[..., None], rows, 0.0)

    def _ragged(
        self,
        feature: ResolvedFeature,
        table: ResolvedTable,
        weight: Tensor,
        values: Tensor,
        splits: Tensor,
        w: Tensor | None,
    ) -> Tensor:
        """``(N,)`` ids in ``B`` rows -> ``(B, dim)`` pooled or ``(B, L, dim)`` sequence."""
        name = feature.name
        values = check_ids(name, values, "ragged id values")
        splits = check_ids(name, splits, "row_splits")
        if values.dim() != 1 or splits.dim() != 1:
            raise ValueError(
                f"feature '{name}': values and row_splits must be 1-D, got shapes "
                f"{tuple(values.shape)} and {tuple(splits.shape)}"
            )
        n, rows = values.shape[0], splits.shape[0] - 1
        torch._assert_async(
            (splits[0] == 0) & (splits[-1] == n) & (splits[1:] >= splits[:-1]).all(),
            f"feature '{name}': row_splits must start at 0, end at len(values) and never decrease",
        )
        row_numbers = self._row_numbers(table, name, values)
        if w is not None:
            if w.dtype != torch.float32 or w.shape != values.shape:
                raise ValueError(
                    f"feature '{name}': weights must be float32 of the ids' shape "
                    f"{tuple(values.shape)}, got {w.dtype} {tuple(w.shape)}"
                )
            torch._assert_async(
                torch.isfinite(w).all(), f"feature '{name}': weights must be finite"
            )
        position = torch.arange(n, device=values.device)
        row = torch.searchsorted(splits.contiguous(), position, right=True) - 1  # (N,) row of id
        length = feature.config.max_sequence_length
        keep = values >= 0 if table.config.safe_lookup else None
        combiner = table.combiner
        if length > 0:  # sequence: each (row, position < L) is a sample of its own, summed
            position = position - splits[row]
            in_seq = position < length
            keep = in_seq if keep is None else keep & in_seq
            sample = torch.where(in_seq, row * length + position, 0)
            samples, combiner, shape = rows * length, "sum", (rows, length, table.dim)
        else:
            sample, samples, shape = row, rows, (rows, table.dim)
        if keep is not None and w is not None and combiner != "sum":
            keep = keep & (w > 0)
        gain = _gains(combiner, w, keep, sample, samples, n, values.device)
        ids = row_numbers if keep is None else torch.where(keep, row_numbers, 0)
        contrib = weight.index_select(0, ids).float() * gain[:, None]  # (N, dim)
        out = torch.zeros(samples, table.dim, dtype=torch.float32, device=values.device)
        return out.index_add(0, sample, contrib).reshape(shape)

    def _row_numbers(self, table: ResolvedTable, name: str, ids: Tensor) -> Tensor:
        """The table rows of ``ids``: the ids themselves for a fixed table (checked to be in
        range), for a dynamic table the position of each key among the sorted keys, or the
        zero sink row after them for a key without a row."""
        if table.index in self._keyed:
            keys = getattr(self, f"keys_{table.index}")
            count = keys.shape[0] - 1  # the last entry is padding, never a match
            ids = ids.clone(memory_format=torch.contiguous_format)  # searchsorted: warns without
            position = torch.searchsorted(keys[:count], ids)  # in [0, count]
            found = (position < count) & (keys[position] == ids)
            return torch.where(found, position, count)
        vocab = table.vocabulary_size
        ok = ids < vocab if table.config.safe_lookup else (ids >= 0) & (ids < vocab)
        torch._assert_async(
            ok.all(),
            f"feature '{name}': an id is out of range for table '{table.name}' with "
            f"vocabulary_size {vocab}; ids must be in [0, {vocab})",
        )
        return ids


def _gains(
    combiner: str,
    w: Tensor | None,
    keep: Tensor | None,
    sample: Tensor,
    samples: Any,
    n: Any,
    device: torch.device,
) -> Tensor:
    """``(N,) float32``: each id's multiplier, its weight times its sample's combiner scale
    (as ``embcore.ops.reference.gains``); pruned ids (``keep`` False) get 0 and count in no
    denominator."""
    if w is None:
        w = torch.ones(n, dtype=torch.float32, device=device)
    if keep is not None:
        w = torch.where(keep, w, 0.0)
    if combiner == "sum":
        return w
    per_id = w if combiner == "mean" else w * w
    denom = torch.zeros(samples, dtype=torch.float32, device=device).index_add(0, sample, per_id)
    if combiner == "sqrtn":
        denom = torch.sqrt(denom)
    scale = torch.where(denom == 0, torch.zeros_like(denom), 1.0 / denom)
    return w * scale[sample]
