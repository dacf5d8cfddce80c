"""Dynamic tables placed by key hash, where sharding meets checkpoints: N -> M delta
checkpoints across ranks, and plans whose ranks are listed out of order (shard ``p`` on rank
``world - 1 - p``), which must train, load a state dict and load a checkpoint exactly as one
process does (2 gloo ranks)."""

from __future__ import annotations

import dynamic_ckpt_ranks
import dynamic_sharding_harness as d
import pytest
import sharding_harness as h
import torch
from test_dynamic_sharded import assert_same_steps

import embcore as ec

pytestmark = pytest.mark.multiprocess
WORLD = 2


def test_delta_checkpoints_move_between_2_ranks_and_1_process(tmp_path):
    dynamic_ckpt_ranks.check_n_to_m(tmp_path)


def test_a_plan_with_its_ranks_out_of_order_trains_and_loads_as_one_process(tmp_path):
    ref = d.engine(None)
    steps = d.train(ref, list(range(WORLD)), range(d.STEPS))
    state = {k: torch.as_tensor(v).clone() for k, v in ref.state_dict().items()}
    torch.save(state, tmp_path / "state.pt")
    ec.checkpoint.save(ref, tmp_path / "ckpt")
    observed = d.observe(ref)
    tables = {"weight": ref.embedding_tables["user"].clone()}  # ascending key order
    tables |= {k: v.clone() for k, v in ref.slot_variables["user"].items()}
    fresh = d.engine(None)  # counters such as dropped gradients start anew on a load
    fresh.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
    resumed = d.train(fresh, list(range(WORLD)), range(d.STEPS, d.STEPS + 2))
    ranks = h.launch(
        "dynamic_ckpt_ranks:worker_rank_order",
        WORLD,
        str(tmp_path / "state.pt"),
        str(tmp_path / "ckpt"),
    )
    assert observed["keys"].numel() > 0 and observed["probe"].abs().sum() > 0
    for rank in range(WORLD):
        got = ranks[rank]
        assert_same_steps(got["steps"], steps, rank, 0)
        # every key is found where the plan put it: the rows read back are the saved ones
        assert torch.equal(got["loaded"]["keys"], observed["keys"]), rank
        assert torch.equal(got["loaded"]["probe"], observed["probe"]), rank
        for k, v in observed["state"].items():
            assert torch.equal(got["loaded"]["state"][k], v), (rank, k)
        assert got["tables"].keys() == tables.keys()
        for k, v in tables.items():  # gathered from both ranks in ascending key order
            assert torch.equal(got["tables"][k], v), (rank, k)
        assert_same_steps(got["resumed"], resumed, rank, d.STEPS)
        assert_same_steps(got["resumed_from_checkpoint"], resumed, rank, d.STEPS)
