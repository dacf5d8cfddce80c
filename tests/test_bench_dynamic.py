"""W3 in ``embcore bench``: raw 64-bit keys with W1's Zipf ranks, which systems run which
workload, the dict baseline's key -> row mapping, the W3/W1 ratio and the dynamic section
(tiny sizes, no timing assertions)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import dynamic_index
from sidebyside.report import dynamic_markdown, summarize, targets
from sidebyside.systems import SYSTEMS, embcore_engine, supports, torch_dict
from sidebyside.workloads import WORKLOADS, make_batches, mixed_keys

MASK = (1 << 64) - 1


def _splitmix(x: int) -> int:
    """SplitMix64's finalizer on a Python int, as a signed 64-bit value."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    x ^= x >> 31
    return x - (1 << 64) if x >= 1 << 63 else x


def test_w3_batches_are_w1_ranks_mixed_into_raw_keys() -> None:
    w1 = make_batches(WORKLOADS["W1-quick"], 2, seed=3)
    w3 = make_batches(WORKLOADS["W3-quick"], 2, seed=3)
    for fixed, raw in zip(w1, w3, strict=True):
        assert fixed.unique == raw.unique  # same ids per step, so the same work
        for t, (ids, keys) in enumerate(zip(fixed.values, raw.values, strict=True)):
            expected = [_splitmix(i + (t << 40)) for i in ids[:50].tolist()]
            assert keys[:50].tolist() == expected
            np.testing.assert_array_equal(raw.offsets[t], fixed.offsets[t])
    keys = np.concatenate(w3[0].values)
    assert (keys < 0).any() and (keys > 2**40).any()  # raw-looking: far outside any vocab


def test_mixed_keys_keep_distinct_ids_distinct() -> None:
    ids = np.arange(100_000, dtype=np.int64)
    assert np.unique(mixed_keys(ids, 0)).size == ids.size
    assert not np.intersect1d(mixed_keys(ids, 0), mixed_keys(ids, 1)).size


def test_fixed_systems_skip_raw_keys_and_dynamic_ones_skip_fixed_ids() -> None:
    w1, w3, evict = WORKLOADS["W1"], WORKLOADS["W3"], WORKLOADS["W3-evict"]
    names = {s.__name__.rsplit(".", 1)[-1]: s for s in SYSTEMS}
    runs = {
        name: (supports(s, w1), supports(s, w3), supports(s, evict)) for name, s in names.items()
    }
    assert runs["embcore_engine"] == (True, False, False)
    assert runs["fbgemm_tbe"] == (True, False, False)
    assert runs["embcore_dynamic"] == (False, True, True)
    assert runs["embcore_dynamic_capacity"] == (False, True, True)
    assert runs["torch_dict"] == (False, True, False)  # no eviction to compare with
    assert runs["torchrec_mc"] == (False, True, False)
    assert evict.steps_to_live is not None and evict.max_rows is not None
    assert supports(embcore_engine, WORKLOADS["W1-quick"])


def test_dict_baseline_gives_rows_in_first_seen_order() -> None:
    workload = WORKLOADS["W3-quick"]
    batches = make_batches(workload, 2)
    run = torch_dict.build(workload, "adagrad", batches)
    run.step(0)
    run.step(1)
    for t in (2, 11):
        keys = np.concatenate([b.values[t] for b in batches])
        _, first = np.unique(keys, return_index=True)
        in_order = keys[np.sort(first)]
        assert list(run.rows[t]) == in_order.tolist()
        assert list(run.rows[t].values()) == list(range(in_order.size))


def _record(workload: str, system: str, repeat: int, ms: float, rows_held=None) -> dict:
    return {
        "median_cpu_ms": ms / 2,
        "workload": workload,
        "system": system,
        "optimizer": "adagrad",
        "label": "Adagrad",
        "median_ms": ms,
        "bytes_per_step": 1e6,
        "state_bytes": 2**30,
        "peak_rss": 2**31,
        "rss_before": 1,
        "repeat": repeat,
        "rows_held": rows_held,
    }


def _results() -> dict:
    fixed, dynamic, peer = [10.0, 20.0, 30.0], [12.0, 28.0, 33.0], [50.0, 60.0, 90.0]
    runs = [_record("W1", "embcore", r, ms) for r, ms in enumerate(fixed)]
    runs += [
        _record("W3", "embcore, dynamic tables", r, ms, rows_held=1234)
        for r, ms in enumerate(dynamic)
    ]
    runs += [_record("W3", "plain PyTorch + dict", r, ms) for r, ms in enumerate(peer)]
    limits = [{"repeat": r, "gather": {"gb_s": 1.0, "rows": 1, "table_rows": 1}} for r in range(3)]
    for lim in limits:
        lim["copy"] = {"gb_s": 1.0, "megabytes": 1}
    return {
        "runs": runs,
        "limits": limits,
        "workloads": {"W1": {"batch": 4096}, "W3": {"batch": 4096}},
        "options": {"steps": 8, "warmup": 2},
        "skipped": {"TorchRec managed collisions": "torchrec does not import (ImportError: x)"},
    }


def test_w3_over_w1_ratio_is_taken_within_each_run() -> None:
    checks = {c["target"]: c for c in targets(summarize(_results()))}
    got = checks["W3: embcore dynamic-table step / W1 fixed-table step, Adagrad"]
    # per run: 1.2, 1.4, 1.1 -> median 1.2 (the ratio of medians would be 1.4)
    assert got["got"] == "1.20x" and got["met"]


def test_dynamic_section_names_rows_peers_and_what_could_not_run() -> None:
    results = _results()
    results["dynamic_index"] = {
        "keys": 1000,
        "batch": 100,
        "threads": 1,
        "repeat": 1,
        "inserts_per_s": 6e6,
        "inserts_per_cpu_s": 7e6,
        "lookups_per_s_zipf": 25e6,
        "lookups_per_cpu_s_zipf": 26e6,
        "lookups_per_s_uniform": 15e6,
        "lookups_per_cpu_s_uniform": 16e6,
        "bytes_per_key": 22.5,
        "capacity": 1200,
        "load": 0.83,
        "load_average": 1.5,
        "load_average_after": 1.7,
    }
    text = dynamic_markdown(results)
    assert "| W3 | Adagrad | 28.0 | 1,234 | 1.00 | 2.00 |" in text
    # dict peer per run: 50/12, 60/28, 90/33 -> median 2.73x
    # the CPU times are half the wall times here: the same ratios
    assert (
        "W3, plain PyTorch + dict (Adagrad): 60.0 ms/step; embcore is 2.73x faster "
        "(2.73x in CPU time)" in text
    )
    assert "TorchRec managed collisions could not run here: torchrec does not import" in text
    assert "| lookups, Zipf(1.05) keys | 25.0 | 26.0 | >= 20 M/s | yes |" in text
    assert "| lookups, uniform over the held keys | 15.0 | 16.0 | >= 20 M/s | no |" in text
    assert "| 22.5 bytes/key | | <= ~24 | yes |" in text


def test_no_dynamic_section_without_w3() -> None:
    results = _results()
    results["runs"] = [r for r in results["runs"] if r["workload"] == "W1"]
    results["skipped"] = {}
    assert dynamic_markdown(results) == ""


def test_index_measure_reports_every_figure() -> None:
    result = dynamic_index.measure(keys=20_000, batch=4096, lookups=8192, repeat=1, threads=1)
    for key in ("inserts_per_s", "lookups_per_s_zipf", "lookups_per_s_uniform"):
        assert result[key] > 0
    assert 8 < result["bytes_per_key"] < 64  # key + row + control byte, over the load
    assert result["load"] == pytest.approx(20_000 / result["capacity"])


def test_the_cpu_time_ratio_is_taken_within_each_run() -> None:
    results = _results()
    for r in results["runs"]:
        if r["workload"] == "W3" and r["system"] == "embcore, dynamic tables":
            r["median_cpu_ms"] = {0: 12.0, 1: 40.0, 2: 30.0}[r["repeat"]]
    # fixed CPU ms 5, 10, 15 -> per run 2.4, 4.0, 2.0 -> median 2.4 (medians: 30 / 10 = 3.0)
    assert "| W3 | Adagrad | 30.0 | 10.0 | 2.40x |" in dynamic_markdown(results)


def test_the_initial_capacity_row_is_labelled_and_kept_out_of_the_targets() -> None:
    results = _results()
    results["runs"] += [
        _record("W3", "embcore, dynamic tables, initial_capacity", r, ms, rows_held=1234)
        for r, ms in enumerate([11.0, 22.0, 36.0])
    ]
    text = dynamic_markdown(results)
    # CPU ms 5.5, 11, 18 over 5, 10, 15 -> per run 1.1, 1.1, 1.2 -> median 1.1
    assert "| W3 | Adagrad, initial_capacity | 11.0 | 10.0 | 1.10x |" in text
    assert "| W3 | Adagrad, initial_capacity | 22.0 | 1,234 |" in text
    assert "| W3 | Adagrad | 14.0 | 10.0 | 1.20x |" in text  # the row without, unchanged
    assert not [c for c in targets(summarize(results)) if "initial_capacity" in c["target"]]
    assert "* W3, embcore, dynamic tables, initial_capacity" not in text  # not a peer


def test_the_capacity_system_reserves_each_twin_vocabulary() -> None:
    from sidebyside.systems import embcore_dynamic_capacity

    workload = WORKLOADS["W3-quick"]
    run = embcore_dynamic_capacity.build(workload, "rowwise_adagrad", make_batches(workload, 1))
    tables = {t.name: t.config.initial_capacity for t in run.engine.tables}
    assert list(tables.values()) == list(workload.vocab)
    run.step(0)
    assert run.state_bytes == 4 * sum(workload.vocab) * (workload.dim + 1)


def test_mainjob_refuses_tables_the_plain_peer_cannot_have() -> None:
    from sidebyside import mainjob

    options = mainjob.MainJobOptions(
        repeats=1,
        warmup=0,
        steps=1,
        batches=1,
        overrides=["data.batch_size=8", "data.vocab_cap=100", 'model.tables="dynamic"'],
    )
    with pytest.raises(ValueError, match="plain PyTorch peer has fixed tables of table rows"):
        mainjob.run(options, log=lambda line: None)
