"""``embcore stats DIR``: report the lookup statistics in a profile directory."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from embcore.errors import UserError, reading
from embcore.stats import TableStats

__all__ = ["register", "report"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "stats",
        help="report lookup statistics (profile_data_directory)",
        description="Print the lookup statistics stored in DIR and plot, per table, the "
        "counts of the hottest ids the profiler tracks (at most its sketch capacity, 256 by "
        "default, from the sampled batches only) and the share of sampled lookups the top k "
        "of them cover (PNG files beside the statistics, or in --plots).",
    )
    parser.add_argument("directory", type=Path, help="a profile_data_directory")
    parser.add_argument("--plots", type=Path, default=None, help="where to write the PNGs")
    parser.add_argument("--top", type=int, default=5, help="hottest ids to list per table")
    parser.set_defaults(func=run)


def load_directory(directory: Path) -> list[tuple[Path, TableStats]]:
    """Every statistics file of ``directory``, sorted by table name."""
    if not directory.is_dir():
        raise UserError(f"{directory} is not a directory (expected a profile_data_directory)")
    found = []
    for path in sorted(directory.glob("*.json")):
        with reading(path, "a statistics file written by the engine's profiler"):
            stats = TableStats.from_json(json.loads(path.read_text()))
            _check(stats)
        found.append((path, stats))
    return sorted(found, key=lambda item: item[1].table)


def _check(s: TableStats) -> None:
    """Counts a profiler can write: none negative, a sketch within its capacity."""
    counts = {
        "batches": s.batches,
        "examples": s.examples,
        "ids": s.ids,
        "sketch_total": s.sketch_total,
        "capacity": s.capacity - 1,
        "unique_ids": s.unique_ids,
        "rows_held": s.rows_held,
    }
    bad = [k for k, v in counts.items() if not isinstance(v, int) or v < 0]
    if bad or min(s.sketch.values(), default=0) < 0 or len(s.sketch) > s.capacity:
        raise UserError(
            f"counts out of range in {bad or ['sketch']} (table {s.table!r}); expected "
            "non-negative integers and at most capacity sketch entries"
        )
    if any(not isinstance(v, int) or v < 0 for v in s.cache.values()):
        raise UserError(f"negative disk cache counters (table {s.table!r}): {s.cache}")
    if any(x < 0 for x in s.shard_load) or (s.ids_per_example < 0).any():
        raise UserError(f"negative loads or ids per example (table {s.table!r})")


def coverage(s: TableStats) -> list[float]:
    """``[c_1, c_2, ...]``: the fraction of sampled lookups the ``k`` hottest tracked ids cover.

    A lower bound: the sketch's counts undercount (by at most ``sketch_error`` each).
    """
    total = max(s.sketch_total, 1)
    out, running = [], 0
    for _, count in s.hottest():
        running += count
        out.append(running / total)
    return out


def report(found: list[tuple[Path, TableStats]], top: int) -> str:
    """A plain-text report: one block per table."""
    lines = []
    for path, s in found:
        key = s.key
        rows = "dynamic" if key["vocabulary_size"] is None else key["vocabulary_size"]
        lines.append(
            f"table {s.table}  ({rows} x {key['dim']}, "
            f"{key['num_features']} feature(s), {_placement(key)})  [{path.name}]"
        )
        lines.append(
            f"  sampled batches {s.batches}, examples {s.examples}, ids {s.ids}; ids per example "
            f"mean {s.mean_ids_per_example:.2f}, p50 {s.quantile(0.5)}, p99 {s.quantile(0.99)}; "
            f"unique ids per batch {100 * s.unique_ratio:.1f}% "
            f"({s.mean_unique_ids:,.0f} on average)"
        )
        if key["vocabulary_size"] is None:
            lines.append(f"  rows held (the most at a sampled batch): {s.rows_held:,}")
        hot = ", ".join(f"{i} ({c})" for i, c in s.hottest(top))
        lines.append(f"  hottest ids (count, undercount <= {s.sketch_error:.0f}): {hot}")
        cover = coverage(s)
        if cover:
            marks = [k for k in (1, 10, 100) if k < len(cover)] + [len(cover)]
            shares = ", ".join(f"top {k} {100 * cover[k - 1]:.1f}%" for k in marks)
            lines.append(
                f"  sampled lookups covered by the hottest tracked ids (at least): {shares}"
            )
        if s.cache:
            lines.append(_cache_line(s))
        if len(s.shard_load) > 1:
            total = max(sum(s.shard_load), 1)
            shares = " ".join(f"{100 * x / total:.1f}%" for x in s.shard_load)
            lines.append(f"  ids per shard: {shares}")
    return "\n".join(lines)


def _cache_line(s: TableStats) -> str:
    """A disk table's cache hit rate and its file's reads and writes per step."""
    rate = "no lookups" if s.hit_rate is None else f"hit rate {100 * s.hit_rate:.1f}%"
    steps = s.cache.get("steps", 0)
    if not steps:
        return f"  disk cache: {rate}; no training step ended"
    return (
        f"  disk cache: {rate} ({s.cache.get('hits', 0):,} hits, {s.cache.get('misses', 0):,} "
        f"misses) over {steps:,} steps; per step read {s.per_step('rows_read'):,.1f} rows "
        f"({s.per_step('bytes_read') / 1e6:.3f} MB), wrote {s.per_step('rows_written'):,.1f} "
        f"rows ({s.per_step('bytes_written') / 1e6:.3f} MB)"
    )


def _placement(key: dict) -> str:
    """Where the table's rows were: ``unsharded`` (one process), or the sharding plan's
    description over the ranks (``row_wise(key_hash) on 0,1 over 2 ranks``)."""
    if key["world_size"] == 1:
        return "unsharded"
    return f"{key['sharding_strategy']} over {key['world_size']} ranks"


def plot(found: list[tuple[Path, TableStats]], out: Path) -> list[Path]:
    """One PNG per table: the tracked hottest ids' counts (log-log), and the cumulative share
    of sampled lookups the top ``k`` of them cover.

    Only the heavy hitters the sketch tracks (at most its capacity, 256 by default) are
    plotted, from the sampled batches only; the titles and labels say so.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path, s in found:
        counts = [c for _, c in s.hottest()]
        if not counts:
            continue
        ks = range(1, len(counts) + 1)
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
        left.loglog(ks, counts, marker=".", linestyle="-")
        left.set_xlabel("rank k of id among the tracked hottest")
        left.set_ylabel("lookups in sampled batches")
        left.set_title("count of the k-th hottest id", fontsize=10)
        left.grid(True, which="both", alpha=0.3)
        cover = [100 * c for c in coverage(s)]
        right.semilogx(ks, cover, marker=".", linestyle="-", color="tab:orange")
        right.set_ylim(0, 100)
        right.set_xlabel("k hottest ids")
        right.set_ylabel("% of sampled lookups (at least)")
        right.set_title(f"top-k ids cover: top {len(cover)} = {cover[-1]:.1f}%", fontsize=10)
        right.grid(True, which="both", alpha=0.3)
        fig.suptitle(
            f"{s.table}: the {len(counts)} hottest ids tracked (sketch capacity {s.capacity}) "
            f"of {s.ids:,} lookups in {s.batches:,} sampled batches; other ids not shown",
            fontsize=9,
        )
        fig.tight_layout()
        target = out / f"{path.stem}.png"
        fig.savefig(target, dpi=100)
        plt.close(fig)
        written.append(target)
    return written


def run(args: argparse.Namespace) -> int:
    found = load_directory(args.directory)
    if not found:
        raise UserError(
            f"{args.directory} holds no statistics files (*.json written by the engine's "
            "profiler); give the profile_data_directory of an engine that called "
            "write_statistics()"
        )
    print(report(found, args.top))
    for png in plot(found, args.plots or args.directory):
        print(f"wrote {png}")
    return 0
