"""Benchmark: pipelined execution and lookup statistics, side by side (issue 7).

Two workloads, each run in one process on pre-generated batches, every variant interleaved
with the others in rounds (so drift on a shared machine hits them alike):

* **W1** of BENCHMARKS.md (26 one-hot Criteo-sized tables, dim 64, batch 4096, Adagrad) with a
  small dense tower on the concatenated activations (``1664 -> 256 -> 64 -> 1``, SGD), so a
  step has dense work to overlap with the embedding update;
* the **main job** (``embcore train``): the DLRM of the default config, built by the job's own
  functions (``build_model``), stepping as its loop does (forward, BCE, backward, Adam).

Variants per workload: the full step without and with ``pipeline=True``; the embedding part
alone (lookup, a projection loss, backward and update); the dense part alone (the same dense
model on fixed activations, with their gradients); and the full step with
``profile_data_directory`` (3% sampling). Batches are converted inside the timed step (the
main job's loop does it in a ``Prefetcher`` thread), so the statistics' sampling is timed.

Reported: median ms per step; the pipelining speed-up ``t_full / t_pipelined``; the **overlap
achieved** ``(t_embedding + t_dense - t_full) / min(t_embedding, t_dense)`` for each full step:
0 when the two parts run one after the other, 1 when the smaller one is hidden completely
(negative: the combined step costs more than its parts); and the statistics overhead in two
parts: on the steps that are not sampled, measured (median step with statistics over without,
minus 1), and the sampling, estimated (``sample_rate x`` the time to profile one batch
``/ t_full``: with 3% sampling a timed run holds too few sampled steps to measure it). A
control variant runs the full step again (a second dense model on the same engine for W1, a
second model for the main job): its difference from the first is the noise floor. The JSON
also holds mean-based ratios. Last, ``prepare`` alone is timed on the engine without and the
one with statistics: the only per-step work statistics add outside sampled steps.

    python benchmarks/pipelining.py                 # W1 + main job; JSON + markdown
    python benchmarks/pipelining.py --quick         # W1-quick and a small main job (seconds)
    python benchmarks/pipelining.py --update-docs   # also rewrite the "Measured" section of
                                                    # docs/pipelining_and_stats.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import embcore as ec
from embcore.ops.cpu.malloc import keep_freed_memory
from embcore.stats import StatsCollector, StatsTable
from embcore.train.config import Config
from embcore.train.model import build_model, embedding_optimizer
from embcore.train.sources import build_source

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from sidebyside.workloads import WORKLOADS, make_batches, projection  # noqa: E402

Step = Callable[[int], None]
VARIANTS = ("full", "full_repeat", "full_pipelined", "embedding", "dense", "full_stats")


# ------------------------------------------------------------------------------- timing
def interleaved(steps: dict[str, Step], rounds: int, per_round: int) -> dict[str, list[float]]:
    """Seconds per step of every variant: ``rounds`` rounds in which each variant runs
    ``per_round + 1`` steps in turn; each round's first step is not kept (it finds the
    machine as the previous variant left it, and a pipelined update already finished)."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    i = 0
    for _ in range(rounds):
        for name, step in steps.items():
            for k in range(per_round + 1):
                start = time.perf_counter()
                step(i)
                elapsed = time.perf_counter() - start
                i += 1
                if k:
                    times[name].append(elapsed)
    return times


def profile_cost(engine: ec.EmbeddingEngine, prepared: list[ec.PreparedBatch]) -> float:
    """Median seconds to profile one prepared batch (what a sampled step adds)."""
    with tempfile.TemporaryDirectory() as tmp:
        tables = [
            StatsTable(t.name, t.vocabulary_size, t.dim, len(t.features)) for t in engine.tables
        ]
        collector = StatsCollector(tmp, tables, sample_rate=1.0)
        seconds = []
        for p in prepared:
            by_table = [[p.batches[i] for i in t.features] for t in engine.tables]
            start = time.perf_counter()
            collector.observe(by_table)
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def prepare_cost(
    plain: ec.EmbeddingEngine, stats: ec.EmbeddingEngine, inputs: list[Any], rounds: int = 5
) -> dict[str, float]:
    """Median ms of ``prepare`` (validation, conversion, the sampling decision) on an engine
    without and one with statistics, interleaved: the per-step cost outside sampled steps
    (the medians leave the rare sampled batches out)."""
    times: dict[str, list[float]] = {"plain": [], "stats": []}
    for _ in range(rounds):
        for name, engine in (("plain", plain), ("stats", stats)):
            for x in inputs:
                start = time.perf_counter()
                engine.prepare(x)
                times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def summarize(times: dict[str, list[float]], profile_seconds: float, rate: float) -> dict:
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    mean = {name: 1e3 * statistics.fmean(t) for name, t in times.items()}
    emb, dense = ms["embedding"], ms["dense"]

    def overlap(full: float) -> float:
        return (emb + dense - full) / min(emb, dense)

    return {
        "ms_per_step": ms,
        "mean_ms_per_step": mean,
        "steps_timed": {name: len(t) for name, t in times.items()},
        "speedup_pipelined": ms["full"] / ms["full_pipelined"],
        "overlap": {"full": overlap(ms["full"]), "full_pipelined": overlap(ms["full_pipelined"])},
        "stats_overhead_median": ms["full_stats"] / ms["full"] - 1,
        "noise_floor_median": ms["full_repeat"] / ms["full"] - 1,
        "stats_overhead_mean": mean["full_stats"] / mean["full"] - 1,
        "noise_floor_mean": mean["full_repeat"] / mean["full"] - 1,
        "stats_profile_ms": 1e3 * profile_seconds,
        "stats_overhead_estimated": rate * 1e3 * profile_seconds / ms["full"],
    }


# ----------------------------------------------------------------------------------- W1
def w1(name: str, batches: int, rate: float, tmp: str, args: argparse.Namespace) -> dict:
    workload = WORKLOADS[name]
    data = make_batches(workload, batches)
    tables = [
        ec.TableConfig(
            vocabulary_size=v,
            dim=workload.dim,
            combiner="sum",
            initializer=lambda shape, dtype=torch.float32: torch.empty(shape, dtype=dtype).uniform_(
                -0.05, 0.05
            ),
            name=f"table_{t}",
        )
        for t, v in enumerate(workload.vocab)
    ]
    config = {f"f{t:02d}": ec.FeatureConfig(table=table) for t, table in enumerate(tables)}
    names = list(config)

    def engine(**options: Any) -> ec.EmbeddingEngine:
        opt = ec.Adagrad(learning_rate=0.01, initial_accumulator_value=0.1)
        return ec.EmbeddingEngine(config, optimizer=opt, **options)

    engines = {
        "plain": engine(),
        "pipelined": engine(pipeline=True),
        "stats": engine(profile_data_directory=tmp, profile_sample_rate=rate),
    }
    inputs = [{f: torch.from_numpy(v) for f, v in zip(names, b.values, strict=True)} for b in data]
    width = workload.tables * workload.dim
    gen = torch.Generator().manual_seed(0)
    labels = [torch.randint(0, 2, (workload.batch,), generator=gen).float() for _ in data]
    fixed = [torch.randn(workload.batch, width, generator=gen) * 0.05 for _ in range(4)]
    proj = projection(workload.dim)

    def tower() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        sizes = [width, *args.tower, 1]
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(sizes):
            layers += [nn.Linear(a, b), nn.ReLU()]
        model = nn.Sequential(*layers[:-1])
        return model, torch.optim.SGD(model.parameters(), lr=0.01)

    def full(emb: ec.EmbeddingEngine) -> Step:
        model, opt = tower()

        def step(i: int) -> None:
            acts = emb(inputs[i % len(inputs)])
            x = torch.cat([acts[f] for f in names], dim=1)  # (B, 26 * 64)
            loss = F.binary_cross_entropy_with_logits(model(x).squeeze(1), labels[i % len(labels)])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step

    def embedding_only(i: int) -> None:
        acts = engines["plain"](inputs[i % len(inputs)])
        sum(((a @ proj) ** 2).sum() for a in acts.values()).backward()  # type: ignore[union-attr]

    model, opt = tower()

    def dense_only(i: int) -> None:
        x = fixed[i % len(fixed)].requires_grad_(True)
        loss = F.binary_cross_entropy_with_logits(model(x).squeeze(1), labels[i % len(labels)])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        x.grad = None

    steps = {
        "full": full(engines["plain"]),
        "full_pipelined": full(engines["pipelined"]),
        "embedding": embedding_only,
        "dense": dense_only,
        "full_stats": full(engines["stats"]),
        "full_repeat": full(engines["plain"]),
    }
    for step in steps.values():  # warm up (Numba compilation, allocator)
        for i in range(args.warmup):
            step(i)
    times = interleaved(steps, args.rounds, args.per_round)
    prepared = [engines["plain"].prepare(x) for x in inputs[:5]]
    out = summarize(times, profile_cost(engines["plain"], prepared), rate)
    out["prepare_ms"] = prepare_cost(engines["plain"], engines["stats"], inputs[:8])
    out["description"] = (
        f"{workload.description}; tower {' -> '.join(map(str, [width, *args.tower, 1]))}"
    )
    return out


# ----------------------------------------------------------------------------- main job
def main_job(batches: int, rate: float, tmp: str, args: argparse.Namespace) -> dict:
    cfg = Config().with_overrides(args.set)
    torch.set_num_threads(cfg.train.threads or torch.get_num_threads())
    source = build_source(cfg.data)
    data = list(itertools.islice(source.train_batches(0), batches))

    def model(**options: Any) -> tuple[Any, torch.optim.Optimizer]:
        m = build_model(
            cfg.model,
            source.vocab_sizes,
            optimizer=embedding_optimizer(cfg.optim),
            seed=cfg.train.seed,
            engine_options=options,
        )
        return m, torch.optim.Adam(m.parameters(), lr=cfg.optim.dense_lr)

    built: dict[str, Any] = {}

    def full(**options: Any) -> Step:
        m, opt = model(**options)
        built.setdefault("stats" if "profile_data_directory" in options else "plain", m)

        def step(i: int) -> None:  # the loop's step (embcore.train.loop), lr schedule aside
            b = data[i % len(data)]
            loss = F.binary_cross_entropy_with_logits(m(b.dense, b.sparse), b.labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step

    emb_model, _ = model()
    proj = projection(cfg.model.embedding_dim)

    def embedding_only(i: int) -> None:
        acts = emb_model.engine(emb_model.features(data[i % len(data)].sparse))
        sum(((a @ proj) ** 2).sum() for a in acts.values()).backward()  # type: ignore[union-attr]

    dense_model, dense_opt = model()
    gen = torch.Generator().manual_seed(0)
    fields, dim = len(dense_model.sparse_names), cfg.model.embedding_dim
    fixed = [torch.randn(cfg.data.batch_size, fields, dim, generator=gen) * 0.05 for _ in range(4)]

    def dense_only(i: int) -> None:
        b = data[i % len(data)]
        emb = fixed[i % len(fixed)].requires_grad_(True)
        logits = dense_model.top(dense_model.interaction(dense_model.bottom(b.dense), emb))
        loss = F.binary_cross_entropy_with_logits(logits.squeeze(1), b.labels)
        dense_opt.zero_grad(set_to_none=True)
        loss.backward()
        dense_opt.step()
        emb.grad = None

    steps = {
        "full": full(),
        "full_pipelined": full(pipeline=True),
        "embedding": embedding_only,
        "dense": dense_only,
        "full_stats": full(profile_data_directory=tmp, profile_sample_rate=rate),
        "full_repeat": full(),
    }
    for step in steps.values():
        for i in range(args.warmup):
            step(i)
    times = interleaved(steps, args.rounds, args.per_round)
    engine = emb_model.engine
    prepared = [engine.prepare(emb_model.features(b.sparse)) for b in data[:5]]
    out = summarize(times, profile_cost(engine, prepared), rate)
    ids = [emb_model.features(b.sparse) for b in data[:8]]
    out["prepare_ms"] = prepare_cost(built["plain"].engine, built["stats"].engine, ids)
    out["description"] = (
        f"DLRM ({cfg.model.interaction}), 26 tables capped at {cfg.data.vocab_cap} rows x "
        f"{dim}, batch {cfg.data.batch_size}, {cfg.train.threads or 'default'} torch thread(s)"
    )
    return out


# ------------------------------------------------------------------------------ report
def markdown(results: dict) -> str:
    lines = [
        "| workload | step | ms/step (median) | vs full |",
        "|---|---|---|---|",
    ]
    labels = {
        "full": "full step",
        "full_pipelined": "full step, `pipeline=True`",
        "embedding": "embedding part alone",
        "dense": "dense part alone",
        "full_stats": "full step, statistics (3%)",
        "full_repeat": "full step again (control)",
    }
    for name, r in results["workloads"].items():
        ms = r["ms_per_step"]
        for v in VARIANTS:
            lines.append(f"| {name} | {labels[v]} | {ms[v]:.1f} | {ms[v] / ms['full']:.2f} |")
    lines += [
        "",
        "| workload | speed-up from pipelining | overlap, pipelined | overlap, not pipelined "
        "| statistics, unsampled steps (control) | statistics, sampling (estimated) "
        "| prepare ms, without / with statistics |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results["workloads"].items():
        lines.append(
            f"| {name} | {r['speedup_pipelined']:.2f}x | {r['overlap']['full_pipelined']:.2f} "
            f"| {r['overlap']['full']:.2f} | {100 * r['stats_overhead_median']:+.1f}% "
            f"({100 * r['noise_floor_median']:+.1f}%) "
            f"| {100 * r['stats_overhead_estimated']:.2f}% ({r['stats_profile_ms']:.1f} ms per "
            f"profiled batch) | {r['prepare_ms']['plain']:.2f} / {r['prepare_ms']['stats']:.2f} |"
        )
    return "\n".join(lines)


def measured_section(results: dict) -> str:
    hw = results["hardware"]
    workloads = "\n".join(
        f"* **{name}**: {r['description']}" for name, r in results["workloads"].items()
    )
    return (
        "## Measured\n\n"
        f"Command: `{results['command']}` ({hw['cores']} cores, torch {hw['torch']}, "
        f"load average before the run {hw['loadavg']}; {results['rounds']} rounds of "
        f"{results['per_round']} timed steps per variant, interleaved).\n\n"
        f"{workloads}\n\n{markdown(results)}\n"
    )


def update_docs(path: Path, section: str) -> None:
    """Replace the ``## Measured`` section (to the next ``## `` heading or the end)."""
    text = path.read_text()
    start = text.find("## Measured\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + ("" if end < 0 else text[end:])
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="W1-quick and a small main job")
    p.add_argument("--workloads", nargs="+", choices=["W1", "main"], default=["W1", "main"])
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 4)")
    p.add_argument("--per-round", type=int, default=None, help="timed steps per round (5)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--tower", type=int, nargs="+", default=[256, 64], help="W1 hidden sizes")
    p.add_argument("--rate", type=float, default=0.03, help="statistics sample rate")
    p.add_argument("--threads", type=int, help="torch threads for W1 (default: torch's)")
    p.add_argument(
        "--set", action="append", default=[], help="main-job config override (section.key=v)"
    )
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.add_argument("--update-docs", action="store_true", help="rewrite docs' Measured section")
    args = p.parse_args(argv)
    keep_freed_memory()  # as embcore train and embcore bench do
    args.rounds = args.rounds or (2 if args.quick else 4)
    args.per_round = args.per_round or (3 if args.quick else 5)
    if args.quick:
        args.set = ["data.vocab_cap=20000", "data.batch_size=512", *args.set]
    batches = 16
    threads = torch.get_num_threads()
    results: dict[str, Any] = {
        "command": "python benchmarks/pipelining.py " + shlex.join(argv or sys.argv[1:]),
        "hardware": {
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "loadavg": Path("/proc/loadavg").read_text().split()[:3]
            if Path("/proc/loadavg").exists()
            else None,
        },
        "rounds": args.rounds,
        "per_round": args.per_round,
        "workloads": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        if "W1" in args.workloads:
            if args.threads:
                torch.set_num_threads(args.threads)
            name = "W1-quick" if args.quick else "W1"
            print(f"{name} ...", flush=True)
            results["workloads"][name] = w1(name, batches, args.rate, f"{tmp}/w1", args)
            torch.set_num_threads(threads)
        if "main" in args.workloads:
            print("main job ...", flush=True)
            results["workloads"]["main job"] = main_job(batches, args.rate, f"{tmp}/main", args)
            torch.set_num_threads(threads)
    results["hardware"]["loadavg_after"] = (
        Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None
    )
    table = markdown(results)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pipelining.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "pipelining.md").write_text(measured_section(results))
    print(f"wrote {args.out / 'pipelining.json'} and {args.out / 'pipelining.md'}")
    if args.update_docs:
        docs = ROOT.parent / "docs" / "pipelining_and_stats.md"
        update_docs(docs, measured_section(results))
        print(f"wrote {docs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
