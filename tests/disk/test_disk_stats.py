"""A disk table's cache hit rate and its file's rows and bytes read and written per step, in
the lookup statistics and `embcore stats`, against counts computed here from the id stream
and the cache size by an LRU cache of our own."""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import torch

import embcore as ec
from embcore.cli.main import main
from embcore.cli.stats import load_directory
from embcore.storage import cached_row_bytes

VOCAB, DIM, CACHE_ROWS, STEPS = 40, 4, 3, 30


def expected(ids: list[int]) -> dict[str, int]:
    """One id per step, every looked-up row updated: an LRU cache of ``CACHE_ROWS`` rows;
    the table's one initializer block is written on the first miss, a row is read per miss
    and written back when evicted."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = misses = evicted = 0
    for i in ids:
        if i in cache:
            hits += 1
            cache.move_to_end(i)
            continue
        misses += 1
        if len(cache) == CACHE_ROWS:
            cache.popitem(last=False)
            evicted += 1
        cache[i] = None
    record = math.ceil((16 + 4 * 2 * DIM) / 512) * 512  # header, weight, Adagrad's slot
    written = VOCAB + evicted
    return {"steps": len(ids), "hits": hits, "misses": misses, "rows_read": misses,
            "bytes_read": misses * record, "rows_written": written,
            "bytes_written": written * record}  # fmt: skip


def test_cache_counters_in_the_statistics_and_embcore_stats(tmp_path, capsys):
    storage = ec.DiskStorage(tmp_path / "rows", CACHE_ROWS * cached_row_bytes(DIM, DIM))
    table = ec.TableConfig(VOCAB, DIM, name="t", storage=storage)
    engine = ec.EmbeddingEngine(
        {"f": ec.FeatureConfig(table=table)},
        optimizer=ec.Adagrad(learning_rate=0.1),
        profile_data_directory=str(tmp_path / "stats"),
        profile_sample_rate=0.5,
    )
    ids = np.random.default_rng(3).zipf(1.3, STEPS).clip(max=VOCAB) - 1
    for i in ids.tolist():
        engine({"f": torch.tensor([i])})["f"].sum().backward()
    want = expected(ids.tolist())
    assert 0 < want["hits"] < STEPS and want["rows_written"] > VOCAB  # the stream tests both
    engine.write_statistics()
    [(_, stats)] = load_directory(tmp_path / "stats")
    assert stats.cache == want
    assert stats.hit_rate == want["hits"] / STEPS
    assert stats.per_step("bytes_written") == want["bytes_written"] / STEPS
    info = engine.table_info("t")
    assert {k: info[k] for k in want if k != "steps"} == {k: want[k] for k in want if k != "steps"}
    assert main(["stats", str(tmp_path / "stats")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "disk cache" in x)
    assert f"hit rate {100 * want['hits'] / STEPS:.1f}%" in line
    assert f"over {STEPS} steps" in line
    assert f"read {want['rows_read'] / STEPS:,.1f} rows" in line
    assert f"wrote {want['rows_written'] / STEPS:,.1f} rows" in line
    # counting goes on from the file written: a second flush adds only the steps since
    for i in ids[:5].tolist():
        engine({"f": torch.tensor([i])})["f"].sum().backward()
    engine.write_statistics()
    [(_, merged)] = load_directory(tmp_path / "stats")
    assert merged.cache["steps"] == STEPS + 5
    assert merged.cache["hits"] + merged.cache["misses"] == STEPS + 5


def test_a_dynamic_disk_tables_counters_reach_the_statistics(tmp_path):
    """Keys admitted on first sight are born in the cache; the statistics carry the same
    counts as the table's own ``table_info`` and one step per training step."""
    storage = ec.DiskStorage(tmp_path / "rows", CACHE_ROWS * cached_row_bytes(DIM, DIM))
    table = ec.TableConfig(None, DIM, name="t", storage=storage)
    engine = ec.EmbeddingEngine(
        {"f": ec.FeatureConfig(table=table)},
        optimizer=ec.Adagrad(learning_rate=0.1),
        profile_data_directory=str(tmp_path / "stats"),
        profile_sample_rate=0.5,
    )
    keys = (np.random.default_rng(4).zipf(1.3, STEPS).clip(max=VOCAB) * 1_000_003) << 20
    for k in keys.tolist():
        engine({"f": torch.tensor([k])})["f"].sum().backward()
    engine.write_statistics()
    [(_, stats)] = load_directory(tmp_path / "stats")
    info = engine.table_info("t")
    assert stats.cache["steps"] == STEPS
    for name in ("hits", "misses", "rows_read", "rows_written"):
        assert stats.cache[name] == info[name], name
    assert stats.cache["hits"] > 0 and stats.cache["rows_written"] > 0  # the stream tests both
