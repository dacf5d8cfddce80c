"""A process training a disk table whose file is larger than the memory left to it stays
inside a memory cgroup (page cache included) and never reaches its limit: the rows are read
and written with O_DIRECT, so the file does not fill the page cache. Needs root and a cgroup
v1 memory controller; skipped (saying so) elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

GROUPS = Path("/sys/fs/cgroup/memory")
LIMIT = 560 << 20

CHILD = """
import sys, numpy as np, torch, embcore as ec
torch.set_num_threads(1)
table = ec.TableConfig(600_000, 64, name="t", storage=ec.DiskStorage(sys.argv[1], 4 << 20))
engine = ec.EmbeddingEngine(ec.FeatureConfig(table), ec.RowwiseAdagrad(learning_rate=0.01))
rng = np.random.default_rng(0)
for _ in range(12):
    ids = torch.from_numpy((rng.zipf(1.05, 4096) - 1) % 600_000)
    engine(ids).sum().backward()
info = engine.table_info("t")
assert info["disk_bytes"] > 250e6, info  # every block written: a file of about 300 MB
print(info["disk_bytes"])
"""


def _group() -> Path | None:
    if os.geteuid() != 0 or not (GROUPS / "memory.limit_in_bytes").is_file():
        return None
    group = GROUPS / f"embcore-test-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "memory.limit_in_bytes").write_text(str(LIMIT))
    except OSError:
        return None
    return group


@pytest.mark.slow
def test_training_stays_inside_a_memory_cgroup(tmp_path) -> None:
    group = _group()
    if group is None:
        pytest.skip("needs root and a cgroup v1 memory controller at /sys/fs/cgroup/memory")
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path)],
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        peak = int((group / "memory.max_usage_in_bytes").read_text())
        hits = int((group / "memory.failcnt").read_text())
    finally:
        group.rmdir()
    assert done.returncode == 0, done.stderr[-2000:]
    file_bytes = int(done.stdout.split()[-1])
    assert peak + file_bytes > LIMIT  # the file would not have fitted beside the process
    assert hits == 0 and peak < LIMIT, (peak, hits)
