"""W4: tables larger than memory (``embcore bench --disk DIR``).

W1's shape (26 tables, dim 64, batch 4096, one id per bag, Zipf 1.05 ids) with the Criteo 1TB
cardinalities capped at ``cap`` rows, RowwiseAdagrad, every table in ``DiskStorage`` under
``DIR`` with one shared ``cache_bytes``, every row written once before timing (the files at
full size). The training process runs inside a memory cgroup of ``limit`` bytes (page cache
included); the run reports, beside it: this disk's random 4 KiB read and write rates at one
request in flight and at the queue depth the tables use (measured in the same run), W1 in
memory, the I/O floor (rows moved per step over those rates), the hit rate of an ideal cache
of the same size on the same ids (Belady's, computed offline) and the cgroup's peak memory.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from sidebyside import disk_dynamic
from sidebyside.workloads import WORKLOADS, Workload, make_batches

__all__ = ["CRITEO_1TB", "run", "section"]

SECTION = "## Tables larger than memory (W4)"
CRITEO_1TB = (
    227605432, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 130229467, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 292775614, 40790948, 187188510, 590152, 12973, 108, 36,
)  # fmt: skip
_CGROUP = Path("/sys/fs/cgroup/memory")


def workload(cap: int) -> Workload:
    vocab = tuple(min(c, cap) for c in CRITEO_1TB)
    return Workload("W4", vocab, 64, 4096, 1, 1, description=f"Criteo 1TB capped at {cap:,}")


# ----------------------------------------------------------------------- the disk itself
def disk_rates(directory: Path, depth: int, seconds: float = 3.0) -> dict[str, float]:
    """Random 4 KiB O_DIRECT reads and writes per second on a 1 GiB scratch file in
    ``directory``, at 1 and ``depth`` requests in flight (threads)."""
    path, size = directory / "scratch.io", 1 << 30
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    try:
        block = mmap.mmap(-1, 1 << 22)
        for offset in range(0, size, 1 << 22):
            os.pwrite(fd, block, offset)
        out = {}
        for qd in (1, depth):
            for write in (False, True):
                out[f"{'write' if write else 'read'}_qd{qd}"] = _rate(fd, size, qd, write, seconds)
        return out
    finally:
        os.close(fd)
        os.unlink(path)


def _rate(fd: int, size: int, threads: int, write: bool, seconds: float) -> float:
    done, stop = [0] * threads, time.perf_counter() + seconds

    def worker(i: int) -> None:
        buffer, rng = memoryview(mmap.mmap(-1, 4096)), random.Random(i)
        while time.perf_counter() < stop:
            for _ in range(32):
                offset = rng.randrange(size // 4096) * 4096
                (os.pwritev if write else os.preadv)(fd, [buffer], offset)
            done[i] += 32

    start = time.perf_counter()
    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(done) / (time.perf_counter() - start)


# ----------------------------------------------------------------------- Belady's cache
@njit(cache=True)
def _belady(seq: np.ndarray, nxt: np.ndarray, capacity: int, count_from: int) -> int:
    """Hits of an ideal cache of ``capacity`` on ``seq`` (ids 0..U-1, ``nxt[i]``: the next
    position of ``seq[i]``, or len), counted from position ``count_from`` on."""
    n = seq.size
    held = np.zeros(seq.max() + 1 if n else 1, np.bool_)
    key = np.zeros(held.size, np.int64)
    heap_k, heap_v = np.empty(n + 1, np.int64), np.empty(n + 1, np.int64)  # a max-heap
    size, used, hits = 0, 0, 0
    for i in range(n):
        x = seq[i]
        if held[x]:
            hits += i >= count_from
        elif used == capacity:
            while True:  # pop until an entry that is still current
                k, v = heap_k[0], heap_v[0]
                size -= 1
                heap_k[0], heap_v[0] = heap_k[size], heap_v[size]
                j = 0
                while True:
                    c = 2 * j + 1
                    if c >= size:
                        break
                    if c + 1 < size and heap_k[c + 1] > heap_k[c]:
                        c += 1
                    if heap_k[c] <= heap_k[j]:
                        break
                    heap_k[j], heap_k[c] = heap_k[c], heap_k[j]
                    heap_v[j], heap_v[c] = heap_v[c], heap_v[j]
                    j = c
                if held[v] and key[v] == k:
                    held[v] = False
                    used -= 1
                    break
        if not held[x]:
            held[x] = True
            used += 1
        key[x] = nxt[i]
        heap_k[size], heap_v[size] = nxt[i], x  # push
        j = size
        size += 1
        while j > 0 and heap_k[(j - 1) // 2] < heap_k[j]:
            p = (j - 1) // 2
            heap_k[j], heap_k[p] = heap_k[p], heap_k[j]
            heap_v[j], heap_v[p] = heap_v[p], heap_v[j]
            j = p
    return hits


def belady_hits(stream: np.ndarray, capacity: int, count_from: int) -> int:
    """Hits of Belady's cache of ``capacity`` rows on ``stream`` (ids), from ``count_from``."""
    if stream.size == 0:
        return 0
    unique, seq = np.unique(stream, return_inverse=True)
    seq = seq.astype(np.int64).reshape(-1)
    nxt = _next_use(seq, unique.size)
    return int(_belady(seq, nxt, min(capacity, unique.size), count_from))


@njit(cache=True)
def _next_use(seq: np.ndarray, distinct: int) -> np.ndarray:
    nxt = np.empty(seq.size, np.int64)
    last = np.full(distinct, seq.size, np.int64)
    for i in range(seq.size - 1, -1, -1):
        nxt[i] = last[seq[i]]
        last[seq[i]] = i
    return nxt


# ----------------------------------------------------------------------- the training run
def _feeds(batches: list[Any]) -> list[dict[str, Any]]:
    import torch

    return [{f"f{t}": torch.from_numpy(v) for t, v in enumerate(b.values)} for b in batches]


def _step(engine: Any, feed: Any) -> None:
    acts = engine(feed)
    sum(a.sum() for a in acts.values()).backward()


def _totals(engine: Any) -> dict[str, int]:
    keys = ("hits", "misses", "rows_read", "rows_written", "bytes_read", "bytes_written")
    infos = [engine.table_info(t) for t in engine.table_names]
    return {k: sum(i[k] for i in infos) for k in keys}


def child(config: str) -> None:
    """The training process (inside the cgroup): write every row, warm the cache with
    training steps, time the steps."""
    import resource

    import torch

    import embcore as ec

    cfg = json.loads(config)
    torch.set_num_threads(cfg["threads"])
    w = workload(cfg["cap"])
    out: dict[str, Any] = {}
    tables = [ec.TableConfig(v, w.dim, name=f"t{i}") for i, v in enumerate(w.vocab)]
    features = {f"f{i}": ec.FeatureConfig(t) for i, t in enumerate(tables)}
    storage = ec.DiskStorage(cfg["dir"], cfg["cache_bytes"], io_threads=cfg["depth"])
    start = time.perf_counter()
    if cfg["dynamic"]:  # W3's raw keys in dynamic tables, the same ids
        engine = disk_dynamic.engine(w, cfg)
    else:
        opt = ec.RowwiseAdagrad(learning_rate=0.01)
        engine = ec.EmbeddingEngine(features, opt, storage=storage)
    out["create_s"] = time.perf_counter() - start
    disks = [r.disk for r in engine.store.rows]
    out["disk_bytes_created"] = sum(d.file.disk_bytes for d in disks)
    start = time.perf_counter()
    if cfg["dynamic"]:
        disk_dynamic.prefill(engine, w)
        w = disk_dynamic.raw(w)
        out["index_bytes"] = sum(engine.table_info(t)["index_bytes"] for t in engine.table_names)
    else:
        for d in disks:
            _prefill(d)
    out["prefill_s"] = time.perf_counter() - start
    out["disk_bytes"] = sum(d.file.disk_bytes for d in disks)
    out["capacity"] = {d.table.name: d.capacity for d in disks}  # engine order is not t0..t25
    out["record_bytes"] = disks[0].file.record_bytes
    start = time.perf_counter()  # training steps: the cache fills with changed rows, as
    for feed in _feeds(make_batches(w, cfg["warm"], seed=1)):  # in a long run
        _step(engine, feed)
    out["warm_s"] = time.perf_counter() - start
    feeds = _feeds(make_batches(w, cfg["warmup"] + cfg["steps"], seed=2))
    steps, before = [], _totals(engine)
    last = time.perf_counter()
    for i, (_, feed) in enumerate(ec.Prefetcher(engine, feeds, split=lambda x: (None, x))):
        _step(engine, feed)
        now = time.perf_counter()
        if i == cfg["warmup"] - 1:
            before = _totals(engine)
        if i >= cfg["warmup"]:
            steps.append(now - last)
        last = now
    after = _totals(engine)
    out["step_s"] = steps
    out["per_step"] = {k: (after[k] - before[k]) / len(steps) for k in after}
    out["rss_peak_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    Path(cfg["result"]).write_text(json.dumps(out))


def _prefill(disk: Any, chunk: int = 65536) -> None:
    """Write every row of ``disk`` (a ``DiskTable``) once, so that its file has its full size:
    values from NumPy's fast generator, not the initializer's truncated normal (three times
    slower to draw, and a step's speed does not depend on the values)."""
    import torch

    rng = np.random.default_rng(0)
    for start in range(0, disk.rows, chunk):
        n = min(chunk, disk.rows - start)
        values = {"weight": torch.from_numpy(rng.standard_normal((n, 64), np.float32) * 0.1)}
        values["accumulators"] = torch.full((n,), 0.1)
        disk.load_range(start, values)


def _in_cgroup(limit: int) -> Path | None:
    """A fresh cgroup v1 memory group of ``limit`` bytes, or ``None`` where there is none."""
    if not (_CGROUP / "memory.limit_in_bytes").is_file():
        return None
    group = _CGROUP / f"embcore-w4-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "memory.limit_in_bytes").write_text(str(limit))
    except OSError:
        return None
    return group


def _w1_memory_step(steps: int, warmup: int, threads: int) -> float:
    """Median seconds of a W1 step (RowwiseAdagrad, tables in memory), as W4 steps."""
    import torch

    import embcore as ec

    torch.set_num_threads(threads)
    w = WORKLOADS["W1"]
    tables = [ec.TableConfig(v, w.dim, name=f"t{i}") for i, v in enumerate(w.vocab)]
    features = {f"f{i}": ec.FeatureConfig(t) for i, t in enumerate(tables)}
    engine = ec.EmbeddingEngine(features, ec.RowwiseAdagrad(learning_rate=0.01))
    times = []
    for i, feed in enumerate(_feeds(make_batches(w, warmup + steps, seed=2))):
        start = time.perf_counter()
        _step(engine, feed)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return float(np.median(times))


def run(options: dict[str, Any], log: Any = print) -> dict[str, Any]:
    """Run W4 (see the module docstring); ``options``: ``dir``, ``cap``, ``cache_bytes``,
    ``limit``, ``depth``, ``warm``, ``warmup``, ``steps``, ``threads``."""
    directory = Path(options["dir"]) / "w4"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    w = workload(options["cap"])
    results: dict[str, Any] = {"options": options, "rows": sum(w.vocab)}
    log(f"W4: {sum(w.vocab):,} rows, disk rates at queue depth 1 and {options['depth']} ...")
    results["disk"] = disk_rates(directory, options["depth"])
    log(f"  {results['disk']}")
    results.update(_train(options, directory, dynamic=False, log=log))
    if results["exit_code"] == 0:
        results["belady"] = _ideal(w, options, results["capacity"])
    if options.get("dynamic", True):
        results["dynamic"] = _train(options, directory, dynamic=True, log=log)
    shutil.rmtree(directory, ignore_errors=True)
    log("  W1 in memory, same steps ...")
    results["w1_step_s"] = _w1_memory_step(options["steps"], options["warmup"], options["threads"])
    return results


def _train(options: dict[str, Any], directory: Path, dynamic: bool, log: Any) -> dict[str, Any]:
    """One training process inside its own cgroup (the dynamic set's limit is raised by its
    key indexes' allowance); its results, peak memory and exit code."""
    rows = sum(workload(options["cap"]).vocab)
    limit = options["limit"] + (rows * disk_dynamic.INDEX_BYTES_PER_KEY if dynamic else 0)
    out: dict[str, Any] = {"limit": limit}
    group = _in_cgroup(limit)
    out["cgroup"] = str(group) if group else None
    rows_dir = directory / ("dynamic" if dynamic else "rows")
    result = directory / f"child-{int(dynamic)}.json"
    config = dict(options, dir=str(rows_dir), result=str(result), dynamic=dynamic)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    join = None if group is None else lambda: (group / "cgroup.procs").write_text(str(os.getpid()))
    what = "dynamic tables (W3's raw keys)" if dynamic else "fixed tables"
    log(f"  training the {what} inside {group or 'no cgroup (none available)'} ...")
    code = f"from sidebyside.disk import child; child({json.dumps(config)!r})"
    done = subprocess.run([sys.executable, "-c", code], env=env, preexec_fn=join, check=False)
    if group is not None:
        out["peak_bytes"] = int((group / "memory.max_usage_in_bytes").read_text())
        out["limit_hits"] = int((group / "memory.failcnt").read_text())
        out["oom_kills"] = _oom_kills(group)
        group.rmdir()
    out["exit_code"] = done.returncode
    if done.returncode == 0:
        out.update(json.loads(result.read_text()))
    shutil.rmtree(rows_dir, ignore_errors=True)
    return out


def _oom_kills(group: Path) -> int:
    for line in (group / "memory.oom_control").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def _ideal(w: Workload, options: dict[str, Any], capacity: dict[str, int]) -> dict[str, float]:
    """Hit rate of Belady's cache of each table's capacity on the run's ids (warm-up calls
    included, hits counted over the timed steps), beside the same count's total."""
    warm = make_batches(w, options["warm"], seed=1)
    steps = make_batches(w, options["warmup"] + options["steps"], seed=2)
    hits = lookups = 0
    for t in range(w.tables):
        calls = [np.unique(b.values[t]) for b in warm + steps]
        stream = np.concatenate(calls)
        skip = sum(c.size for c in calls[: len(warm) + options["warmup"]])
        hits += belady_hits(stream, capacity[f"t{t}"], skip)
        lookups += stream.size - skip
    return {"hits": hits, "lookups": lookups, "hit_rate": hits / lookups}


# ----------------------------------------------------------------------- the report
def section(results: dict[str, Any], command: str, load: str) -> str:
    """BENCHMARKS.md's W4 section from :func:`run`'s results."""
    o, d = results["options"], results["disk"]
    mib = 1 << 20
    full = sum(min(c, 40_000_000) for c in CRITEO_1TB) * results.get("record_bytes", 512) / 1e9
    scaled = (
        f"; MLPerf's cap of 40M rows would need {full:.0f} GB of files: scaled down to fit "
        "this machine's free disk"
        if o["cap"] < 40_000_000
        else ""
    )
    head = (
        f"{SECTION}\n\n"
        f"W1's shape (26 tables, dim 64, batch 4096, one id per bag, Zipf 1.05) with the "
        f"Criteo 1TB cardinalities capped at {o['cap']:,} rows ({results['rows']:,} rows{scaled}), "
        f"RowwiseAdagrad, every table in DiskStorage with one {o['cache_bytes'] // mib} MiB "
        f"cache, {o['depth']} requests in flight, every row written once before timing, the "
        f"training process inside a {o['limit'] // mib} MiB memory cgroup (page cache "
        f"included). Beside it, the same ids as W3's raw 64-bit keys in dynamic tables "
        "(admitted on first sight, never evicted; every key admitted and its row written "
        "before timing), each table with the cache the fixed table of its size gets. "
        f"Command: `{command}`; load average at the start: {load}.\n\n"
    )
    if results.get("exit_code") != 0:
        return head + f"The training process failed (exit code {results.get('exit_code')}).\n"
    w1, per = results["w1_step_s"], results["per_step"]
    read_rate, write_rate = d[f"read_qd{o['depth']}"], d[f"write_qd{o['depth']}"]
    floor = per["rows_read"] / read_rate + per["rows_written"] / write_rate
    step = float(np.median(results["step_s"]))
    hit = per["hits"] / max(1, per["hits"] + per["misses"])
    belady = results["belady"]["hit_rate"]
    sets = [_figures(results, o, d, w1, belady, results["rows"])]
    dyn = results.get("dynamic")
    if dyn is not None:
        sets.append(
            _figures(dyn, o, d, w1, belady, results["rows"]) if dyn["exit_code"] == 0 else None
        )
    qd = f"QD 1 / QD {o['depth']}"
    shared = [
        ("W1 step in memory (same steps, outside the cgroup)", f"{w1 * 1e3:.0f} ms"),
        (f"disk: random 4 KiB reads/s, {qd}", f"{d['read_qd1']:,.0f} / {read_rate:,.0f}"),
        (f"disk: random 4 KiB writes/s, {qd}", f"{d['write_qd1']:,.0f} / {write_rate:,.0f}"),
    ]
    names = ["fixed tables", "dynamic tables, W3's raw keys"][: len(sets)]
    table = "| measure | " + " | ".join(names) + " |\n|---|" + "---|" * len(sets) + "\n"
    for n, (label, _) in enumerate(sets[0]):
        cells = [s_[n][1] if s_ is not None else "failed" for s_ in sets]
        table += f"| {label} | " + " | ".join(cells) + " |\n"
    table += "".join(f"| {a} | " + " | ".join([b] * len(sets)) + " |\n" for a, b in shared)
    bounded = "the disk (its I/O floor is above W1's step)" if floor > w1 else "the CPU (W1)"
    tail = (
        f"\nWhat bounds W4 here: {bounded}. The step takes {step / floor:.2f}x the time the "
        f"disk needs for its reads and writes at queue depth {o['depth']} "
        f"({per['rows_read'] + per['rows_written']:,.0f} random 512-byte transfers a step), "
        f"and its cache hits {hit / belady:.0%} of what an ideal cache of the same size would "
        "on the same ids. The training process's memory, page cache included, stayed within "
        "the cgroup's limit (row above). The dynamic tables' process may also hold their key "
        f"indexes: its limit is {disk_dynamic.INDEX_BYTES_PER_KEY} bytes a key higher.\n"
    )
    return head + table + tail


def _figures(
    res: dict[str, Any],
    o: dict[str, Any],
    d: dict[str, float],
    w1: float,
    belady: float,
    keys: int,
) -> list[tuple[str, str]]:
    """One set's column of the W4 table (``keys``: the tables' rows)."""
    step = float(np.median(res["step_s"]))
    per = res["per_step"]
    read_rate, write_rate = d[f"read_qd{o['depth']}"], d[f"write_qd{o['depth']}"]
    floor = per["rows_read"] / read_rate + per["rows_written"] / write_rate
    hit = per["hits"] / max(1, per["hits"] + per["misses"])
    moved = f"{per['bytes_read'] / 1e6:.1f}, {per['bytes_written'] / 1e6:.1f}"
    index = res.get("index_bytes")
    return [
        ("W4 step (median of timed steps)", f"{step * 1e3:.0f} ms"),
        ("I/O floor: rows read / read rate + rows written / write rate", f"{floor * 1e3:.0f} ms"),
        ("W4 step / max(W1 step, I/O floor)", f"{step / max(floor, w1):.2f}x (target 1.5x)"),
        ("hit rate / Belady's ideal cache on the same ids", f"{hit:.3f} / {belady:.3f}"),
        ("rows read, written per step", f"{per['rows_read']:,.0f}, {per['rows_written']:,.0f}"),
        ("MB read, written per step", moved),
        ("peak memory (cgroup, page cache included) / limit", _peak(res, o)),
        ("key index in RAM (besides the cache)", "none" if index is None else
         f"{index / 1e6:.1f} MB, {index / keys:.0f} B a key"),
        ("creating the engine; its files on disk after",
         f"{res['create_s']:.2f} s; {res['disk_bytes_created'] / 1e6:.1f} MB"),
        ("writing every row once; the files on disk after",
         f"{res['prefill_s']:.0f} s; {res['disk_bytes'] / 1e9:.2f} GB"),
    ]  # fmt: skip


def _peak(results: dict[str, Any], o: dict[str, Any]) -> str:
    mib = 1 << 20
    if results.get("peak_bytes") is None:
        return f"no cgroup here; the process's peak RSS {results['rss_peak_bytes'] // mib} MiB"
    return (
        f"{results['peak_bytes'] // mib} MiB / {results['limit'] // mib} MiB (limit reached "
        f"{results['limit_hits']} times, {results['oom_kills']} OOM kills)"
    )
