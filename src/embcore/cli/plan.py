"""``embcore plan``: print a sharding plan and its per-rank memory and traffic.

Pure planning: no process is started. The tables come from a built-in workload of
BENCHMARKS.md (``--workload W1``) or a JSON file (``--config``)::

    {"tables": [{"name": "user", "vocabulary_size": 1000000, "dim": 64,
                 "features": 1, "max_sequence_length": 0}],
     "optimizer": "adagrad", "batch_size": 4096}

``--output plan.json`` writes the plan for ``ShardingPlan.from_json`` (pass it to the engine as
``plan=``); ``--stats`` reads lookup statistics (a ``profile_data_directory``, or a JSON file
``{"table": {"ids_per_example": 20, "unique_ratio": 0.4}}``). Tables with statistics go through
the planner's hot-table replication rule; the report lists each one's verdict and why.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import embcore as ec
from embcore._atomic import write_atomic
from embcore.config import resolve
from embcore.errors import UserError, reading
from embcore.sharding import ShardingPlan, estimate, plan
from embcore.sharding.planner import REPLICATE_MAX_BYTES, Replication, replication

__all__ = ["WORKLOADS", "register", "report"]

#: Criteo Kaggle cardinalities (BENCHMARKS.md W1), in order.
CRITEO = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]  # fmt: skip

#: Built-in workloads: tables as config dicts, with the batch size BENCHMARKS.md uses.
WORKLOADS: dict[str, dict[str, Any]] = {
    "W1": {
        "tables": [
            {"name": f"t{i:02d}", "vocabulary_size": min(v, 1_000_000), "dim": 64}
            for i, v in enumerate(CRITEO)
        ],
        "optimizer": "adagrad",
        "batch_size": 4096,
    },
    "W2": {
        "tables": [
            {"name": f"t{i}", "vocabulary_size": 1_000_000, "dim": 128, "ids_per_example": 20}
            for i in range(8)
        ],
        "optimizer": "adagrad",
        "batch_size": 2048,
    },
}

CONFIG_HELP = """\
--config FILE: a JSON object (not a list) describing the tables:
  {"tables": [{"name": "user", "vocabulary_size": 1000000, "dim": 64},
              {"name": "item", "vocabulary_size": 50000, "dim": 32, "features": 2,
               "max_sequence_length": 0, "combiner": "mean", "ids_per_example": 20}],
   "optimizer": "adagrad", "batch_size": 4096}
  per table: name (default table_<i>), vocabulary_size and dim (required), features (how many
  features read the table, default 1), max_sequence_length (0: pooled), combiner (mean, sum,
  sqrtn), ids_per_example (lookup statistics for the planner; optional).
  "vocabulary_size": null makes a dynamic table, placed by key hash; its optional max_rows
  (the whole table's eviction limit) is the rows the planner expects it to hold, else the
  "rows_held" of its --stats, else 1,048,576.
  "storage": "disk" with "cache_bytes": "2GiB" puts a fixed table in DiskStorage: its memory
  is its RAM cache (and a fixed overhead), its file is shown in a disk column.
  optimizer: sgd, adagrad (default), adagrad_momentum, adam, ftrl, rowwise_adagrad, none.
  batch_size: the per-rank batch size (default 1024); --batch-size and --optimizer override.
--stats DIR|FILE: a profile_data_directory, or {"TABLE": {"ids_per_example": 20,
  "unique_ratio": 0.4}}; statistics of tables the config does not have are reported and ignored.

examples:
  embcore plan --workload W1 --world-size 4
  embcore plan --config tables.json -w 8 --override user=row_wise:mod --output plan.json
see docs/sharding.md, "Planning from the command line"."""

OPTIMIZERS = {
    "sgd": ec.SGD,
    "adagrad": ec.Adagrad,
    "adagrad_momentum": ec.AdagradMomentum,
    "adam": ec.Adam,
    "ftrl": ec.FTRL,
    "rowwise_adagrad": ec.RowwiseAdagrad,
    "none": None,
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="print a sharding plan with per-rank memory and traffic",
        description="Plan how tables are sharded over WORLD_SIZE ranks (no processes are "
        "started) and print each table's placement and each rank's estimated memory and "
        "bytes communicated per training step. A printed plan has passed the engine's own "
        "checks, so EmbeddingEngine(..., plan=ShardingPlan.from_json(...)) accepts it.",
        epilog=CONFIG_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--workload", choices=sorted(WORKLOADS), help="a BENCHMARKS.md workload")
    source.add_argument("--config", type=Path, help="a JSON file of tables (see --help)")
    parser.add_argument("--world-size", "-w", type=int, required=True, help="number of ranks")
    parser.add_argument("--batch-size", type=int, default=None, help="per-rank batch size")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default=None)
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="TABLE=SCHEME",
        help="place a table yourself: table_wise[:rank], row_wise[:div|:mod], column_wise, "
        "data_parallel (repeatable)",
    )
    parser.add_argument("--memory-per-rank", type=_bytes, default=None, help="e.g. 16GiB")
    parser.add_argument("--stats", type=Path, default=None, help="lookup statistics")
    parser.add_argument(
        "--replicate-max-bytes",
        type=_bytes,
        default=REPLICATE_MAX_BYTES,
        help="largest table the hot-table rule replicates (default 16MiB)",
    )
    parser.add_argument("--json", action="store_true", help="print only the plan as JSON")
    parser.add_argument("--output", type=Path, default=None, help="write the plan JSON here")
    parser.set_defaults(func=run)


def _bytes(text: str) -> int:
    units = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
             "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}  # fmt: skip
    number = text.rstrip("BbKkMmGgTtIi")
    unit = text[len(number) :].upper()
    if unit not in units:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 512MiB, 16GiB)")
    try:
        return int(float(number) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 512MiB, 16GiB)") from None


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


_TABLE_FIELDS = ("name", "vocabulary_size", "dim", "features", "max_sequence_length",
                 "ids_per_example", "combiner", "max_rows", "storage", "cache_bytes")  # fmt: skip
_TOP_FIELDS = ("tables", "optimizer", "batch_size")


def _int_field(where: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{where} must be an int >= {minimum}, got {value!r}")
    return value


def _eviction(table: dict[str, Any]) -> Any:
    """A dynamic table's (``"vocabulary_size": null``) ``max_rows`` as its eviction."""
    if "max_rows" not in table:
        return None
    if table["vocabulary_size"] is not None:
        raise ValueError(
            f'max_rows is for dynamic tables ("vocabulary_size": null), got '
            f"vocabulary_size={table['vocabulary_size']!r}"
        )
    return ec.Eviction(max_rows=table["max_rows"])


def _storage(table: dict[str, Any]) -> ec.DiskStorage | None:
    """``"storage": "disk"`` with its ``cache_bytes`` (a size such as ``"2GiB"`` or bytes),
    or ``"memory"`` (the default)."""
    kind, cache = table.get("storage", "memory"), table.get("cache_bytes")
    if kind not in ("memory", "disk"):
        raise ValueError(f'storage must be "memory" or "disk", got {kind!r}')
    if kind == "memory":
        if cache is not None:
            raise ValueError('cache_bytes is for tables with "storage": "disk"')
        return None
    if cache is None:
        raise ValueError('a table with "storage": "disk" needs "cache_bytes" (e.g. "2GiB")')
    if isinstance(cache, str):
        try:
            cache = _bytes(cache)
        except argparse.ArgumentTypeError as error:
            raise ValueError(f"cache_bytes: {error}") from None
    return ec.DiskStorage("embcore-disk", cache_bytes=cache)  # the directory is not planned


def feature_config(
    spec: Any, source: str = "config"
) -> tuple[dict[str, ec.FeatureConfig], dict[str, Any]]:
    """Features from a config dict, and statistics implied by its ``ids_per_example``.

    Raises:
        UserError: the config is not ``{"tables": [{...}, ...], ...}`` or a table is invalid,
            naming ``source`` and the table.
    """
    if not isinstance(spec, dict):
        raise UserError(
            f'{source}: expected a JSON object {{"tables": [...], "optimizer": ..., '
            f'"batch_size": ...}}, got {type(spec).__name__} (see embcore plan --help)'
        )
    unknown = sorted(set(spec) - set(_TOP_FIELDS))
    if unknown:
        raise UserError(f"{source}: unknown keys {unknown}; valid: {list(_TOP_FIELDS)}")
    tables = spec.get("tables", [])
    if not isinstance(tables, list) or not tables:
        raise UserError(f'{source}: "tables" must be a non-empty list of tables, got {tables!r}')
    features, stats = {}, {}
    for i, t in enumerate(tables):
        where = f"{source}: tables[{i}]"
        if not isinstance(t, dict):
            raise UserError(f"{where} must be an object with name, vocabulary_size, dim")
        unknown = sorted(set(t) - set(_TABLE_FIELDS))
        if unknown:
            raise UserError(f"{where}: unknown fields {unknown}; valid: {list(_TABLE_FIELDS)}")
        missing = [k for k in ("vocabulary_size", "dim") if k not in t]
        if missing:
            raise UserError(f"{where}: missing fields {missing}")
        try:
            table = ec.TableConfig(
                vocabulary_size=t["vocabulary_size"],
                dim=t["dim"],
                name=t.get("name", f"table_{i}"),
                combiner=t.get("combiner", "mean"),
                eviction=_eviction(t),
                storage=_storage(t),
            )
            length = _int_field("max_sequence_length", t.get("max_sequence_length", 0), 0)
            for f in range(_int_field("features", t.get("features", 1), 1)):
                features[f"{table.name}/{f}"] = ec.FeatureConfig(
                    table=table, max_sequence_length=length
                )
        except ValueError as error:
            raise UserError(f"{where}: {error}") from None
        if "ids_per_example" in t:
            value = t["ids_per_example"]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise UserError(f"{where}: ids_per_example must be a number >= 0, got {value!r}")
            stats[table.name] = {"ids_per_example": float(value)}
    return features, stats


def _load_stats(path: Path) -> dict[str, Any]:
    if path.is_dir():
        from embcore.cli.stats import load_directory

        found = load_directory(path)
        if not found:
            raise UserError(f"{path}: no statistics files (*.json) in this directory")
        return {s.table: s for _, s in found}
    with reading(path, 'a JSON file {"table": {"ids_per_example": ..., "unique_ratio": ...}}'):
        stats = json.loads(path.read_text())
    if not isinstance(stats, dict) or not all(isinstance(v, dict) for v in stats.values()):
        raise UserError(
            f'{path}: expected {{"table": {{"ids_per_example": 20, "unique_ratio": '
            f"0.4}}, ...}}, got {str(stats)[:80]}"
        )
    for table, values in stats.items():
        ids, unique = values.get("ids_per_example", 0), values.get("unique_ratio", 1)
        numbers = all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in (ids, unique)
        )
        if not numbers or not (ids >= 0 and 0 <= unique <= 1):
            raise UserError(
                f"{path}: table {table!r}: ids_per_example must be a number >= 0 and "
                f"unique_ratio a number in [0, 1], got {ids!r} and {unique!r}"
            )
    return stats


def report(
    sharding: ShardingPlan,
    features: Any,
    optimizer: Any,
    batch_size: int,
    stats: Any,
    verdicts: Sequence[Replication] = (),
) -> str:
    ranks, tables = estimate(
        sharding, features, optimizer=optimizer, batch_size=batch_size, stats=stats
    )
    disk = any("disk" in t.tiers for t in tables)  # a disk column when a table has a file

    def on_disk(tiers: dict[str, int]) -> str:
        return f" {_human(tiers.get('disk', 0)):>12}" if disk else ""

    lines = [
        f"sharding plan for {sharding.world_size} rank(s), per-rank batch {batch_size}",
        "",
        f"{'table':<16} {'placement':<32} {'memory':>12}{' ' * 9 + 'disk' if disk else ''} "
        f"{'sent/step':>12}",
    ]
    for t in tables:
        lines.append(
            f"{t.table:<16} {t.shard.describe():<32} {_human(t.memory_bytes):>12}"
            f"{on_disk(t.tiers)} {_human(t.bytes_sent):>12}"
        )
    lines += [
        "",
        f"{'rank':<6} {'memory':>12}{' ' * 9 + 'disk' if disk else ''} {'sent/step':>12} "
        f"{'received/step':>14}",
    ]
    for r in ranks:
        lines.append(
            f"{r.rank:<6} {_human(r.memory_bytes):>12}{on_disk(r.tiers)} "
            f"{_human(r.bytes_sent):>12} {_human(r.bytes_received):>14}"
        )
    if disk:
        lines += [
            "",
            "memory: RAM (a disk table: its cache and fixed overhead); disk: the working files "
            "once every row was written",
        ]
    if verdicts:
        lines += [
            "",
            "hot-table replication (tables with statistics)",
            f"{'table':<16} {'size':>12} {'lookups/row':>12} {'all-reduce':>12} "
            f"{'all-to-all':>12}  verdict",
        ]
        for v in verdicts:
            lines.append(
                f"{v.table:<16} {_human(v.replica_bytes):>12} {v.lookups_per_row:>12.2f} "
                f"{_human(v.all_reduce_bytes):>12} {_human(v.all_to_all_bytes):>12}  "
                f"{'replicate' if v.replicate else 'shard'} ({v.reason})"
            )
    return "\n".join(lines)


def _load_spec(args: argparse.Namespace) -> dict[str, Any]:
    if args.workload:
        return WORKLOADS[args.workload]
    with reading(args.config, "a JSON file of tables (see embcore plan --help)"):
        return json.loads(args.config.read_text())


#: The largest --world-size planned for (the planner keeps per-rank lists).
MAX_WORLD_SIZE = 1 << 16


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.world_size <= MAX_WORLD_SIZE:
        raise UserError(f"--world-size must be in [1, {MAX_WORLD_SIZE}], got {args.world_size}")
    for flag, value in (
        ("--memory-per-rank", args.memory_per_rank),
        ("--replicate-max-bytes", args.replicate_max_bytes),
        ("--batch-size", args.batch_size),
    ):
        if value is not None and value < (0 if flag == "--replicate-max-bytes" else 1):
            raise UserError(f"{flag} must be positive, got {value}")
    spec = _load_spec(args)
    features, stats = feature_config(spec, str(args.config or args.workload))
    if args.stats is not None:
        stats.update(_load_stats(args.stats))
    names = {f.table.name for f in features.values()}
    unmatched = sorted(set(stats) - names)
    if unmatched:
        print(
            f"embcore plan: warning: ignoring statistics of tables the config does not have: "
            f"{unmatched} (tables: {sorted(names)})",
            file=sys.stderr,
        )
        stats = {n: v for n, v in stats.items() if n in names}
    name = args.optimizer or spec.get("optimizer", "adagrad")
    if name not in OPTIMIZERS:
        raise UserError(f"unknown optimizer {name!r}; use one of {sorted(OPTIMIZERS)}")
    optimizer = OPTIMIZERS[name]() if OPTIMIZERS[name] is not None else None
    batch_size = args.batch_size or _int_field("batch_size", spec.get("batch_size", 1024), 1)
    overrides = {}
    for item in args.override:
        table, sep, scheme = item.partition("=")
        if not sep:
            raise UserError(f"--override wants TABLE=SCHEME, got {item!r}")
        overrides[table] = scheme
    try:
        sharding = plan(
            features,
            args.world_size,
            optimizer=optimizer,
            batch_size=batch_size,
            stats=stats,
            overrides=overrides,
            memory_per_rank=args.memory_per_rank,
            replicate_max_bytes=args.replicate_max_bytes,
        )
        # The engine's own checks: a plan printed here is one the engine accepts.
        sharding.check(resolve(features, optimizer)[1], args.world_size)
        verdicts = replication(
            features,
            args.world_size,
            optimizer=optimizer,
            batch_size=batch_size,
            stats={n: v for n, v in stats.items() if n not in overrides},
            replicate_max_bytes=args.replicate_max_bytes,
        )
    except ValueError as error:
        raise UserError(str(error)) from None
    if args.output is not None:
        _write_atomically(args.output, sharding.to_json(indent=2) + "\n")
    if args.json:
        print(sharding.to_json(indent=2))
    else:
        print(report(sharding, features, optimizer, batch_size, stats, verdicts))
    return 0


def _write_atomically(path: Path, text: str) -> None:
    write_atomic(path, text.encode())
