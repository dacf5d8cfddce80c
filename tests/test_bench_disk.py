"""W4's dynamic set (``embcore bench --disk``): its tables get the caches the fixed set's
engine-wide budget gives the fixed tables of the same size, and its report has both columns."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch

import embcore as ec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from sidebyside import disk, disk_dynamic
from sidebyside.workloads import Workload, make_batches


def test_dynamic_caches_are_the_fixed_split(tmp_path) -> None:
    w = Workload("tiny", (40, 3, 900, 7), 8, 16, 1, 1)
    budget = 30_000
    tables = [ec.TableConfig(v, w.dim, name=f"t{i}") for i, v in enumerate(w.vocab)]
    features = {f"f{i}": ec.FeatureConfig(t) for i, t in enumerate(tables)}
    fixed = ec.EmbeddingEngine(
        features,
        ec.RowwiseAdagrad(learning_rate=0.1),
        storage=ec.DiskStorage(tmp_path / "fixed", budget),
    )
    cfg = {"dir": str(tmp_path / "dynamic"), "cache_bytes": budget, "depth": 2}
    dynamic = disk_dynamic.engine(w, cfg)
    for name in fixed.table_names:
        want = fixed.table_info(name)["cache_capacity"]
        assert dynamic.table_info(name)["cache_capacity"] == want, name
    disk_dynamic.prefill(dynamic, w)
    for t, vocab in enumerate(w.vocab):
        assert dynamic.table_info(f"t{t}")["rows"] == vocab
    (batch,) = make_batches(disk_dynamic.raw(w), 1, seed=3)
    acts = dynamic({f"f{t}": torch.from_numpy(v) for t, v in enumerate(batch.values)})
    sum(a.sum() for a in acts.values()).backward()
    for t, vocab in enumerate(w.vocab):  # every key of the stream was admitted before
        assert dynamic.table_info(f"t{t}")["rows"] == vocab
    assert dynamic.table_info("t2")["rows_read"] > 0  # prefilled rows read back from disk
    del fixed, dynamic
    gc.collect()


def _set(step: float, index: int | None) -> dict:
    per = {"rows_read": 100.0, "rows_written": 50.0, "hits": 30.0, "misses": 10.0}
    per |= {"bytes_read": 51200.0, "bytes_written": 25600.0}
    out = {"exit_code": 0, "step_s": [step, step], "per_step": per, "limit": 1 << 30}
    out |= {"rss_peak_bytes": 1 << 28, "create_s": 0.1, "disk_bytes_created": 0}
    out |= {"prefill_s": 2.0, "disk_bytes": 10**9, "capacity": {"t0": 5}}
    if index is not None:
        out["index_bytes"] = index
    return out


def test_the_report_has_both_sets() -> None:
    options = {"cap": 1000, "cache_bytes": 1 << 20, "limit": 1 << 30, "depth": 16}
    results = {"options": options, "rows": 2000, "w1_step_s": 0.001, **_set(0.02, None)}
    results["disk"] = {"read_qd1": 5000.0, "read_qd16": 10000.0}
    results["disk"] |= {"write_qd1": 5000.0, "write_qd16": 10000.0}
    results["belady"] = {"hit_rate": 0.8}
    results["dynamic"] = _set(0.03, 100_000)
    text = disk.section(results, "embcore bench --disk x", "1.00")
    header = next(line for line in text.splitlines() if line.startswith("| measure"))
    assert "fixed tables" in header and "dynamic tables" in header
    # floor: 100 / 10,000 + 50 / 10,000 s = 15 ms; steps 20 and 30 ms
    ratio = next(line for line in text.splitlines() if line.startswith("| W4 step / max"))
    assert "1.33x" in ratio and "2.00x" in ratio
    index = next(line for line in text.splitlines() if line.startswith("| key index"))
    assert "none" in index and "50 B a key" in index
