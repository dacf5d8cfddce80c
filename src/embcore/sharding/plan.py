"""Sharding plans: where each table lives (:class:`TableShard`) and a whole :class:`ShardingPlan`.

Plans are frozen, validate themselves and round-trip through JSON, so a plan can be computed
once (``embcore plan``), reviewed, stored next to a checkpoint and handed to every rank. The
scheme names and each scheme's rules come from :data:`~embcore.sharding.schemes.SCHEMES`; see
``docs/sharding.md``.
"""

from __future__ import annotations

import hashlib
import json
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from embcore.config import ResolvedTable
from embcore.rows import kind_of, placements
from embcore.sharding.schemes import SCHEMES, Scheme, is_dynamic

__all__ = ["ShardingPlan", "TableShard", "check_placement"]

#: The optional TableShard fields; a scheme that does not list one in its ``shard_fields``
#: requires it to be ``None``.
_OPTIONAL_FIELDS = ("partition_strategy", "column_sizes")


def _fingerprint(text: str) -> int:
    """A 64-bit fingerprint of ``text``, the same in every process."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest())


def _int_tuple(owner: str, name: str, value: Any, minimum: int) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(f"{owner}: {name} must be a list of ints, got {value!r}")
    out = []
    for v in value:
        if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < minimum:
            raise ValueError(f"{owner}: {name} must hold ints >= {minimum}, got {list(value)!r}")
        out.append(int(v))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class TableShard:
    """How one table is placed on the ranks of a process group.

    Args:
        scheme: a name in :data:`~embcore.sharding.schemes.SCHEMES`.
        ranks: the ranks holding the table: one rank for ``table_wise``; the rank of each row
            shard (shard p on ``ranks[p]``) for ``row_wise``; the rank of each column shard for
            ``column_wise``; every rank, in order, for ``data_parallel``; the rank of each
            key shard for ``key_hash`` (dynamic tables). Distinct.
        partition_strategy: ``"div"`` or ``"mod"`` for ``row_wise`` (``docs/semantics.md``
            §4.1); ``None`` otherwise.
        column_sizes: for ``column_wise``, the width of each column shard (one per rank, left
            to right, summing to the table's dim); ``None`` otherwise.

    Prefer the constructors :meth:`table_wise`, :meth:`row_wise`, :meth:`column_wise`,
    :meth:`data_parallel` and :meth:`key_hash`.
    """

    scheme: str
    ranks: tuple[int, ...]
    partition_strategy: str | None = None
    column_sizes: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        owner = f"TableShard(scheme={self.scheme!r})"
        if not isinstance(self.scheme, str) or self.scheme not in SCHEMES:
            raise ValueError(f"{owner}: scheme must be one of {list(SCHEMES)}, got {self.scheme!r}")
        ranks = _int_tuple(owner, "ranks", self.ranks, minimum=0)
        if not ranks or len(set(ranks)) != len(ranks):
            raise ValueError(
                f"{owner}: ranks must be a non-empty list of distinct ranks, got {ranks}"
            )
        object.__setattr__(self, "ranks", ranks)
        scheme = self.scheme_class
        if "column_sizes" in scheme.shard_fields:
            sizes = _int_tuple(owner, "column_sizes", self.column_sizes or (), minimum=1)
            object.__setattr__(self, "column_sizes", sizes)
        scheme.check_shard(owner, self)
        for name in _OPTIONAL_FIELDS:
            value = getattr(self, name)
            if name not in scheme.shard_fields and value is not None:
                users = " and ".join(n for n, s in SCHEMES.items() if name in s.shard_fields)
                raise ValueError(f"{owner}: {name} applies to {users} only, got {value!r}")

    @property
    def scheme_class(self) -> type[Scheme]:
        """The implementation of :attr:`scheme`."""
        return SCHEMES[self.scheme]

    # ----------------------------------------------------------------- constructors
    @classmethod
    def table_wise(cls, rank: int) -> TableShard:
        return cls(scheme="table_wise", ranks=(rank,))

    @classmethod
    def row_wise(cls, ranks: Sequence[int], partition_strategy: str = "div") -> TableShard:
        return cls(scheme="row_wise", ranks=tuple(ranks), partition_strategy=partition_strategy)

    @classmethod
    def column_wise(
        cls, ranks: Sequence[int], dim: int, column_sizes: Sequence[int] | None = None
    ) -> TableShard:
        """Columns over ``ranks``; by default split like ``div``: the first ``dim % n`` shards
        are one column wider."""
        if column_sizes is None:
            q, x = divmod(dim, len(ranks))
            column_sizes = [q + 1 if p < x else q for p in range(len(ranks))]
        return cls(scheme="column_wise", ranks=tuple(ranks), column_sizes=tuple(column_sizes))

    @classmethod
    def data_parallel(cls, world_size: int) -> TableShard:
        return cls(scheme="data_parallel", ranks=tuple(range(world_size)))

    @classmethod
    def key_hash(cls, ranks: Sequence[int]) -> TableShard:
        """A dynamic table's keys over ``ranks`` by their hash (shard p on ``ranks[p]``)."""
        return cls(scheme="key_hash", ranks=tuple(ranks))

    # ------------------------------------------------------------------------ forms
    def column_bounds(self, dim: int) -> list[tuple[int, int]]:
        """``[lo, hi)`` columns of each shard (one ``(0, dim)`` unless column-wise)."""
        if self.column_sizes is None:
            return [(0, dim)] * len(self.ranks)
        bounds, lo = [], 0
        for size in self.column_sizes:
            bounds.append((lo, lo + size))
            lo += size
        return bounds

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"scheme": self.scheme, "ranks": list(self.ranks)}
        if self.partition_strategy is not None:
            out["partition_strategy"] = self.partition_strategy
        if self.column_sizes is not None:
            out["column_sizes"] = list(self.column_sizes)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TableShard:
        known = {"scheme", "ranks", "partition_strategy", "column_sizes"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"TableShard: unknown fields {unknown}; expected {sorted(known)}")
        cols = data.get("column_sizes")
        return cls(
            scheme=data.get("scheme"),  # type: ignore[arg-type]
            ranks=tuple(data.get("ranks", ())),
            partition_strategy=data.get("partition_strategy"),
            column_sizes=None if cols is None else tuple(cols),
        )

    def describe(self) -> str:
        """Short human form: ``row_wise(div) on 0,1``."""
        return self.scheme_class.describe(self)

    @property
    def placement(self) -> str:
        """The scheme as the planner's overrides name it, without ranks: ``table_wise``,
        ``row_wise:div``, ``column_wise``."""
        strategy = self.partition_strategy
        return self.scheme if strategy is None else f"{self.scheme}:{strategy}"


@dataclass(frozen=True)
class ShardingPlan:
    """A placement for every table, for one world size.

    Args:
        world_size: the number of ranks the plan is for.
        tables: table name -> :class:`TableShard`, in table order.

    ``ShardingPlan.from_json(plan.to_json()) == plan``.
    """

    world_size: int
    tables: Mapping[str, TableShard] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, numbers.Integral) or isinstance(self.world_size, bool):
            raise ValueError(
                f"ShardingPlan: world_size must be an int >= 1, got {self.world_size!r}"
            )
        if self.world_size < 1:
            raise ValueError(f"ShardingPlan: world_size must be an int >= 1, got {self.world_size}")
        object.__setattr__(self, "world_size", int(self.world_size))
        tables = dict(self.tables)
        for name, shard in tables.items():
            if not isinstance(name, str) or not isinstance(shard, TableShard):
                raise ValueError(
                    f"ShardingPlan: tables must map table names to TableShard, got "
                    f"{name!r}: {type(shard).__name__}"
                )
            bad = [r for r in shard.ranks if r >= self.world_size]
            if bad:
                raise ValueError(
                    f"ShardingPlan: table '{name}' is placed on ranks {list(shard.ranks)}, but "
                    f"the world has ranks 0..{self.world_size - 1}"
                )
            shard.scheme_class.check_in_plan(name, shard, self.world_size)
        object.__setattr__(self, "tables", MappingProxyType(tables))

    def __getitem__(self, table: str) -> TableShard:
        try:
            return self.tables[table]
        except KeyError:
            raise KeyError(
                f"ShardingPlan: no table {table!r}; the plan has {list(self.tables)}"
            ) from None

    def __hash__(self) -> int:
        return _fingerprint(self.to_json())

    def digest(self) -> int:
        """A 63-bit fingerprint, equal on every rank that holds the same plan."""
        return hash(self) & ((1 << 63) - 1)

    # ------------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "tables": {name: shard.to_dict() for name, shard in self.tables.items()},
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShardingPlan:
        if not isinstance(data, Mapping) or "world_size" not in data:
            raise ValueError(
                "ShardingPlan.from_dict: expected {'world_size': int, 'tables': {...}}"
            )
        tables = data.get("tables", {})
        return cls(
            world_size=data["world_size"],
            tables={name: TableShard.from_dict(s) for name, s in tables.items()},
        )

    @classmethod
    def from_json(cls, text: str) -> ShardingPlan:
        return cls.from_dict(json.loads(text))

    # ------------------------------------------------------------------ validation
    def check(self, tables: Sequence[ResolvedTable], world_size: int) -> None:
        """Raise ``ValueError`` unless this plan fits these tables and world size.

        Checks that every table has exactly one placement, by a scheme for its kind (dynamic
        tables by ``key_hash``, fixed tables by the others), and what its scheme requires of
        the table (:meth:`Scheme.check_table <embcore.sharding.schemes.Scheme.check_table>`:
        column shards cover the dim with an element-wise optimizer).
        """
        if self.world_size != world_size:
            raise ValueError(
                f"ShardingPlan: the plan is for world_size={self.world_size}, but the process "
                f"group has {world_size} ranks; plan again for {world_size} ranks"
            )
        names = [t.name for t in tables]
        missing = [n for n in names if n not in self.tables]
        extra = [n for n in self.tables if n not in names]
        if missing or extra:
            raise ValueError(
                f"ShardingPlan: the plan's tables do not match the engine's: missing {missing}, "
                f"unknown {extra}"
            )
        for t in tables:
            shard = self.tables[t.name]
            if shard.scheme_class.dynamic != is_dynamic(t):
                raise ValueError(
                    f"ShardingPlan: table '{t.name}' is {_kind(t)}, but the plan places it "
                    f"{shard.describe()}; {_schemes_for(is_dynamic(t))}"
                )
            shard.scheme_class.check_table(shard, t)
            check_placement(t, shard)


def check_placement(table: ResolvedTable, shard: TableShard, owner: str = "ShardingPlan") -> None:
    """Raise ``ValueError`` unless ``table``'s row storage can hold the pieces ``shard``
    gives the ranks (its kind's :func:`~embcore.rows.placements`)."""
    allowed = placements(table)
    if allowed is not None and shard.placement not in allowed:
        raise ValueError(
            f"{owner}: table '{table.name}' keeps its rows in {kind_of(table)!r} row storage "
            f"(TableConfig.storage), which a plan may place only as {list(allowed)}, but it "
            f"is placed {shard.describe()}; place it so, or keep the table in memory"
        )


def _kind(table: ResolvedTable) -> str:
    return "a dynamic table (vocabulary_size=None)" if is_dynamic(table) else "a fixed table"


def _schemes_for(dynamic: bool) -> str:
    names = [name for name, s in SCHEMES.items() if s.dynamic == dynamic]
    return f"{'dynamic' if dynamic else 'fixed'} tables take the schemes {names}"
