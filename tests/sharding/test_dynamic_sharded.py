"""Dynamic tables placed by key hash on 2 gloo ranks equal one process on the concatenated
batches, bit for bit: activations, evaluation lookups, the keys holding a row after every
step (admission, steps-to-live and max-rows eviction), the rows, and the whole table state
(counts, last-seen steps, pending counts, slots). State dicts and checkpoints move between
2 ranks, 3 ranks and one process (keys re-hashed onto the ranks)."""

from __future__ import annotations

import itertools

import dynamic_sharding_harness as d
import numpy as np
import pytest
import sharding_harness as h
import torch

import embcore as ec
from embcore.sharding.keyhash import key_shard

pytestmark = pytest.mark.multiprocess
WORLD = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("dynamic")
    ref = d.engine(None)
    steps = d.train(ref, list(range(WORLD)), range(d.STEPS))
    state = {k: torch.as_tensor(v).clone() for k, v in ref.state_dict().items()}
    torch.save(state, tmp / "reference.pt")
    ec.checkpoint.save(ref, str(tmp / "reference-ckpt"))
    resumed = {}  # as the ranks resume: a new engine loads the state, trains on
    for world in (WORLD, 3):
        fresh = d.engine(None)
        fresh.load_state_dict(torch.load(tmp / "reference.pt", weights_only=False))
        resumed[world] = d.train(fresh, list(range(world)), range(d.STEPS, d.STEPS + 2))
        if world == WORLD:
            after = {k: torch.as_tensor(v).clone() for k, v in fresh.state_dict().items()}
    interleaved = d.interleaved(d.engine(None), list(range(WORLD)))
    pipelined = d.train(d.engine(None, pipelined=True), list(range(WORLD)), range(d.STEPS))
    reused = d.reused(d.engine(None, pipelined=True), list(range(WORLD)))
    ranks = h.launch(
        "dynamic_sharding_harness:worker_dynamic",
        WORLD,
        str(tmp / "reference.pt"),
        str(tmp / "reference-ckpt"),
        str(tmp / "by-2-ranks"),
    )
    # 2 ranks -> 3 ranks: the state the 2 ranks gathered, loaded by 3 (keys re-hashed)
    torch.save(ranks[0]["state_dict"], tmp / "by-2-ranks.pt")
    three = h.launch(
        "dynamic_sharding_harness:worker_resume",
        3,
        str(tmp / "by-2-ranks.pt"),
        str(tmp / "by-2-ranks"),
    )
    return {
        "three": three,
        "steps": steps,
        "state": state,
        "resumed": resumed,
        "interleaved": interleaved,
        "pipelined": pipelined,
        "reused": reused,
        "ranks": ranks,
        "by_2_ranks": str(tmp / "by-2-ranks"),
        "after": after,
    }


def own_rows(value: torch.Tensor, step: int, rank: int) -> torch.Tensor:
    """The rows of ``value`` (over every rank's samples) that are ``rank``'s."""
    start = sum(4 + r for r in range(rank))
    return value[start : start + 4 + rank]


def assert_same_steps(got: list[dict], want: list[dict], rank: int, first: int) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        step = first + i
        for name in ("acts", "eval"):
            for feature, value in w[name].items():
                mine = own_rows(value, step, rank)
                assert torch.equal(g[name][feature], mine), (rank, step, name, feature)
        assert torch.equal(g["keys"], w["keys"]), (rank, step, g["keys"], w["keys"])
        assert g["info"] == w["info"], (rank, step)
        assert torch.equal(g["probe"], w["probe"]), (rank, step)
        assert g["state"].keys() == w["state"].keys(), (rank, step)
        for k, v in w["state"].items():
            assert torch.equal(g["state"][k], v), (rank, step, k)


def test_training_with_admission_and_eviction_equals_one_process(runs: dict):
    for rank in range(WORLD):
        assert_same_steps(runs["ranks"][rank]["steps"], runs["steps"], rank, 0)


def test_pipelined_training_without_eviction_equals_one_process(runs: dict):
    # Each update lands after the next training lookup (one step stale), on both sides.
    for rank in range(WORLD):
        assert_same_steps(runs["ranks"][rank]["pipelined"], runs["pipelined"], rank, 0)


def test_pipelined_updates_of_a_reused_prepared_batch_use_their_own_lookups_rows(runs: dict):
    want = runs["reused"]
    assert want["info"]["dropped_gradients"] > 0  # keys pending in one lookup, admitted next
    for rank in range(WORLD):
        got = runs["ranks"][rank]["reused"]
        for g, w in zip(got["acts"], want["acts"], strict=True):
            for name, value in w.items():
                assert torch.equal(g[name], own_rows(value, 0, rank)), (rank, name)
        assert got["info"] == want["info"] and torch.equal(got["keys"], want["keys"])
        for k, v in want["state"].items():
            assert torch.equal(got["state"][k], v), (rank, k)


def test_updates_use_the_rows_of_their_training_lookup(runs: dict):
    # Two lookups before their updates: the first's gradients go to the rows its lookup read
    # (none for keys admitted by the second lookup), the second's to the rows that survived
    # the first update's eviction. ("eval" holds the second lookup's activations here.)
    for rank in range(WORLD):
        got = runs["ranks"][rank]["interleaved"]
        for g, w, step in zip(got, runs["interleaved"], (0, 2), strict=True):
            for name, value in w["acts"].items():
                assert torch.equal(g["acts"][name], own_rows(value, step, rank)), (rank, name)
            for name, value in w["eval"].items():
                assert torch.equal(g["eval"][name], own_rows(value, step, rank)), (rank, name)
            assert torch.equal(g["keys"], w["keys"]) and torch.equal(g["probe"], w["probe"])
            assert g["info"] == w["info"], (rank, step)
            for k, v in w["state"].items():
                assert torch.equal(g["state"][k], v), (rank, step, k)


def test_the_scenario_exercises_admission_and_both_evictions(runs: dict):
    # The comparison above is only as sharp as the scenario: keys were pending, expired and
    # evicted beyond max_rows, and the held keys split unevenly over the shards at the
    # limit (a per-shard share of max_rows, 4 each, would have evicted other keys).
    held = [s["keys"] for s in runs["steps"]]
    assert runs["steps"][-1]["info"]["dropped_gradients"] > 0
    assert all(k.numel() <= d.MAX_ROWS for k in held)
    assert any(k.numel() == d.MAX_ROWS for k in held)
    assert any(s["state"]["user.pending/keys"].numel() for s in runs["steps"])
    gone = [set(a.tolist()) - set(b.tolist()) for a, b in itertools.pairwise(held)]
    assert any(gone)
    splits = [np.bincount(key_shard(k, WORLD).numpy(), minlength=WORLD) for k in held]
    assert any(k.numel() == d.MAX_ROWS and max(s) > d.MAX_ROWS // WORLD for k, s in
               zip(held, splits, strict=True))  # fmt: skip


def test_state_dicts_move_between_two_ranks_and_one_process(runs: dict):
    # 2 ranks -> 1 process: the sharded state dict is the single-process one.
    for rank in range(WORLD):
        got = runs["ranks"][rank]["state_dict"]
        assert got.keys() == runs["state"].keys()
        for k, v in runs["state"].items():
            assert torch.equal(got[k], torch.as_tensor(v)), (rank, k)
    # 1 process -> 2 ranks: loading re-hashes the keys onto the ranks; training goes on as in
    # the process that wrote the state.
    for rank in range(WORLD):
        assert_same_steps(runs["ranks"][rank]["resumed"], runs["resumed"][WORLD], rank, d.STEPS)
    # 2 ranks -> 3 ranks: the same, each key now on the rank its hash over 3 shards picks.
    for rank in range(3):
        assert_same_steps(runs["three"][rank]["state_dict"], runs["resumed"][3], rank, d.STEPS)


def test_checkpoints_move_between_one_process_two_ranks_and_three_ranks(runs: dict):
    # 2 ranks -> 1 process: the checkpoint the ranks wrote holds the single-process state.
    one = d.engine(None)
    ec.checkpoint.load(one, runs["by_2_ranks"])
    got = one.state_dict()
    assert got.keys() == runs["state"].keys()
    for k, v in runs["state"].items():
        assert torch.equal(torch.as_tensor(got[k]), v), k
    # The delta the 2 ranks saved 2 steps later, against that checkpoint, loads as the
    # single-process state then.
    one = d.engine(None)
    ec.checkpoint.load(one, runs["by_2_ranks"] + "-delta")
    got = one.state_dict()
    for k, v in runs["after"].items():
        assert torch.equal(torch.as_tensor(got[k]), v), k
    # 1 process -> 2 ranks and 2 ranks -> 3 ranks: the keys are hashed onto the ranks, and
    # training goes on as in one process that loaded the same state.
    for rank in range(WORLD):
        got_steps = runs["ranks"][rank]["resumed_from_checkpoint"]
        assert_same_steps(got_steps, runs["resumed"][WORLD], rank, d.STEPS)
    for rank in range(3):
        assert_same_steps(runs["three"][rank]["checkpoint"], runs["resumed"][3], rank, d.STEPS)
