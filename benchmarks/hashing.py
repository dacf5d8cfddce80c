"""Benchmark: TensorFlow's string hash (FarmHash Fingerprint64) over a batch of short strings.

Hashes N random ASCII strings of 8 to 24 characters into buckets, three ways taking turns,
and reports million strings per second (best of ``--repeats`` rounds) and the load average:

* ``embcore hash_buckets``: ``embcore.feature_column.hashing.hash_buckets`` on an object array
  of ``str``, end to end (UTF-8 buffer and
  offsets built in C, Numba kernel, modulo);
* ``embcore kernel only``: the Numba kernel on a ready byte buffer + offsets (starts, ends);
* ``farmhash per value``: ``farmhash.Fingerprint64(s) % n`` called once per string (the
  ``cityhash`` package, a C++ build of FarmHash), as a Python loop would use it.

    python benchmarks/hashing.py [--n 2000000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from embcore.feature_column._farmhash import fingerprint_bytes
from embcore.feature_column.hashing import hash_buckets


def _best_rates(rows, n: int, repeats: int) -> dict[str, float]:
    """Million values per second of each method, best of ``repeats`` rounds; the methods
    take turns in every round, so drift on a shared machine hits them alike."""
    best = {name: float("inf") for name, _ in rows}
    for _ in range(repeats):
        for name, fn in rows:
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: n / t / 1e6 for name, t in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2_000_000, help="strings per batch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--buckets", type=int, default=1_000_003)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    lengths = rng.integers(8, 25, args.n)
    letters = rng.integers(97, 123, int(lengths.sum()), dtype=np.uint8).tobytes().decode()
    ends = np.cumsum(lengths)
    values = np.empty(args.n, dtype=object)
    values[:] = [letters[e - k : e] for e, k in zip(ends.tolist(), lengths.tolist(), strict=True)]
    buf = np.frombuffer(letters.encode(), dtype=np.uint8)
    starts = (ends - lengths).astype(np.int64)
    out = np.empty(args.n, dtype=np.uint64)
    hash_buckets(values[:10], args.buckets)  # compile (or load) the kernels

    rows = [
        ("embcore hash_buckets", lambda: hash_buckets(values, args.buckets)),
        ("embcore kernel only", lambda: fingerprint_bytes(buf, starts, ends, out)),
    ]
    try:
        import farmhash

        strings = values.tolist()
        rows.append(
            (
                "farmhash per value",
                lambda: [farmhash.Fingerprint64(s) % args.buckets for s in strings],
            )
        )
    except ImportError:
        print("(farmhash not installed: pip install cityhash for the per-value comparison)")
    rates = _best_rates(rows, args.n, args.repeats)
    load = os.getloadavg()[0]
    print(f"{args.n:,} strings of 8-24 bytes, best of {args.repeats} rounds; ", end="")
    print(f"{os.cpu_count()} cores, load average {load:.1f}")
    print("| method | M strings/s |\n|---|---:|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:.1f} |")


if __name__ == "__main__":
    main()
