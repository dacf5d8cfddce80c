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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import embcore as ec
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
        "bytes communicated per training step.",
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


def feature_config(spec: dict[str, Any]) -> tuple[dict[str, ec.FeatureConfig], dict[str, Any]]:
    """Features from a config dict, and statistics implied by its ``ids_per_example``."""
    features, stats = {}, {}
    for i, t in enumerate(spec.get("tables", [])):
        known = {"name", "vocabulary_size", "dim", "features", "max_sequence_length",
                 "ids_per_example", "combiner"}  # fmt: skip
        unknown = sorted(set(t) - known)
        if unknown:
            raise SystemExit(f"embcore plan: table {i}: unknown fields {unknown}")
        table = ec.TableConfig(
            vocabulary_size=t["vocabulary_size"],
            dim=t["dim"],
            name=t.get("name", f"table_{i}"),
            combiner=t.get("combiner", "mean"),
        )
        for f in range(int(t.get("features", 1))):
            features[f"{table.name}/{f}"] = ec.FeatureConfig(
                table=table, max_sequence_length=int(t.get("max_sequence_length", 0))
            )
        if "ids_per_example" in t:
            stats[table.name] = {"ids_per_example": float(t["ids_per_example"])}
    if not features:
        raise SystemExit("embcore plan: the config has no tables")
    return features, stats


def _load_stats(path: Path) -> dict[str, Any]:
    if path.is_dir():
        from embcore.cli.stats import load_directory

        return {s.table: s for _, s in load_directory(path)}
    return json.loads(path.read_text())


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
    lines = [
        f"sharding plan for {sharding.world_size} rank(s), per-rank batch {batch_size}",
        "",
        f"{'table':<16} {'placement':<32} {'memory':>12} {'sent/step':>12}",
    ]
    for t in tables:
        lines.append(
            f"{t.table:<16} {t.shard.describe():<32} {_human(t.memory_bytes):>12} "
            f"{_human(t.bytes_sent):>12}"
        )
    lines += ["", f"{'rank':<6} {'memory':>12} {'sent/step':>12} {'received/step':>14}"]
    for r in ranks:
        lines.append(
            f"{r.rank:<6} {_human(r.memory_bytes):>12} {_human(r.bytes_sent):>12} "
            f"{_human(r.bytes_received):>14}"
        )
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


def run(args: argparse.Namespace) -> int:
    spec = WORKLOADS[args.workload] if args.workload else json.loads(args.config.read_text())
    features, stats = feature_config(spec)
    if args.stats is not None:
        stats.update(_load_stats(args.stats))
    name = args.optimizer or spec.get("optimizer", "adagrad")
    if name not in OPTIMIZERS:
        raise SystemExit(
            f"embcore plan: unknown optimizer {name!r}; use one of {sorted(OPTIMIZERS)}"
        )
    optimizer = OPTIMIZERS[name]() if OPTIMIZERS[name] is not None else None
    batch_size = args.batch_size or int(spec.get("batch_size", 1024))
    overrides = {}
    for item in args.override:
        table, sep, scheme = item.partition("=")
        if not sep:
            raise SystemExit(f"embcore plan: --override wants TABLE=SCHEME, got {item!r}")
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
        verdicts = replication(
            features,
            args.world_size,
            optimizer=optimizer,
            batch_size=batch_size,
            stats={n: v for n, v in stats.items() if n not in overrides},
            replicate_max_bytes=args.replicate_max_bytes,
        )
    except ValueError as error:
        raise SystemExit(f"embcore {error}") from None
    if args.output is not None:
        args.output.write_text(sharding.to_json(indent=2) + "\n")
    if args.json:
        print(sharding.to_json(indent=2))
    else:
        print(report(sharding, features, optimizer, batch_size, stats, verdicts))
    return 0
