"""``keep_freed_memory``: batch-sized blocks freed every step are reused, not re-faulted."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Two 27 MB blocks allocated, written and freed per "step", as a W1 step does with its
# activations and their gradients; prints the median page faults of a step.
STEPS = """
import ctypes, resource, statistics, sys, torch
from embcore.ops.cpu.malloc import keep_freed_memory
# start from glibc's default threshold, fixed (its dynamic adjustment varies run to run)
ctypes.CDLL("libc.so.6").mallopt(-3, 128 << 10)
if sys.argv[1] == "1":
    assert keep_freed_memory()
n = (27 << 20) // 4
counts = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = torch.empty(n).fill_(1); b = torch.empty(n).fill_(1); del a, b
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(statistics.median(counts[2:]))
"""


def faults_per_step(keep: bool) -> float:
    out = subprocess.run(
        [sys.executable, "-c", STEPS, "1" if keep else "0"],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_freed_blocks_are_reused_without_page_faults():
    pages = (2 * 27 << 20) // 4096
    assert faults_per_step(False) > pages / 2  # glibc's default maps them afresh
    assert faults_per_step(True) < pages / 20
