"""Benchmark: the dynamic tables' key index (embcore.dynamic.index.KeyIndex) on the CPU.

Keys are raw 64-bit ids: Zipf ranks (exponent 1.05, as in W1) or uniform draws, each mixed
through a 64-bit hash. Measured, each the best of ``--repeat`` runs:

* **inserts/s**: ``--keys`` distinct keys inserted into an empty index in batches of
  ``--batch`` (growth included, amortised; every key new);
* **lookups/s**: ``find`` of batches of ``--batch`` keys drawn by Zipf rank from the held
  keys (hits, hot keys repeat as in training data) and of uniform held keys (cache-cold);
* **bytes/key**: the index's slot arrays and free list over the keys held.

Rates are per wall-clock second and per CPU second of the process (all its threads): on a
shared machine the second is the steadier; the load average is printed beside them.

    python benchmarks/dynamic_index.py                   # 4M keys, batches of 106,496 (26 x 4096)
    python benchmarks/dynamic_index.py --keys 1000000 --threads 1

``embcore bench`` runs :func:`measure` and puts :func:`markdown`'s table in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

from embcore.dynamic.index import KeyIndex


def mixed(ranks: np.ndarray) -> np.ndarray:
    """Ranks through SplitMix64's finalizer: raw-looking 64-bit ids, negatives included."""
    z = ranks.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))).view(np.int64)


def zipf_ranks(rng: np.random.Generator, n: int, size: int, a: float = 1.05) -> np.ndarray:
    """``size`` ranks in ``[0, n)`` with P(rank r) proportional to ``(r + 1) ** -a``."""
    cdf = np.cumsum(np.arange(1, n + 1, dtype=np.float64) ** -a)
    return np.searchsorted(cdf, rng.random(size) * cdf[-1]).astype(np.int64)


def best_rate(fn, items: int, repeat: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """The best of ``repeat`` runs: items per wall-clock second and per CPU second of the
    process (all threads). On a shared machine the CPU rate is the steadier of the two."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return items / wall, items / cpu


def measure(
    keys: int = 4_000_000,
    batch: int = 26 * 4096,
    lookups: int = 4_000_000,
    repeat: int = 3,
    threads: int | None = None,
) -> dict:
    """Inserts/s, lookups/s (Zipf and uniform) and bytes/key of a :class:`KeyIndex` holding
    ``keys`` raw keys (see the module docstring), on ``threads`` torch threads (default:
    torch's; restored after)."""
    before = torch.get_num_threads()
    threads = threads or before
    torch.set_num_threads(threads)
    try:
        return _measure(keys, batch, lookups, repeat, threads)
    finally:
        torch.set_num_threads(before)


def _measure(n_keys: int, batch: int, lookups: int, repeat: int, threads: int) -> dict:
    rng = np.random.default_rng(0)
    keys = mixed(np.arange(n_keys))
    batches = [keys[i : i + batch] for i in range(0, keys.size, batch)]

    KeyIndex("warm-up").insert(keys[:1000])  # compile or load the kernels outside the timing
    holder: list[KeyIndex] = []

    def insert_all() -> None:
        index = KeyIndex("bench")
        for b in batches:
            index.insert(b)
        holder[:] = [index]

    load = os.getloadavg()[0]
    inserts = best_rate(insert_all, keys.size, repeat)
    index = holder[0]
    n_batches = max(1, lookups // batch)
    zipf = [mixed(zipf_ranks(rng, n_keys, batch)) for _ in range(n_batches)]
    uniform = [keys[rng.integers(0, keys.size, batch)] for _ in range(n_batches)]

    def find(queries: list[np.ndarray]):  # type: ignore[no-untyped-def]
        return lambda: [index.find(q) for q in queries]

    zipf_wall, zipf_cpu = best_rate(find(zipf), n_batches * batch, repeat)
    unif_wall, unif_cpu = best_rate(find(uniform), n_batches * batch, repeat)
    return {
        "keys": n_keys,
        "batch": batch,
        "threads": threads,
        "repeat": repeat,
        "inserts_per_s": inserts[0],
        "inserts_per_cpu_s": inserts[1],
        "lookups_per_s_zipf": zipf_wall,
        "lookups_per_cpu_s_zipf": zipf_cpu,
        "lookups_per_s_uniform": unif_wall,
        "lookups_per_cpu_s_uniform": unif_cpu,
        "bytes_per_key": index.bytes_per_key(),
        "capacity": index.capacity,
        "load": len(index) / index.capacity,
        "load_average": load,
        "load_average_after": os.getloadavg()[0],
    }


#: the issue's targets for the index alone: (result key, wanted, is a minimum)
TARGETS = (
    ("lookups_per_s_zipf", 20e6, True),
    ("lookups_per_s_uniform", 20e6, True),
    ("inserts_per_s", 5e6, True),
    ("bytes_per_key", 24.0, False),
)


def markdown(result: dict) -> str:
    """The index's table for BENCHMARKS.md."""
    r = result
    rows = [
        ("inserts (from empty, growth included)", "inserts_per_s", "inserts_per_cpu_s"),
        ("lookups, Zipf(1.05) keys", "lookups_per_s_zipf", "lookups_per_cpu_s_zipf"),
        (
            "lookups, uniform over the held keys",
            "lookups_per_s_uniform",
            "lookups_per_cpu_s_uniform",
        ),
    ]
    wanted = {k: (v, at_least) for k, v, at_least in TARGETS}
    lines = [
        f"{r['keys']:,} raw 64-bit keys, batches of {r['batch']:,} keys, {r['threads']} "
        f"thread(s), best of {r['repeat']}; 1-minute load average {r['load_average']:.1f} "
        f"before, {r['load_average_after']:.1f} after (`benchmarks/dynamic_index.py`).",
        "",
        "| index alone | M/s (wall clock) | M per CPU s | wanted | met |",
        "|---|---:|---:|---:|---|",
    ]
    for label, wall, cpu in rows:
        want, _ = wanted[wall]
        met = "yes" if r[wall] >= want else "no"
        lines.append(
            f"| {label} | {r[wall] / 1e6:.1f} | {r[cpu] / 1e6:.1f} | >= {want / 1e6:g} M/s | "
            f"{met} |"
        )
    bpk = r["bytes_per_key"]
    met = "yes" if bpk <= wanted["bytes_per_key"][0] else "no"
    lines.append(
        f"| index memory (load {r['load']:.2f}) | {bpk:.1f} bytes/key | | <= ~24 | {met} |"
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=4_000_000)
    parser.add_argument("--batch", type=int, default=26 * 4096)
    parser.add_argument("--lookups", type=int, default=4_000_000, help="keys found per run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    result = measure(args.keys, args.batch, args.lookups, args.repeat, args.threads)
    print(json.dumps(result, indent=1))
    print(markdown(result))


if __name__ == "__main__":
    main()
