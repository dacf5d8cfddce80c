"""Summaries of a run: min / median / max over repeats, ratios to each peer taken within each
repeat (the systems of one repeat run back to back, so they share the machine's state),
targets, markdown; and the dynamic tables' section (W3 against W1, its peers, the key index)."""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np

from sidebyside.workloads import FIXED_TWIN

__all__ = ["TARGETS", "dynamic_markdown", "markdown", "speedup", "summarize"]

#: (workload, embcore optimizer, peer system, peer optimizer, minimum speedup)
TARGETS = [
    ("W1", "adagrad", "plain PyTorch", "adagrad", 3.0),
    ("W1", "adagrad", "FBGEMM TBE", "adagrad", 1.5),
    ("W1", "rowwise_adagrad", "FBGEMM TBE", "rowwise_adagrad", 1.2),
    ("W2", "adagrad", "FBGEMM TBE", "adagrad", 2.0),
    ("W2", "rowwise_adagrad", "FBGEMM TBE", "rowwise_adagrad", 1.0),
]
#: the per-feature dict output within this fraction of stacked(), embcore Adagrad
DICT_TARGET = 0.05
BANDWIDTH_TARGET = 0.70  # of the random-row gather bandwidth, embcore Adagrad, W1 and W2
MEMORY_TARGET = 1.3  # peak RSS over tables + slots, embcore Adagrad on W1
DYNAMIC = "embcore, dynamic tables"
#: the same, new rows from W1's initializer (a user initializer) instead of the default one
DYNAMIC_W1_INIT = "embcore, dynamic tables, W1's initializer"
#: the same as DYNAMIC, each table built with ``initial_capacity`` = its fixed twin's vocabulary
DYNAMIC_CAPACITY = "embcore, dynamic tables, initial_capacity"
#: how the dynamic section labels each embcore variant after its optimizer
_VARIANT = {
    DYNAMIC: "",
    DYNAMIC_W1_INIT: ", W1's initializer",
    DYNAMIC_CAPACITY: ", initial_capacity",
}
#: the W3 step (dynamic tables, raw keys, default initializer) over the W1 step (fixed tables)
DYNAMIC_TARGET = {"W3": 1.2, "W3-evict": 1.4}
#: the systems that run W3 (raw 64-bit keys)
RAW_KEY_SYSTEMS = (
    DYNAMIC, DYNAMIC_W1_INIT, DYNAMIC_CAPACITY, "plain PyTorch + dict",
    "TorchRec managed collisions",
)  # fmt: skip


def summarize(results: dict) -> list[dict]:
    """One row per (workload, system, optimizer): the median over repeats of the per-run median
    step times, and the rates that follow from it (against the median gather bandwidth)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in results["runs"]:
        groups[(r["workload"], r["system"], r["optimizer"])].append(r)
    rows = []
    gather = float(np.median([lim["gather"]["gb_s"] for lim in results["limits"]])) * 1e9
    for (workload, system, optimizer), runs in groups.items():
        median_ms = float(np.median([r["median_ms"] for r in runs]))
        batch = results["workloads"][workload]["batch"]
        rows.append(
            {
                "workload": workload,
                "system": system,
                "optimizer": optimizer,
                "label": runs[0]["label"],
                "median_ms": median_ms,
                "min_ms": min(r["median_ms"] for r in runs),
                "max_ms": max(r["median_ms"] for r in runs),
                "runs_ms": [r["median_ms"] for r in runs],
                "repeats": [r.get("repeat", i) for i, r in enumerate(runs)],
                # derived from the median step time, so the columns agree with each other
                "samples_per_s": batch / (median_ms / 1e3),
                "bytes_per_step": runs[0]["bytes_per_step"],
                "gb_s": runs[0]["bytes_per_step"] / (median_ms / 1e3) / 1e9,
                "gather_fraction": runs[0]["bytes_per_step"] / (median_ms / 1e3) / gather,
                "state_bytes": runs[0]["state_bytes"],
                # the first run's: embcore starts the process, so its figure is not inflated by
                # memory the allocator kept from earlier systems
                "peak_rss": runs[0]["peak_rss"],
                "rss_before": runs[0]["rss_before"],
                "rows_held": runs[0].get("rows_held"),
                "runs_cpu_ms": [r.get("median_cpu_ms") for r in runs],
            }
        )
    return rows


def _find(rows: list[dict], workload: str, system: str, optimizer: str) -> dict | None:
    for r in rows:
        if (r["workload"], r["system"], r["optimizer"]) == (workload, system, optimizer):
            return r
    return None


def speedup(ours: dict, peer: dict) -> float:
    """Median over the repeats both ran of ``peer ms / ours ms`` within the same repeat."""
    mine = dict(zip(ours["repeats"], ours["runs_ms"], strict=True))
    ratios = [
        p / mine[r] for r, p in zip(peer["repeats"], peer["runs_ms"], strict=True) if r in mine
    ]
    return float(np.median(ratios)) if ratios else peer["median_ms"] / ours["median_ms"]


def _gib(n: float | None) -> str:
    return "-" if not n else f"{n / 2**30:.2f}"


def targets(rows: list[dict]) -> list[dict]:
    """Each target of the issue with its measured value (skipped where a side is missing)."""
    out = []
    for workload, ours, peer, theirs, minimum in TARGETS:
        a, b = _find(rows, workload, "embcore", ours), _find(rows, workload, peer, theirs)
        if a and b:
            value = speedup(a, b)
            what = f"{workload}: embcore {a['label']} vs {peer} {b['label']}"
            out.append(
                {
                    "target": what,
                    "want": f">= {minimum:g}x",
                    "got": f"{value:.2f}x",
                    "met": value >= minimum,
                }
            )
    for workload in ("W1", "W2"):
        a = _find(rows, workload, "embcore", "adagrad")
        b = _find(rows, workload, "embcore, per-feature output", "adagrad")
        if a and b:
            value = speedup(a, b) - 1  # dict ms over stacked ms, within each run, minus 1
            out.append(
                {
                    "target": f"{workload}: embcore per-feature dict output vs stacked()",
                    "want": f"within {DICT_TARGET:.0%}",
                    "got": f"{value:+.1%}",
                    "met": abs(value) <= DICT_TARGET,
                }
            )
    for workload in ("W1", "W2"):
        if a := _find(rows, workload, "embcore", "adagrad"):
            value = a["gather_fraction"]
            out.append(
                {
                    "target": f"{workload}: embcore effective bandwidth / random-row gather",
                    "want": f">= {BANDWIDTH_TARGET:.0%}",
                    "got": f"{value:.0%}",
                    "met": value >= BANDWIDTH_TARGET,
                }
            )
    for workload, twin in FIXED_TWIN.items():
        for optimizer in ("adagrad", "rowwise_adagrad"):
            fixed, dynamic = (
                _find(rows, twin, "embcore", optimizer),
                _find(rows, workload, DYNAMIC, optimizer),
            )
            if fixed and dynamic:
                value = speedup(fixed, dynamic)  # dynamic ms over fixed ms, within each run
                want = DYNAMIC_TARGET.get(workload, DYNAMIC_TARGET["W3"])
                out.append(
                    {
                        "target": f"{workload}: embcore dynamic-table step / {twin} fixed-table "
                        f"step, {dynamic['label']}",
                        "want": f"<= {want:g}x",
                        "got": f"{value:.2f}x",
                        "met": value <= want,
                    }
                )
    if (a := _find(rows, "W1", "embcore", "adagrad")) and a["peak_rss"]:
        value = a["peak_rss"] / a["state_bytes"]
        out.append(
            {
                "target": "W1: embcore peak RSS / (tables + slots)",
                "want": f"<= {MEMORY_TARGET:g}x",
                "got": f"{value:.2f}x ({_gib(a['peak_rss'])} / {_gib(a['state_bytes'])} GiB)",
                "met": value <= MEMORY_TARGET,
            }
        )
    return out


def markdown(results: dict) -> str:
    """The results, ratio and target tables, and the limits, as markdown."""
    rows = summarize(results)
    repeats = len(results["limits"])
    lines = [
        f"Medians of {results['options']['steps']} timed steps after "
        f"{results['options']['warmup']} warm-up steps, per system and run; {repeats} run(s) "
        "of the whole suite in one process, the systems interleaved within each run; min / "
        "median / max over the runs (per-run medians in the last column). Rates use the median.",
        "",
        "| workload | system | optimizer | min ms/step | median ms/step | max ms/step | samples/s "
        "| MB touched/step | effective GB/s | of gather BW | peak RSS / state (GiB), run 1 "
        "| runs (ms/step) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['system']} | {r['label']} | {r['min_ms']:.1f} | "
            f"{r['median_ms']:.1f} | {r['max_ms']:.1f} | "
            f"{r['samples_per_s']:,.0f} | {r['bytes_per_step'] / 1e6:.1f} | {r['gb_s']:.2f} | "
            f"{r['gather_fraction']:.0%} | {_gib(r['peak_rss'])} / {_gib(r['state_bytes'])} | "
            f"{', '.join(f'{m:.1f}' for m in r['runs_ms'])} |"
        )
    ours = [r for r in rows if r["system"].startswith("embcore")]
    peers = [(r["system"], r["optimizer"], r["label"]) for r in rows if r not in ours]
    peers = list(dict.fromkeys(peers))
    if peers:
        lines += [
            "",
            "embcore speedup (peer ms/step / embcore ms/step within each run, median over the "
            "runs; same workload and batches):",
            "",
            "| workload | embcore | " + " | ".join(f"{s} {label}" for s, _, label in peers) + " |",
            "|---|---|" + "---:|" * len(peers),
        ]
        for r in ours:
            cells = []
            for system, optimizer, _ in peers:
                peer = _find(rows, r["workload"], system, optimizer)
                cells.append("-" if peer is None else f"{speedup(r, peer):.2f}x")
            variant = r["system"].removeprefix("embcore").lstrip(", ")
            name = r["label"] + (f" ({variant})" if variant else "")
            lines.append(f"| {r['workload']} | {name} | " + " | ".join(cells) + " |")
    checks = targets(rows)
    if checks:
        lines += ["", "| target | wanted | measured | met |", "|---|---|---|---|"]
        for c in checks:
            lines.append(
                f"| {c['target']} | {c['want']} | {c['got']} | {'yes' if c['met'] else 'no'} |"
            )
    lines += ["", "Limits measured in the same run:", ""]
    for lim in results["limits"]:
        g, c, h = lim["gather"], lim["copy"], lim.get("gather_huge_pages")
        huge = "" if h is None else f"; the same on 2 MiB pages {h['gb_s']:.2f} GB/s"
        load = lim.get("load_average")
        busy = "" if load is None else f"; 1-minute load average {load:.1f} at its start"
        lines.append(
            f"* run {lim['repeat'] + 1}: random-row gather {g['gb_s']:.2f} GB/s "
            f"(`index_select` of {g['rows']:,} rows from a {g['table_rows']:,} x 64 float32 "
            f"table, read + write{huge}); sequential copy {c['gb_s']:.2f} GB/s "
            f"({c['megabytes']} MB, read + write){busy}"
        )
    lines.append(
        "* 'of gather BW' divides by the plain (4 KiB page) gather figure; embcore backs its "
        "large tables with 2 MiB pages (docs/cpu_backend.md), the peers use PyTorch's default."
    )
    lines.append(
        "* A load average near or above the core count means other processes shared the cores: "
        "with more than one torch thread every system then waits on descheduled threads "
        "(docs/cpu_backend.md); `--threads 1` measures the single-core figures instead."
    )
    for system, reason in results["skipped"].items():
        lines.append(f"* {system} was skipped: {reason}")
    return "\n".join(lines) + "\n"


def _cpu_speedup(ours: dict, peer: dict) -> float | None:
    """Median over the runs both made of ``peer CPU ms / our CPU ms`` within each run."""
    mine = dict(zip(ours["repeats"], ours["runs_cpu_ms"], strict=True))
    ratios = [
        p / mine[r]
        for r, p in zip(peer["repeats"], peer["runs_cpu_ms"], strict=True)
        if p is not None and mine.get(r)
    ]
    return float(np.median(ratios)) if ratios else None


def _cpu_ratios(rows: list[dict]) -> list[tuple[str, str, float, float, float]]:
    """``(workload, optimizer label, dynamic CPU ms, fixed CPU ms, ratio)`` per raw-key
    workload: medians over the runs, the ratio taken within each run."""
    out = []
    for workload, twin in FIXED_TWIN.items():
        for optimizer, system in itertools.product(("adagrad", "rowwise_adagrad"), _VARIANT):
            a, b = (
                _find(rows, workload, system, optimizer),
                _find(rows, twin, "embcore", optimizer),
            )
            if not a or not b or None in a["runs_cpu_ms"] or None in b["runs_cpu_ms"]:
                continue
            fixed = dict(zip(b["repeats"], b["runs_cpu_ms"], strict=True))
            ratios = [
                ms / fixed[r]
                for r, ms in zip(a["repeats"], a["runs_cpu_ms"], strict=True)
                if r in fixed
            ]
            if ratios:
                out.append(
                    (
                        workload,
                        a["label"] + _VARIANT[system],
                        float(np.median(a["runs_cpu_ms"])),
                        float(np.median(b["runs_cpu_ms"])),
                        float(np.median(ratios)),
                    )
                )
    return out


def dynamic_markdown(results: dict) -> str:
    """BENCHMARKS.md's dynamic-tables section: W3 against W1, the peers that ran (or why
    not), the rows held, and the key index alone (empty when W3 was not run)."""
    rows = summarize(results)
    dynamic = [r for r in rows if r["workload"] in FIXED_TWIN]
    index = results.get("dynamic_index")
    if not dynamic and index is None:
        return ""
    lines = [
        "## Dynamic tables (W3)",
        "",
        "W3 is W1's shape with raw 64-bit keys: the same Zipf ids as W1 (the same seeded "
        "batches), each mixed through a 64-bit hash (SplitMix64's finalizer), in dynamic tables"
        " (`TableConfig(vocabulary_size=None)`, docs/dynamic_tables.md) that start empty and "
        "admit every key on first sight, so the timed steps include the inserts of new keys and"
        " the growth of the row storage. It runs in the same process as W1, the workloads "
        "taking turns within each run; the ratio below is taken within each run. New rows take "
        "the dynamic tables' default initializer (drawn inside the lookup's kernel); the row "
        "\"W1's initializer\" starts them from W1's initializer instead (a user initializer, "
        "initial_capacity`initial_capacity` set to its fixed twin's vocabulary (the rows W1's "
        "fixed table allocates), reserving its key index, rows and slots and writing their "
        "pages when the engine is built (untimed), so its steps pay no growth and no first "
        "touch of memory (the same numbers; its state below is the rows reserved). W3-evict "
        "adds eviction (the workload line above says how much), which bites from the first "
        "steps. The peers keep one fixed-size table per feature, sized for every distinct key "
        "of the workload up front: plain PyTorch maps each key to a row through a Python `dict`"
        " (first sight, no eviction) in front of `nn.EmbeddingBag(sparse=True)` and "
        "`optim.Adagrad`; TorchRec's `ManagedCollisionEmbeddingBagCollection` puts an "
        "`MCHManagedCollisionModule` per table (LRU eviction, `eviction_interval=1`, so a key "
        "has its slot in the step that first sees it) in front of an unsharded "
        "`EmbeddingBagCollection` on CPU, whose bags are switched to sparse gradients for "
        "`optim.Adagrad` (unsharded TorchRec has no fused CPU optimizer). embcore's state is "
        "the rows held after the last step.",
        "",
    ]
    checks = [c for c in targets(rows) if "dynamic-table" in c["target"]]
    if checks:
        lines += ["| target | wanted | measured | met |", "|---|---|---|---|"]
        lines += [
            f"| {c['target']} | {c['want']} | {c['got']} | {'yes' if c['met'] else 'no'} |"
            for c in checks
        ]
        lines.append("")
    cpu = _cpu_ratios(rows)
    if cpu:
        lines += [
            "The same ratio in CPU time (the process's CPU seconds per step, median of the "
            "timed steps, ratio within each run, median over the runs): on a shared machine "
            "the steadier figure, equal to the wall clock with one thread and a core to itself.",
            "",
            "| workload | optimizer | CPU ms/step, embcore dynamic | CPU ms/step, fixed twin | "
            "ratio |",
            "|---|---|---:|---:|---:|",
        ]
        lines += [
            f"| {w} | {label} | {a:.1f} | {b:.1f} | {ratio:.2f}x |" for w, label, a, b, ratio in cpu
        ]
        lines.append("")
    held = [
        r
        for r in dynamic
        if r["system"] in (DYNAMIC, DYNAMIC_CAPACITY) and r["rows_held"] is not None
    ]
    embcore_rows = tuple(_VARIANT)
    if held:
        lines += [
            "| workload | optimizer | median ms/step | rows held after the last step | "
            "state (GiB) | peak RSS (GiB), run 1 |",
            "|---|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {r['workload']} | {r['label']}{_VARIANT[r['system']]} | {r['median_ms']:.1f} | "
            f"{r['rows_held']:,} | "
            f"{_gib(r['state_bytes'])} | {_gib(r['peak_rss'])} |"
            for r in held
        ]
        lines.append("")
    for r in dynamic:
        if r["system"] not in embcore_rows:
            ours = _find(rows, r["workload"], DYNAMIC, r["optimizer"])
            vs = "" if ours is None else f"; embcore is {speedup(ours, r):.2f}x faster"
            if ours is not None and (cpu := _cpu_speedup(ours, r)) is not None:
                vs += f" ({cpu:.2f}x in CPU time)"
            lines.append(
                f"* {r['workload']}, {r['system']} ({r['label']}): {r['median_ms']:.1f} ms/step{vs}"
            )
    for system, reason in results["skipped"].items():
        if system not in RAW_KEY_SYSTEMS:
            continue
        hint = (
            " (torchrec 1.8.0 with fbgemm-gpu-cpu 1.8.0 imports and runs on CPU beside torch "
            "2.13: install them to measure it)"
            if system.startswith("TorchRec")
            else ""
        )
        lines.append(f"* {system} could not run here: {reason}{hint}")
    if index is not None:
        from dynamic_index import markdown as index_markdown

        lines += ["", "The key index alone:", "", index_markdown(index).rstrip()]
    return "\n".join(lines) + "\n"
