"""Dynamic tables in DiskStorage placed by key hash on 2 gloo ranks: each rank keeps its key
shard's rows in its own directory and trains bit for bit as the in-memory sharded engine and
as one process on the concatenated batches (caches of 1 row and of the whole shard, with
admission, steps-to-live and max-rows eviction, two lookups before their updates, pipelined),
and checkpoints move from 2 ranks to 1 process and from 1 process to 2 ranks.

The scenario is ``dynamic_sharding_harness``'s (its batches, gradients and observations),
with the dynamic table ``user`` in DiskStorage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dynamic_sharding_harness as d
import pytest
import torch

import embcore as ec
from embcore.cli.stats import load_directory
from embcore.storage import cached_row_bytes

pytestmark = pytest.mark.multiprocess
WORLD = 2
DIM = 4
#: optimizer -> (itself, its slot floats per row): element-wise and row-wise slots
OPTIMIZERS = {
    "adagrad": (lambda: ec.Adagrad(learning_rate=0.3), DIM),
    "rowwise_adagrad": (lambda: ec.RowwiseAdagrad(learning_rate=0.3), 1),
}
#: a cache holding every row a shard may hold (40 keys in the pool)
WHOLE = 64


def engine(
    world: int | None,
    opt: str,
    directory: str | None = None,
    cache_rows: int = 1,
    pipelined: bool = False,
    planned: bool = False,
    initializer: bool = False,
    **options: Any,
) -> ec.EmbeddingEngine:
    """The harness's scenario with ``opt``: dynamic table ``user`` in memory
    (``directory=None``) or in DiskStorage caching ``cache_rows`` rows; sharded over
    ``world`` ranks or one process (``None``); ``pipelined``: ``pipeline=True``, no eviction;
    ``planned``: the planner's plan, DiskStorage the engine's default (both tables on disk);
    ``initializer``: a user initializer (called with every shard's new keys at once)."""
    storage = default = None
    if directory is not None:
        storage = ec.DiskStorage(directory, cache_rows * cached_row_bytes(DIM, OPTIMIZERS[opt][1]))
    if planned:
        storage, default = None, storage
    eviction = None if pipelined else ec.Eviction(steps_to_live=2, max_rows=d.MAX_ROWS)
    user = ec.TableConfig(
        vocabulary_size=None, dim=DIM, name="user", combiner="mean",
        admission=ec.CountAdmission(min_count=2), eviction=eviction, storage=storage,
        initializer=counting if initializer else None,
    )  # fmt: skip
    fixed = ec.TableConfig(vocabulary_size=5, dim=3, name="fixed", combiner="sum")
    features = {
        "u1": ec.FeatureConfig(table=user),
        "u2": ec.FeatureConfig(table=user),
        "f": ec.FeatureConfig(table=fixed),
    }
    plan = None if world is None or planned else d.plan(world)
    return ec.EmbeddingEngine(
        features, OPTIMIZERS[opt][0](), backend="reference", pipeline=pipelined, plan=plan,
        storage=default, **options,
    )  # fmt: skip


def counting(shape: tuple[int, int]) -> torch.Tensor:
    """A user initializer whose rows depend on their place among the lookup's new keys."""
    return torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape) / 16


def files(tmp: str, under: str) -> list[str]:
    return sorted(str(p.relative_to(tmp)) for p in Path(tmp).glob(f"{under}/*.rows"))


def worker(rank: int, world: int, tmp: str, opt: str) -> dict[str, Any]:
    """Train the scenario in memory and on disk (1-row and whole-shard caches), save a
    checkpoint on the ranks, load the one-process checkpoint and train on; two lookups before
    their updates and pipelined training, on a 1-row cache."""
    out: dict[str, Any] = {"memory": d.train(engine(world, opt), [rank], range(d.STEPS))}
    for rows in (1, WHOLE):
        stats = {"profile_data_directory": f"{tmp}/stats"} if rows == 1 else {}
        e = engine(world, opt, f"{tmp}/disk{rows}", rows, **stats)
        out[f"disk{rows}"] = d.train(e, [rank], range(d.STEPS))
        out[f"files{rows}"] = files(tmp, f"disk{rows}/*")
        if rows == 1:
            ec.checkpoint.save(e, f"{tmp}/two")
            out["info"] = e.table_info("user")
            e.write_statistics()
            d.train(e, [rank], range(d.STEPS, d.STEPS + 2))
            ec.checkpoint.save(e, f"{tmp}/two-delta", base=f"{tmp}/two")  # keys changed since
        e.close()
    e = engine(world, opt, f"{tmp}/initialized", 1, initializer=True)
    out["initialized"] = d.train(e, [rank], range(d.STEPS))
    e.close()
    resumed = engine(world, opt, f"{tmp}/rank{{rank}}-resumed", 1)
    ec.checkpoint.load(resumed, f"{tmp}/one")
    out["resumed"] = d.train(resumed, [rank], range(d.STEPS, d.STEPS + 2))
    out["resumed_files"] = files(tmp, "rank*-resumed")
    resumed.close()
    e = engine(world, opt, f"{tmp}/interleaved", 1)
    out["interleaved"] = d.interleaved(e, [rank])
    e.close()
    e = engine(world, opt, f"{tmp}/pipelined", 1, pipelined=True)
    out["pipelined"] = d.train(e, [rank], range(d.STEPS))
    e.close()
    e = engine(world, opt, f"{tmp}/reused", 1, pipelined=True)
    out["reused"] = d.reused(e, [rank])
    e.close()
    e = engine(world, opt, f"{tmp}/auto", 2, planned=True)
    out["auto"] = d.train(e, [rank], range(d.STEPS))
    out["auto_plan"] = {n: s.describe() for n, s in e.plan.tables.items()}
    out["auto_files"] = files(tmp, "auto/*")
    e.close()
    return out


def own_rows(value: torch.Tensor, rank: int | None) -> torch.Tensor:
    """The rows of ``value`` (over every rank's samples) that are ``rank``'s (``None``: one
    process's, all)."""
    if rank is None:
        return value
    start = sum(4 + r for r in range(rank))
    return value[start : start + 4 + rank]


def assert_same_steps(got: list[dict], want: list[dict], rank: int | None, what: str) -> None:
    """The ranks' observations of each step equal one process's (its own rows of the
    activations; of ``table_info``, the in-memory table's counters)."""
    assert len(got) == len(want), what
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        where = (what, rank, step)
        for name in ("acts", "eval"):
            for feature, value in w[name].items():
                assert torch.equal(g[name][feature], own_rows(value, rank)), (*where, feature)
        assert torch.equal(g["keys"], w["keys"]), where
        assert {k: g["info"][k] for k in w["info"]} == w["info"], where
        assert torch.equal(g["probe"], w["probe"]), where
        assert g["state"].keys() == w["state"].keys(), where
        for k, v in w["state"].items():
            assert torch.equal(g["state"][k], v), (*where, k)


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_disk_key_shards_train_like_memory_and_move_between_2_ranks_and_1(tmp_path, opt):
    import sharding_harness as h

    ranks = list(range(WORLD))
    one = engine(None, opt)  # one process on the concatenated batches, in memory
    want = d.train(one, ranks, range(d.STEPS))
    ec.checkpoint.save(one, tmp_path / "one")
    fresh = engine(None, opt)  # what an engine that loads it does next
    ec.checkpoint.load(fresh, tmp_path / "one")
    then = d.train(fresh, ranks, range(d.STEPS, d.STEPS + 2))
    interleaved = d.interleaved(engine(None, opt), ranks)
    pipelined = d.train(engine(None, opt, pipelined=True), ranks, range(d.STEPS))
    reused = d.reused(engine(None, opt, pipelined=True), ranks)
    initialized = d.train(engine(None, opt, initializer=True), ranks, range(d.STEPS))
    # the scenario admits, expires and evicts beyond max_rows (rows are freed and reused)
    assert want[-1]["info"]["dropped_gradients"] > 0
    assert any(s["keys"].numel() == d.MAX_ROWS for s in want)
    assert any(s["state"]["user.pending/keys"].numel() for s in want)

    got = h.launch("test_disk_dynamic_sharded:worker", WORLD, str(tmp_path), opt)
    for rank, r in enumerate(got):
        for name in ("memory", "disk1", f"disk{WHOLE}", "auto"):
            assert_same_steps(r[name], want, rank, name)
        assert_same_steps(r["resumed"], then, rank, "resumed")  # 1 process -> 2 ranks
        assert_same_steps(r["pipelined"], pipelined, rank, "pipelined")
        assert_same_steps(r["initialized"], initialized, rank, "initialized")
        # two lookups before their updates ("eval": the second lookup's activations)
        assert_same_steps(r["interleaved"], interleaved, rank, "interleaved")
        # three lookups of one prepared batch, each before the previous step's update
        for g, w in zip(r["reused"]["acts"], reused["acts"], strict=True):  # one per lookup
            for name, value in w.items():
                assert torch.equal(g[name], own_rows(value, rank)), (rank, name)
        rest = [{**x, "acts": {}, "eval": {}} for x in (r["reused"], reused)]
        assert_same_steps(rest[:1], rest[1:], rank, "reused")  # keys, info, rows, state
    assert reused["info"]["dropped_gradients"] > 0  # pending in one lookup, admitted next
    assert got[0]["auto_plan"]["user"] == "key_hash on 0,1"
    auto = got[0]["auto_files"]  # the fixed table too, on the rank(s) the planner chose
    assert {"auto/rank0/user.rows", "auto/rank1/user.rows"} <= set(auto)
    assert all(f.split("/")[1] in ("rank0", "rank1") for f in auto), auto
    info = got[0]["info"]  # both shards' counters, summed
    assert info["misses"] > 0 and info["rows_written"] > 0 and info["cache_capacity"] == 2
    # the statistics: both ranks' counters, over the engine's steps (not those of each rank)
    found = {s.table: s for _, s in load_directory(tmp_path / "stats")}
    counted = {k: info[k] for k in ("hits", "misses", "rows_read", "rows_written")}
    assert {k: found["user"].cache[k] for k in counted} == counted
    assert found["user"].cache["steps"] == d.STEPS
    # each rank its own directory: DiskStorage.directory / rank<r>, or {rank} in the path
    assert got[0]["files1"] == ["disk1/rank0/user.rows", "disk1/rank1/user.rows"]
    assert got[0]["resumed_files"] == ["rank0-resumed/user.rows", "rank1-resumed/user.rows"]
    # 2 ranks -> 1 process on disk: the state of one process, which then trains on as it
    back = engine(None, opt, str(tmp_path / "back"), 1)
    ec.checkpoint.load(back, tmp_path / "two")
    state = back.state_dict()
    for k, v in want[-1]["state"].items():
        assert torch.equal(torch.as_tensor(state[k]), v), k
    assert_same_steps(d.train(back, ranks, range(d.STEPS, d.STEPS + 2)), then, None, "back")
    delta = engine(None, opt, str(tmp_path / "delta"), 1)  # the 2 ranks' delta, 2 steps on
    ec.checkpoint.load(delta, tmp_path / "two-delta")
    assert ec.checkpoint.read_manifest(tmp_path / "two-delta")["base"]
    state = delta.state_dict()
    for k, v in then[-1]["state"].items():
        assert torch.equal(torch.as_tensor(state[k]), v), k
