"""Benchmark: TensorFlow's string hash (FarmHash Fingerprint64) over a batch of short strings.

Hashes N random ASCII strings of 8 to 24 characters into buckets, three ways taking turns,
and reports million strings per second (best of ``--repeats`` rounds) and the load average:

* ``embcore hash_buckets``: ``embcore.feature_column.hashing.hash_buckets`` on an object array
  of ``str``, end to end (UTF-8 buffer and
  offsets built in C, Numba kernel, modulo);
* ``embcore kernel only``: the Numba kernel on a ready byte buffer + offsets (starts, ends);
* ``farmhash per value``: ``farmhash.Fingerprint64(s) % n`` called once per string (the
  ``cityhash`` package, a C++ build of FarmHash), as a Python loop would use it.

    python benchmarks/sidebyside/hashing.py [--n 2000000] [--repeats 5]

``embcore bench`` runs it with its defaults and puts the table in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from embcore._numba.farmhash import fingerprint_bytes
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


def measure(n: int = 2_000_000, repeats: int = 5, buckets: int = 1_000_003) -> dict:
    """Million strings per second of each method (best of ``repeats``), with the load."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(8, 25, n)
    letters = rng.integers(97, 123, int(lengths.sum()), dtype=np.uint8).tobytes().decode()
    ends = np.cumsum(lengths)
    values = np.empty(n, dtype=object)
    values[:] = [letters[e - k : e] for e, k in zip(ends.tolist(), lengths.tolist(), strict=True)]
    buf = np.frombuffer(letters.encode(), dtype=np.uint8)
    starts = (ends - lengths).astype(np.int64)
    out = np.empty(n, dtype=np.uint64)
    hash_buckets(values[:10], buckets)  # compile (or load) the kernels

    rows = [
        ("embcore hash_buckets", lambda: hash_buckets(values, buckets)),
        ("embcore kernel only", lambda: fingerprint_bytes(buf, starts, ends, out)),
    ]
    try:
        import farmhash

        strings = values.tolist()
        rows.append(
            ("farmhash per value", lambda: [farmhash.Fingerprint64(s) % buckets for s in strings])
        )
    except ImportError:  # the cityhash package (test extra) is the reference, not a dependency
        pass
    return {
        "n": n,
        "repeats": repeats,
        "load": os.getloadavg()[0],
        "rates": _best_rates(rows, n, repeats),
    }


def markdown(result: dict) -> str:
    """BENCHMARKS.md's hashing section."""
    rows = "\n".join(f"| {name} | {rate:.1f} |" for name, rate in result["rates"].items())
    missing = (
        ""
        if "farmhash per value" in result["rates"]
        else "\n(the `cityhash` package was not installed: no per-value comparison)\n"
    )
    return (
        "## Hashing\n\n"
        "TensorFlow's string hash (FarmHash `Fingerprint64`, docs/feature_columns.md, \"The "
        f'hash") on {result["n"]:,} random ASCII strings of 8-24 bytes, the methods taking '
        f"turns, best of {result['repeats']} rounds (load average {result['load']:.1f}). "
        "`hash_buckets` is end to end from an object array of `str` (the strings joined into "
        "one UTF-8 buffer in C, then the Numba kernel and the modulo); the kernel row times the "
        "kernel alone on a ready buffer + offsets; the last row calls the `cityhash` package's "
        "`farmhash.Fingerprint64` once per string, as a Python loop would.\n\n"
        "| method | M strings/s |\n|---|---:|\n" + rows + "\n" + missing
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2_000_000, help="strings per batch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--buckets", type=int, default=1_000_003)
    args = parser.parse_args()
    print(markdown(measure(args.n, args.repeats, args.buckets)))


if __name__ == "__main__":
    main()
