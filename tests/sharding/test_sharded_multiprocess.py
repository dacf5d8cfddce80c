"""Sharded training on 2 and 3 gloo ranks equals one process on the concatenated batch.

Each world size is launched once for all its cases (every scheme with every optimizer, plus
mixed plans, the planner's own plan and pipelining); the test process then trains the
single-process engine on the concatenation of all ranks' batches and compares activations,
tables and slots. Table-wise, row-wise and column-wise are exact (the same float operations
in the same order); data-parallel sums per rank before the all-reduce, so it is compared to
rounding (rtol 1e-5), with rows the step did not touch bit-identical.
"""

from __future__ import annotations

import pytest
import sharding_harness as h
import torch

pytestmark = pytest.mark.multiprocess

WORLDS = (2, 3)
CASES = [case for world in WORLDS for case in h.all_cases(world)]


@pytest.fixture(scope="module")
def runs() -> dict[int, list[dict]]:
    """Every case of each world size, run on that many ranks: ``{world: [rank results]}``."""
    return {world: h.launch("worker_equivalence", world, h.all_cases(world)) for world in WORLDS}


def exact(case: h.Case) -> bool:
    """Bit-exact unless a table is data-parallel (the planner's plan may have some)."""
    plan = case.plan()
    return plan is not None and all(s.scheme != "data_parallel" for s in plan.tables.values())


def assert_matches(
    got: torch.Tensor, want: torch.Tensor, initial: torch.Tensor | None, exact: bool, what: str
) -> None:
    if exact:
        assert torch.equal(got, want), f"{what}: max diff {(got - want).abs().max():.3g}"
        return
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: {m}")
    if initial is not None:  # rows the single-process step left alone are untouched, exactly
        same = (want == initial).all(dim=-1) if want.dim() > 1 else want == initial
        assert torch.equal(got[same], want[same]), f"{what}: an untouched row moved"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_sharded_training_equals_single_process(case: h.Case, runs: dict[int, list[dict]]):
    ref = h.reference(case)
    ranks = list(range(case.world))
    for rank, results in enumerate(runs[case.world]):
        got = results[case.id]
        for step in range(h.STEPS):
            want = h._slice(ref["acts"][step], case, step, ranks, rank)
            for name, value in want.items():
                assert_matches(
                    got["acts"][step][name],
                    value,
                    None,
                    exact(case),
                    f"rank {rank} step {step} activation {name}",
                )
        assert got["step"] == ref["step"] == h.STEPS
        for table, value in ref["tables"].items():
            assert_matches(
                got["tables"][table],
                value,
                ref["initial"][table],
                exact(case),
                f"rank {rank} table {table}",
            )
            for slot, s in ref["slots"][table].items():
                assert_matches(
                    got["slots"][table][slot],
                    s,
                    None,
                    exact(case),
                    f"rank {rank} slot {table}.{slot}",
                )
        # every rank gathers the same full tables
        first = runs[case.world][0][case.id]
        for table, value in got["tables"].items():
            assert torch.equal(value, first["tables"][table])


def test_the_planner_plan_is_used_when_none_is_given(runs: dict[int, list[dict]]):
    from embcore.sharding import ShardingPlan, plan

    for world in WORLDS:
        got = ShardingPlan.from_json(runs[world][0][h.Case("auto", "adagrad", world).id]["plan"])
        assert got == plan(h.feature_config(), world, optimizer=h.OPTIMIZERS["adagrad"]())


def test_checkpoint_written_by_2_ranks_loads_into_3_ranks_and_one_process(tmp_path):
    import embcore as ec

    written, cont = h.checkpoint_cases()
    sharded_path, single_path = str(tmp_path / "by-2-ranks"), str(tmp_path / "by-1-process")
    saved = h.launch("worker_checkpoint_save", 2, sharded_path)
    # What 2 ranks saved is the single-process state after the same steps.
    ref = h.reference(written)
    for table, value in ref["tables"].items():
        torch.testing.assert_close(saved[0]["tables"][table], value, rtol=1e-5, atol=1e-6)

    # One process writes a checkpoint too; both load into 3 ranks under other plans.
    single = ec.EmbeddingEngine(
        h.feature_config(written.reference_init), h.ec_optimizer(written), backend="reference"
    )
    h.train(single, written, [0, 1])
    ec.checkpoint.save(single, single_path)
    loaded = h.launch("worker_checkpoint_load", 3, [sharded_path, single_path])
    for rank in range(3):
        for path, state in ((sharded_path, saved[0]), (single_path, h.final_state(single))):
            got = loaded[rank][path]
            assert got["step"] == state["step"] == h.STEPS
            for table, value in state["tables"].items():
                assert torch.equal(got["tables"][table], value), (rank, path, table)
                for slot, s in state["slots"][table].items():
                    assert torch.equal(got["slots"][table][slot], s), (rank, path, table, slot)

    # Into one process and a CPU serving engine: identical values.
    one = ec.EmbeddingEngine(h.feature_config(), ec.Adagrad(learning_rate=0.3), seed=4)
    ec.checkpoint.load(one, sharded_path)
    serving = ec.EmbeddingEngine(h.feature_config(), seed=4)
    ec.checkpoint.load(serving, sharded_path)
    for table, value in saved[0]["tables"].items():
        assert torch.equal(one.embedding_tables[table], value)
        assert torch.equal(serving.embedding_tables[table], value)
        for slot, s in saved[0]["slots"][table].items():
            assert torch.equal(one.slot_variables[table][slot], s)

    # Training on from the 2-rank checkpoint on 3 ranks equals one process doing the same.
    again = ec.EmbeddingEngine(h.feature_config(), h.ec_optimizer(cont), backend="reference")
    ec.checkpoint.load(again, sharded_path)
    acts = h.train(again, cont, [0, 1, 2])
    want = h.final_state(again)
    for rank in range(3):
        for step in range(h.STEPS):
            for name, value in h._slice(acts[step], cont, step, [0, 1, 2], rank).items():
                torch.testing.assert_close(
                    loaded[rank]["continued_acts"][step][name], value, rtol=1e-5, atol=1e-6
                )
        for table, value in want["tables"].items():
            torch.testing.assert_close(
                loaded[rank]["continued"]["tables"][table], value, rtol=1e-5, atol=1e-6
            )


def test_failures_stop_every_rank_with_a_clear_error():
    results = h.launch("worker_errors", 2)
    r0, r1 = results
    # NaN on rank 1 only: rank 1 names the feature, rank 0 names rank 1; nobody updates.
    assert r1["nan_raise"].startswith("ValueError: gradients for features 'a1' (table 'a')")
    assert r0["nan_raise"].startswith("ValueError: gradients on rank(s) [1] have NaN or Inf")
    # non_finite_gradients='skip': every rank drops the step.
    assert r0["nan_skip"] is None and r1["nan_skip"] is None
    for r in results:
        assert r["unchanged_raise"] and r["unchanged_skip"]
        assert r["skipped_raise"] == 0 and r["skipped_skip"] == 1
    assert r0["bad_shape"].startswith("ValueError: gradient for feature 'b': expected shape (3, 5)")
    assert r1["bad_shape"] == (
        "RuntimeError: EmbeddingEngine: the gradients on rank(s) [0] were invalid (see the error "
        "there); no rank updated its tables"
    )
    for r in results:
        assert r["step_after_retry"] == 1
        assert (
            "ranks [1] have a different feature config, seed or plan than rank 0" in r["mismatch"]
        )
        assert "world_size=3, but the process group has 2 ranks" in r["world_mismatch"]


@pytest.mark.slow
def test_the_documented_torchrun_example_matches_one_process(tmp_path):
    """docs/sharding.md's script under ``torchrun --nproc-per-node 2``, with small tables."""
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(root / "examples" / "sharded_training.py"),
        "--vocab-cap",
        "3000",
        "--batch-size",
        "64",
        "--steps",
        "2",
        "--dim",
        "8",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ShardedEmbeddingEngine over 2 ranks" in out.stdout
    assert "matches one process: 26 tables" in out.stdout


@pytest.mark.parametrize("case", [c for c in CASES if c.dynamic], ids=lambda c: c.id)
def test_key_hash_tables_hold_the_single_process_keys(case: h.Case, runs: dict[int, list[dict]]):
    ref = h.reference(case)
    assert set(ref["keys"]) == {"a", "c"} and ref["keys"]["c"].numel() == 6  # c at max_rows
    for results in runs[case.world]:
        for table, keys in ref["keys"].items():
            assert torch.equal(results[case.id]["keys"][table], keys), (case.id, table)
