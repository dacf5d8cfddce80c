"""N -> M checkpoints of dynamic tables over gloo ranks, for when sharded engines host dynamic
tables (the key-hash scheme of ``dynamic_sharding_harness.py``, beside this file). To run it,
a test calls :func:`check_n_to_m`::

    def test_checkpoints_of_dynamic_tables_move_between_2_ranks_and_1_process(tmp_path):
        dynamic_ckpt_ranks.check_n_to_m(tmp_path)

Two ranks save a full checkpoint after step 3 and a delta on it after step 6; one process
loads the delta (2 -> 1) and two ranks load it (2 -> 2) and hold exactly what one process
trained on the concatenated batches holds; two ranks load that process's checkpoint (1 -> 2)
and train on bit-identically to it.
"""

from __future__ import annotations

from typing import Any

import torch

import embcore as ec
from embcore.sharding import ShardingPlan, TableShard


def worker_ckpt(rank: int, world: int, tmp: str) -> dict[str, Any]:
    import dynamic_sharding_harness as d

    e = d.engine(world)
    d.train(e, [rank], range(3))
    ec.checkpoint.save(e, f"{tmp}/c3")
    d.train(e, [rank], range(3, 6))
    ec.checkpoint.save(e, f"{tmp}/c6", base=f"{tmp}/c3")
    resumed = d.engine(world)
    ec.checkpoint.load(resumed, f"{tmp}/ref6")
    out: dict[str, Any] = {"resumed": d.train(resumed, [rank], range(6, 8))}
    loaded = d.engine(world)
    ec.checkpoint.load(loaded, f"{tmp}/c6")
    out["state"] = {k: torch.as_tensor(v).clone() for k, v in loaded.state_dict().items()}
    return out


def check_n_to_m(tmp_path: Any) -> None:
    import dynamic_sharding_harness as d
    import sharding_harness as h

    ref = d.engine(None)
    d.train(ref, [0, 1], range(6))
    ec.checkpoint.save(ref, tmp_path / "ref6")
    want = {k: torch.as_tensor(v).clone() for k, v in ref.state_dict().items()}
    resumed = d.train(ref, [0, 1], range(6, 8))
    ranks = h.launch("dynamic_ckpt_ranks:worker_ckpt", 2, str(tmp_path))
    one = d.engine(None)
    ec.checkpoint.load(one, tmp_path / "c6")
    got = {k: torch.as_tensor(v) for k, v in one.state_dict().items()}
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k
    for rank in range(2):
        for k in want:
            assert torch.equal(ranks[rank]["state"][k], want[k]), (rank, k)
        for g, w in zip(ranks[rank]["resumed"], resumed, strict=True):
            assert torch.equal(g["keys"], w["keys"])
            for k in w["state"]:
                assert torch.equal(g["state"][k], w["state"][k]), (rank, k)
    rows = ec.checkpoint.read_manifest(tmp_path / "c6")["dynamic"]["user"]["groups"]["rows"]
    assert rows["stored"] > 0 and rows["deleted"] > 0


def reversed_plan(world: int) -> ShardingPlan:
    """The scenario's tables on every rank, listed from the last rank to the first: shard
    ``p`` of a table lives on rank ``world - 1 - p``."""
    ranks = tuple(reversed(range(world)))
    return ShardingPlan(
        world_size=world,
        tables={
            "user": TableShard(scheme="key_hash", ranks=ranks),
            "fixed": TableShard.row_wise(list(ranks)),
        },
    )


def reversed_engine(world: int) -> ec.EmbeddingEngine:
    import dynamic_sharding_harness as d

    return ec.EmbeddingEngine(
        d.feature_config(), ec.Adagrad(learning_rate=0.3), backend="reference",
        plan=reversed_plan(world),
    )  # fmt: skip


def worker_rank_order(rank: int, world: int, state: str, ckpt: str) -> dict[str, Any]:
    """A plan whose ranks are listed out of order: train from the start; load a state dict
    and a checkpoint written by one process, then train on."""
    import dynamic_sharding_harness as d

    trained = reversed_engine(world)
    out: dict[str, Any] = {"steps": d.train(trained, [rank], range(d.STEPS))}
    loaded = reversed_engine(world)
    loaded.load_state_dict(torch.load(state, weights_only=False))
    out["loaded"] = d.observe(loaded)
    out["tables"] = {"weight": loaded.embedding_tables["user"].clone()}
    out["tables"] |= {k: v.clone() for k, v in loaded.slot_variables["user"].items()}
    out["resumed"] = d.train(loaded, [rank], range(d.STEPS, d.STEPS + 2))
    from_ckpt = reversed_engine(world)
    ec.checkpoint.load(from_ckpt, ckpt)
    out["resumed_from_checkpoint"] = d.train(from_ckpt, [rank], range(d.STEPS, d.STEPS + 2))
    return out
