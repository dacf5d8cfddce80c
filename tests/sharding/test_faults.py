"""Distributed faults on 2 gloo ranks: a rank that dies, raises or hangs stops the other rank
with a clear error in bounded time, and a job killed in the middle of a checkpoint save resumes
from the last complete checkpoint bit-identical to one process trained without interruption.

Ranks are forked from a forkserver (see ``sharding_harness``) and joined by a file store, with
a process-group timeout of :data:`TIMEOUT_S` seconds. Each rank writes what it returned, or
the error it raised, to ``{rank}.pt``; a fault is a SIGKILL the rank sends itself at a named
point, an out-of-range id in one rank's batch, or a rank that stops calling collectives.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import time
import warnings
from datetime import timedelta
from typing import Any

import pytest
import sharding_harness as h
import torch
import torch.distributed as dist

import embcore as ec

pytestmark = pytest.mark.multiprocess

TIMEOUT_S = 5  # the process group's timeout: how long a rank waits for one that hangs
BOUND_S = 60  # every fault must stop the surviving rank well within this
STEPS, EVERY = 6, 2
CASE = h.Case("row_wise:div", "adagrad", 2)  # exact: sharded equals one process bit for bit


# ------------------------------------------------------------------------------ the ranks
def make_engine(plan: Any = None) -> ec.EmbeddingEngine:
    return ec.EmbeddingEngine(
        h.feature_config(), h.ec_optimizer(CASE), plan=plan, backend="reference"
    )


def train_step(engine: ec.EmbeddingEngine, step: int, ranks: list[int]) -> None:
    """One step on the concatenation of ``ranks``' batches (one rank, or all for the
    single-process reference)."""
    parts = [h.local_batch(CASE, step, r) for r in ranks]
    features = {k: h.concat([p[0][k] for p in parts]) for k in parts[0][0]}
    weights = {k: h.concat([p[1][k] for p in parts]) for k in parts[0][1]}
    acts = engine(features, weights)
    grads = {
        k: h.concat(
            [h.gradients(CASE, step, r, h._slice(acts, CASE, step, ranks, r))[k] for r in ranks]
        )
        for k in acts
    }
    sum((acts[k] * grads[k]).sum() for k in acts).backward()


def latest_checkpoint(directory: str) -> str | None:
    done = sorted(p for p in os.listdir(directory) if re.fullmatch(r"step-\d{4}", p))
    return os.path.join(directory, done[-1]) if done else None


def train(
    rank: int, world: int, directory: str, fault: str | None, at: str | None
) -> dict[str, Any]:
    """Train to ``STEPS`` from the last checkpoint, saving every ``EVERY`` steps. Rank 1 meets
    ``fault`` (``kill``, ``bad_input`` or ``hang``) at the point named ``at``."""
    saving = [0]

    def point(label: str) -> None:
        if rank != 1 or label != at:
            return
        if fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "hang":  # alive, but never reaches the next collective
            time.sleep(10 * BOUND_S)

    from torch.distributed.checkpoint import filesystem

    write_item = filesystem._write_item

    def traced_write_item(*args: Any, **kwargs: Any) -> Any:
        result = write_item(*args, **kwargs)
        point(f"save {saving[0]} wrote {result.index.fqn}")
        return result

    filesystem._write_item = traced_write_item  # a forked rank: nothing to restore

    engine = make_engine(CASE.plan())
    latest = latest_checkpoint(directory)
    if latest is not None:
        ec.checkpoint.load(engine, latest)
    resumed = engine.step
    for step in range(engine.step, STEPS):
        point(f"step {step}")
        if fault == "bad_input" and rank == 1 and at == f"step {step}":
            features, weights = h.local_batch(CASE, step, rank)
            features["a1"] = features["a1"] + 100  # table 'a' has 7 rows
            engine(features, weights)
        train_step(engine, step, [rank])
        if (step + 1) % EVERY == 0:
            saving[0] = step + 1
            ec.checkpoint.save(engine, os.path.join(directory, f"step-{step + 1:04d}"))
    return {"resumed_from": resumed, **h.final_state(engine)}


def _rank_main(rank: int, world: int, store: str, out: str, args: tuple) -> None:
    warnings.simplefilter("error")  # as pytest's filterwarnings = error
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=TIMEOUT_S),
    )
    try:
        result: dict[str, Any] = {"value": train(rank, world, *args)}
    except Exception as error:  # what the rank saw; then exit as an uncaught error would
        torch.save({"error": f"{type(error).__name__}: {error}"}, os.path.join(out, f"{rank}.pt"))
        os._exit(1)
    dist.destroy_process_group()
    torch.save(result, os.path.join(out, f"{rank}.pt"))


def launch(tmp: str, run: str, fault: str | None = None, at: str | None = None) -> dict:
    """Start 2 ranks training in ``tmp/ckpt``; wait for rank 1, then for rank 0.

    Returns each rank's exit code and result, and how long rank 0 ran on after rank 1 ended
    (``after_s``). A rank still running after ``BOUND_S`` is killed and fails the test.
    """
    ctx = mp.get_context("forkserver")  # preloads take effect if it is not running yet
    ctx.set_forkserver_preload(
        ["torch", "torch.distributed", "embcore", "embcore.checkpoint", "sharding_harness"]
    )
    out = os.path.join(tmp, run)
    os.makedirs(out)
    os.makedirs(os.path.join(tmp, "ckpt"), exist_ok=True)
    args = (os.path.join(tmp, "ckpt"), fault, at)
    procs = [
        ctx.Process(target=_rank_main, args=(r, 2, os.path.join(out, "store"), out, args))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    first = 0 if fault == "hang" else 1  # the rank that ends first
    try:
        procs[first].join(BOUND_S)
        ended = time.monotonic()
        if fault != "hang":
            procs[1 - first].join(BOUND_S)
        after = time.monotonic() - ended
        hung = [r for r, p in enumerate(procs) if p.is_alive() and r != 1 - first]
    finally:
        for p in procs:
            if p.is_alive():  # a hanging rank 1, or a failed test
                os.kill(p.pid, signal.SIGKILL)
                p.join()
    assert not hung, f"rank(s) {hung} still running after {BOUND_S} s"
    results = []
    for r in range(2):
        path = os.path.join(out, f"{r}.pt")
        results.append(torch.load(path, weights_only=False) if os.path.exists(path) else None)
    return {"exit": [p.exitcode for p in procs], "results": results, "after_s": after}


# ------------------------------------------------------------------------------ the tests
def test_a_rank_killed_mid_training_stops_the_other(tmp_path):
    got = launch(str(tmp_path), "run", "kill", "step 3")
    assert got["exit"] == [1, -signal.SIGKILL]
    error = got["results"][0]["error"]
    assert error.startswith("CommError: embcore.sharding: all_to_all (collective #"), error
    assert "failed on rank 0 of 2: another rank died" in error
    assert got["after_s"] < BOUND_S


def test_a_rank_that_raises_stops_the_other(tmp_path):
    got = launch(str(tmp_path), "run", "bad_input", "step 1")
    assert got["exit"] == [1, 1]
    assert got["results"][1]["error"].startswith("ValueError: feature 'a1': id 10"), got["results"][
        1
    ]
    assert got["results"][0]["error"].startswith("CommError: embcore.sharding:")
    assert got["after_s"] < BOUND_S


def test_a_rank_that_hangs_is_detected_after_the_timeout(tmp_path):
    start = time.monotonic()
    got = launch(str(tmp_path), "run", "hang", "step 3")
    assert got["exit"][0] == 1
    error = got["results"][0]["error"]
    assert error.startswith("CommError: embcore.sharding:") and "imed out" in error, error
    assert TIMEOUT_S <= time.monotonic() - start < BOUND_S


def test_killed_in_the_middle_of_a_save_then_resumed_equals_one_process(tmp_path):
    tmp = str(tmp_path)
    first = launch(tmp, "first", "kill", "save 4 wrote c.weight")
    assert first["exit"] == [1, -signal.SIGKILL]
    error = first["results"][0]["error"]
    assert error.startswith("CommError: embcore.checkpoint.save of "), error
    # rank 0 saw the save fail and removed its temporary directory: nothing half-written stays
    assert sorted(os.listdir(os.path.join(tmp, "ckpt"))) == ["step-0002"]
    assert first["after_s"] < BOUND_S

    again = launch(tmp, "again", None, None)
    assert again["exit"] == [0, 0]
    assert sorted(os.listdir(os.path.join(tmp, "ckpt"))) == [
        "step-0002",
        "step-0004",
        "step-0006",
    ]
    one = make_engine()
    for step in range(STEPS):
        train_step(one, step, [0, 1])
    want = h.final_state(one)
    for rank in range(2):
        got = again["results"][rank]["value"]
        assert got["resumed_from"] == 2 and got["step"] == want["step"] == STEPS
        for table, value in want["tables"].items():
            assert torch.equal(got["tables"][table], value), (rank, table)
            for slot, s in want["slots"][table].items():
                assert torch.equal(got["slots"][table][slot], s), (rank, table, slot)
