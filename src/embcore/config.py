"""Table and feature configs, and their resolution into one engine layout
(docs/semantics.md §1.10-§1.13).

Configs are frozen and never mutated. :func:`resolve` does every cross-object check in one
place: it flattens the feature structure in ``tf.nest`` order, orders tables by first use,
gives unnamed tables ``table_<i>`` names and fills in the global optimizer, into new records.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from embcore import nest
from embcore._validate import check_bool, check_int, describe
from embcore.optimizers.base import Optimizer
from embcore.storage import DiskStorage, cached_row_bytes

__all__ = [
    "COMBINERS",
    "CountAdmission",
    "Eviction",
    "FeatureConfig",
    "ResolvedFeature",
    "ResolvedTable",
    "TableConfig",
    "resolve",
    "split_cache",
]

Combiner = Literal["mean", "sum", "sqrtn"]
COMBINERS: tuple[str, ...] = ("mean", "sum", "sqrtn")

Initializer = Callable[..., Any]
"""``initializer(shape, dtype=torch.float32) -> Tensor | ndarray`` of the full table shape."""


# ------------------------------------------------------------- dynamic tables' policies
# ``CountAdmission`` and ``Eviction`` are the configs of a dynamic table's admission and
# eviction; their rules over arrays are ``embcore.dynamic.policy`` (docs/dynamic_tables.md).


@dataclass(frozen=True)
class CountAdmission:
    """Admit a key once it occurred ``min_count`` times in training lookups
    (``CountAdmission(2)``, like ``Adagrad(0.1)``: the main parameter may be positional).

    Every occurrence counts: repeats within one lookup and in every feature sharing the table.
    Before admission a key reads zeros and its gradient is dropped.
    """

    min_count: int = 1

    def __post_init__(self) -> None:
        check_int("CountAdmission", "min_count", self.min_count, minimum=1)


@dataclass(frozen=True, kw_only=True)
class Eviction:
    """Remove rows at step boundaries: after ``steps_to_live`` steps without a training
    lookup, and beyond ``max_rows`` rows (least frequently used first). ``None``: no limit."""

    steps_to_live: int | None = None
    max_rows: int | None = None

    def __post_init__(self) -> None:
        _optional_int("steps_to_live", self.steps_to_live)
        _optional_int("max_rows", self.max_rows)

    @property
    def evicts(self) -> bool:
        """Whether any key may be evicted (``steps_to_live`` or ``max_rows`` set)."""
        return self.steps_to_live is not None or self.max_rows is not None


def _optional_int(field: str, value: Any) -> None:
    if value is not None:
        check_int("Eviction", field, value, minimum=1)


@dataclass(frozen=True, eq=False)
class TableConfig:
    """One embedding table. Tables are shared between features by object identity.

    Args:
        vocabulary_size: number of rows, an int >= 1 (NumPy ints accepted); ``None`` makes a
            *dynamic* table: any int64 id is a key that gets its own row when admitted
            (docs/dynamic_tables.md).
        dim: width of a row, an int >= 1.
        initializer: ``initializer(shape, dtype=torch.float32)`` returning the full table, or
            ``None`` for a truncated normal with mean 0 and std ``1/sqrt(dim)``, cut at 2 std,
            seeded by the engine's seed and the table name. A dynamic table calls it with
            ``(n_new, dim)`` for the keys admitted in one lookup, in ascending key order;
            its default draws each key's row from ``(seed, table name, key)`` alone.
        optimizer: this table's optimizer; ``None`` uses the engine's global optimizer.
        combiner: ``"mean"``, ``"sum"`` or ``"sqrtn"``: how a sample's ids are combined.
        name: unique table name; ``None`` becomes ``table_<i>`` by first use
            (docs/semantics.md §1.13).
        safe_lookup: prune like ``safe_embedding_lookup_sparse`` (docs/semantics.md §2.8): drop ids
            < 0 and, for mean/sqrtn, ids with weight <= 0. Off by default: such ids are errors.
            Not for dynamic tables (negative ids are keys there).
        admission: a dynamic table's ``CountAdmission``; ``None`` admits on first sight.
        eviction: a dynamic table's ``Eviction``; ``None`` never evicts.
        storage: where the rows live: ``None`` in memory (or the engine's ``storage``);
            :class:`~embcore.DiskStorage` on local disk behind a RAM cache of rows, with
            the numbers of the in-memory table (docs/disk_tables.md), fixed or dynamic.
        initial_capacity: a dynamic table's keys to reserve memory for when the engine is
            built (its key index, row metadata and, in memory, its rows and optimizer slots,
            their pages written then), so that training steps pay no growth and no first
            touch of memory until it holds that many keys; it grows past them as without.
            ``None``: start empty. Changes no result (docs/dynamic_tables.md).
    """

    vocabulary_size: int | None
    dim: int
    initializer: Initializer | None = None
    optimizer: Optimizer | None = None
    combiner: Combiner = "mean"
    name: str | None = None
    safe_lookup: bool = False
    admission: Any = None
    eviction: Any = None
    storage: DiskStorage | None = None
    initial_capacity: int | None = None

    def __post_init__(self) -> None:
        owner = f"TableConfig(name={self.name!r})"
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ValueError(f"{owner}: name must be a non-empty str or None, got {self.name!r}")
        if self.vocabulary_size is not None:
            object.__setattr__(
                self,
                "vocabulary_size",
                check_int(owner, "vocabulary_size", self.vocabulary_size, minimum=1),
            )
        _check_dynamic(owner, self)
        object.__setattr__(self, "dim", check_int(owner, "dim", self.dim, minimum=1))
        if self.initializer is not None and not callable(self.initializer):
            raise ValueError(
                f"{owner}: initializer must be callable or None, got {describe(self.initializer)}"
            )
        if self.optimizer is not None and not isinstance(self.optimizer, Optimizer):
            raise ValueError(
                f"{owner}: optimizer must be an embcore optimizer (SGD, Adagrad, "
                f"AdagradMomentum, Adam, FTRL, RowwiseAdagrad) or None, got "
                f"{describe(self.optimizer)}"
            )
        if self.combiner not in COMBINERS:
            raise ValueError(
                f"{owner}: combiner must be one of {list(COMBINERS)}, got {self.combiner!r}"
            )
        check_bool(owner, "safe_lookup", self.safe_lookup)
        _check_storage(owner, self.storage)


def _check_storage(owner: str, storage: Any) -> None:
    """``storage``: ``None`` or a :class:`DiskStorage` (fixed and dynamic tables)."""
    if storage is not None and not isinstance(storage, DiskStorage):
        raise ValueError(
            f"{owner}: storage must be an embcore.DiskStorage or None (in memory), got "
            f"{describe(storage)}"
        )


def _check_dynamic(owner: str, table: TableConfig) -> None:
    """``admission`` / ``eviction`` only on dynamic tables, and of the right types."""
    if table.vocabulary_size is not None:
        for field_name in ("admission", "eviction", "initial_capacity"):
            if getattr(table, field_name) is not None:
                raise ValueError(
                    f"{owner}: {field_name}= is for dynamic tables (vocabulary_size=None), "
                    f"got vocabulary_size={table.vocabulary_size}"
                )
        return
    for field_name, kind in (("admission", CountAdmission), ("eviction", Eviction)):
        value = getattr(table, field_name)
        if value is not None and not isinstance(value, kind):
            raise ValueError(
                f"{owner}: {field_name} must be an embcore.{kind.__name__} or None, got "
                f"{describe(value)}"
            )
    if table.initial_capacity is not None:
        object.__setattr__(
            table,
            "initial_capacity",
            check_int(owner, "initial_capacity", table.initial_capacity, minimum=1),
        )
    if table.safe_lookup:
        raise ValueError(
            f"{owner}: safe_lookup=True drops ids < 0, but every int64 id is a key of a "
            "dynamic table (vocabulary_size=None); leave safe_lookup off"
        )


@dataclass(frozen=True, eq=False)
class FeatureConfig:
    """One input feature looked up in a table.

    Args:
        table: the :class:`TableConfig` this feature reads; several features may share one.
        max_sequence_length: 0 for a pooled feature; ``L > 0`` makes rank-2 sparse or ragged
            input a sequence with activations ``(B, L, dim)`` (docs/semantics.md §2.4).
        output_shape: the activation shape without ``dim`` (docs/semantics.md §2.5); one entry may
            be ``None`` or ``-1`` and is inferred from the batch. ``None`` derives it from the
            input.
        name: a name for messages; defaults to the feature's path in the structure.
    """

    table: TableConfig
    max_sequence_length: int = 0
    output_shape: tuple[int | None, ...] | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        owner = f"FeatureConfig(name={self.name!r})"
        if not isinstance(self.table, TableConfig):
            raise ValueError(f"{owner}: table must be a TableConfig, got {describe(self.table)}")
        object.__setattr__(
            self,
            "max_sequence_length",
            check_int(owner, "max_sequence_length", self.max_sequence_length, minimum=0),
        )
        if self.output_shape is not None:
            object.__setattr__(self, "output_shape", _check_output_shape(owner, self.output_shape))
        if self.name is not None and not isinstance(self.name, str):
            raise ValueError(f"{owner}: name must be a str or None, got {describe(self.name)}")


def _check_output_shape(owner: str, shape: Any) -> tuple[int | None, ...]:
    if not isinstance(shape, Sequence) or isinstance(shape, str):
        raise ValueError(f"{owner}: output_shape must be a list or tuple of ints, got {shape!r}")
    out: list[int | None] = []
    for d in shape:
        if d is None or (isinstance(d, numbers.Integral) and not isinstance(d, bool) and d == -1):
            out.append(None)
        elif isinstance(d, numbers.Integral) and not isinstance(d, bool) and d >= 0:
            out.append(int(d))
        else:
            raise ValueError(
                f"{owner}: output_shape entries must be ints >= 0, or one None/-1, got {shape!r}"
            )
    if out.count(None) > 1:
        raise ValueError(
            f"{owner}: output_shape may leave at most one entry unknown, got {shape!r}"
        )
    return tuple(out)


@dataclass(frozen=True)
class ResolvedTable:
    """A table as the engine uses it: its config, final name, optimizer and features."""

    index: int
    name: str
    config: TableConfig
    optimizer: Optimizer | None
    features: tuple[int, ...] = field(default=())
    #: where the rows live (``None``: in memory); a disk table's ``cache_bytes`` is its own
    storage: DiskStorage | None = None

    @property
    def vocabulary_size(self) -> int | None:
        """Rows of a fixed table; ``None`` for a dynamic one."""
        return self.config.vocabulary_size

    @property
    def dynamic(self) -> bool:
        """Whether any int64 id is a key of this table (``vocabulary_size=None``)."""
        return self.config.vocabulary_size is None

    @property
    def dim(self) -> int:
        return self.config.dim

    @property
    def combiner(self) -> str:
        return self.config.combiner


@dataclass(frozen=True)
class ResolvedFeature:
    """A feature as the engine uses it: its position, name, config and table index."""

    index: int
    name: str
    config: FeatureConfig
    table: int


def _is_feature(x: Any) -> bool:
    return isinstance(x, FeatureConfig)


def resolve(
    feature_config: Any, optimizer: Optimizer | None, storage: DiskStorage | None = None
) -> tuple[list[ResolvedFeature], list[ResolvedTable]]:
    """Flatten and check a feature structure; order, name and equip its tables.

    ``storage``: the engine's default for tables without their own; its ``cache_bytes`` is
    split between them (:func:`split_cache`).

    Returns:
        The features in ``tf.nest`` order and the tables in order of first use.

    Raises:
        ValueError: a leaf is not a FeatureConfig, two tables share a name, or the global
            optimizer is not an embcore optimizer.
    """
    if optimizer is not None and not isinstance(optimizer, Optimizer):
        raise ValueError(
            "EmbeddingEngine: optimizer must be an embcore optimizer (SGD, Adagrad, "
            f"AdagradMomentum, Adam, FTRL, RowwiseAdagrad) or None, got {describe(optimizer)}"
        )
    flat = nest.flatten_with_paths(feature_config, is_leaf=_is_feature)
    if not flat:
        raise ValueError("EmbeddingEngine: feature_config has no features")
    table_index: dict[int, int] = {}
    configs: list[TableConfig] = []
    features: list[ResolvedFeature] = []
    for i, (path, fc) in enumerate(flat):
        if not isinstance(fc, FeatureConfig):
            raise ValueError(
                f"EmbeddingEngine: feature_config at '{path}' must be a FeatureConfig, "
                f"got {describe(fc)}"
            )
        t = table_index.setdefault(id(fc.table), len(configs))
        if t == len(configs):
            configs.append(fc.table)
        name = fc.name or path or "feature"
        features.append(ResolvedFeature(index=i, name=name, config=fc, table=t))
    names = [fc.name or f"table_{i}" for i, fc in enumerate(configs)]
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            raise ValueError(
                f"EmbeddingEngine: multiple tables with name {name!r} (tables {seen[name]} and "
                f"{i} in order of first use); table names must be unique"
            )
        seen[name] = i
    fnames = [f.name for f in features]
    dup = sorted({n for n in fnames if fnames.count(n) > 1})
    if dup:
        raise ValueError(f"EmbeddingEngine: feature names must be unique, repeated: {dup}")
    tables = [
        ResolvedTable(
            index=i,
            name=names[i],
            config=cfg,
            optimizer=cfg.optimizer if cfg.optimizer is not None else optimizer,
            features=tuple(f.index for f in features if f.table == i),
            storage=cfg.storage,
        )
        for i, cfg in enumerate(configs)
    ]
    if storage is not None:
        _check_storage("EmbeddingEngine", storage)
        tables = split_cache(tables, storage)
    return features, tables


def split_cache(tables: list[ResolvedTable], storage: DiskStorage) -> list[ResolvedTable]:
    """Give ``storage`` to the tables without a storage of their own, splitting its
    ``cache_bytes`` evenly (every table sees one lookup per sample, whatever its size): a
    fixed table smaller than its share takes its size (RAM a cached row costs, times its
    rows), and the others (dynamic tables among them) share the rest evenly."""
    left = [t for t in tables if t.storage is None]
    size = {
        t.index: t.vocabulary_size * cached_row_bytes(t.dim, _slot_floats(t))
        if t.vocabulary_size is not None
        else float("inf")
        for t in left
    }
    budget, share = storage.cache_bytes, {}
    for i, t in enumerate(sorted(left, key=lambda t: size[t.index])):
        share[t.index] = int(min(size[t.index], budget // (len(left) - i)))
        budget -= share[t.index]
    return [
        replace(t, storage=replace(storage, cache_bytes=max(1, share[t.index])))
        if t.index in share
        else t
        for t in tables
    ]


def _slot_floats(table: ResolvedTable) -> int:
    opt = table.optimizer
    return sum(1 if s.rowwise else table.dim for s in opt.slot_specs()) if opt else 0
