"""Ranks out of step, on 2 real gloo ranks: rank 1's batch is refused in the middle of a
sharded lookup (its dynamic table cannot grow: ``IndexMemoryError``, raised on the owner after
the step's first exchange); rank 1 catches the error and carries on with its next batch, while
rank 0 is still in the refused step. Without a check, rank 1's next step would pair its
collectives with rank 0's current one: no error, no timeout, wrong results. Every exchange
carries its step's kind, number and phase, so both ranks fail at once, naming the mismatch."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import warnings
from datetime import timedelta
from typing import Any

import dynamic_sharding_harness as dh
import pytest
import torch
import torch.distributed as dist

import embcore as ec
from embcore.rows import keyed as _key_rows
from embcore.sharding import ShardingPlan, TableShard

pytestmark = pytest.mark.multiprocess

TIMEOUT_S = 20  # the process group's timeout: an unnoticed mismatch would end in it
BOUND_S = 120


def _data_parallel(world: int) -> ec.EmbeddingEngine:
    """A fixed table replicated on every rank: lookups need no exchange, the update's first
    collective is the agreement on the gradients."""
    table = ec.TableConfig(vocabulary_size=50, dim=3, name="t")
    plan = ShardingPlan(world_size=world, tables={"t": TableShard.data_parallel(world)})
    features = {"u1": ec.FeatureConfig(table), "u2": ec.FeatureConfig(table)}
    return ec.EmbeddingEngine(features, ec.Adagrad(learning_rate=0.3), plan=plan)


def _ranks(rank: int, world: int, out: str, refuse_at: int, mode: str) -> None:
    warnings.simplefilter("error")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{out}/store",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=TIMEOUT_S),
    )
    steps: list[Any] = []
    try:
        engine = dh.engine(world) if mode == "key_hash" else _data_parallel(world)
        train = _key_rows.KeyedRows.train_keys

        def refusing(self: Any, *args: Any, **kwargs: Any) -> Any:
            if rank == 1 and len(steps) == refuse_at:  # the owner cannot grow its rows
                raise _key_rows.IndexMemoryError("table 'user': could not grow (injected)")
            return train(self, *args, **kwargs)

        _key_rows.KeyedRows.train_keys = refusing  # a forked rank: nothing to restore
        for step in range(dh.STEPS):
            try:
                features = dh.local_batch(step, rank)
                if mode == "data_parallel":  # its table's two features
                    u2 = features["u2"]  # raw keys folded into the fixed table
                    features = {
                        "u1": features["u1"] % 50,
                        "u2": ec.RaggedIds(u2.values % 50, u2.row_splits),
                    }
                acts = engine(features)
                if mode == "data_parallel" and rank == 1 and len(steps) == refuse_at:
                    raise _key_rows.IndexMemoryError("the loss refused the batch (injected)")
                grads = dh.gradient(step, [rank], acts)
                sum((acts[k] * grads[k]).sum() for k in acts).backward()
                steps.append(step)
            except _key_rows.IndexMemoryError:  # the careless loop: skip the batch, go on
                steps.append(f"refused {step}")
        result: dict[str, Any] = {"steps": steps}
    except Exception as error:
        result = {"steps": steps, "error": f"{type(error).__name__}: {error}"}
    torch.save(result, os.path.join(out, f"{rank}.pt"))
    os._exit(0)


def _launch(tmp: str, refuse_at: int, mode: str) -> list[dict[str, Any]]:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "embcore", "sharding_harness"])
    procs = [ctx.Process(target=_ranks, args=(r, 2, tmp, refuse_at, mode)) for r in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + BOUND_S
    try:
        for p in procs:
            p.join(max(deadline - time.monotonic(), 0))
    finally:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join()
    return [torch.load(os.path.join(tmp, f"{r}.pt"), weights_only=False) for r in range(2)]


def test_a_rank_that_skips_a_refused_batch_stops_every_rank(tmp_path) -> None:
    got = _launch(str(tmp_path), refuse_at=2, mode="key_hash")
    assert got[1]["steps"][:3] == [0, 1, "refused 2"], got
    assert got[0]["steps"] == [0, 1], got  # rank 0 never finished step 2
    for rank in range(2):
        error = got[rank].get("error", "")
        # this error, not a CommError after the process group's timeout
        assert error.startswith("OutOfStepError: embcore.sharding: the ranks are out of step"), (
            rank,
            got,
        )
        assert "lookup #3" in error and "lookup #4" in error, error


def test_a_rank_that_skips_an_update_stops_every_rank(tmp_path) -> None:
    """Data-parallel tables: rank 1 drops step 2 after its lookup (its loss raised) and goes
    on; its next update's agreement would pair with rank 0's update of step 2."""
    got = _launch(str(tmp_path), refuse_at=2, mode="data_parallel")
    assert got[1]["steps"][:3] == [0, 1, "refused 2"] and got[0]["steps"] == [0, 1], got
    for rank in range(2):
        error = got[rank].get("error", "")
        assert error.startswith("OutOfStepError: embcore.sharding: the ranks are out of step"), (
            rank,
            got,
        )
        assert "rank 0 after lookup #3 and update #2; rank 1 after lookup #4 and update #2" in error
