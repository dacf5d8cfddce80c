"""A training process with dynamic tables that saves a full checkpoint, then deltas each on
the one before, SIGKILLed at random points of the delta saves (after a tensor is written,
before the manifest, before the publishing rename) and between steps: every published
checkpoint verifies with its chain, a delta killed half-way is never published nor loadable,
and the run resumed from the last published delta ends bit-identical to an uninterrupted one.
Uses the instrumentation of ``test_crash``."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import signal
import time
import warnings

import pytest
import torch
from dynamic_ckpt_cases import assert_same, make_engine, snapshot, train_step
from test_crash import Points, check_published, instrument, latest_checkpoint

import embcore as ec
from embcore.checkpoint import CheckpointError

STEPS = 12
EVERY = 3  # a full checkpoint after step 3, deltas after 6, 9 and 12


def run(directory: str, points: Points) -> ec.EmbeddingEngine:
    """Train to ``STEPS`` from the last checkpoint in ``directory`` (or from the start),
    saving each checkpoint as a delta on the last one published."""
    os.makedirs(directory, exist_ok=True)
    engine = make_engine(pipeline=True)
    latest = latest_checkpoint(directory)
    if latest is not None:
        ec.checkpoint.load(engine, latest)
    for step in range(engine.step, STEPS):
        points(f"step {step}")
        train_step(engine, step)
        if (step + 1) % EVERY == 0:
            points.saving = step + 1
            path = os.path.join(directory, f"step-{step + 1:04d}")
            ec.checkpoint.save(engine, path, base=latest_checkpoint(directory))
            points(f"save {step + 1} done")
    return engine


def child(directory: str, kill_at: str | None, out: str) -> None:
    warnings.simplefilter("error")  # as pytest's filterwarnings = error
    torch.set_num_threads(1)
    points = Points(kill_at)
    instrument(points, setattr)
    torch.save(snapshot(run(directory, points)), out)


def start(directory: str, kill_at: str | None, out: str) -> mp.Process:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "embcore", "embcore.checkpoint", "dynamic_ckpt_cases"])
    process = ctx.Process(target=child, args=(directory, kill_at, out))
    process.start()
    return process


def test_sigkill_during_delta_saves_then_resume_is_bit_identical(tmp_path, monkeypatch):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        points = Points()
        instrument(points, monkeypatch.setattr)
        want = snapshot(run(str(tmp_path / "uninterrupted"), points))
    finally:
        torch.set_num_threads(threads)
    monkeypatch.undo()
    labels = points.seen
    assert "save 9 wrote user.#deleted" in labels and "save 12 publish" in labels

    # Kills inside the deltas' writes, between their files and the rename, between steps.
    rng = random.Random(0)
    delta = [i for i, p in enumerate(labels) if p.startswith(("save 6 ", "save 9 ", "save 12 "))]
    wrote = [i for i in delta if " wrote " in labels[i]]
    commit = [i for i in delta if labels[i].endswith((" manifest", " publish"))]
    steps = [i for i, p in enumerate(labels) if p.startswith("step ")]
    picks = {rng.choice(wrote), rng.choice(wrote), rng.choice(commit), rng.choice(steps)}
    kills = [labels[i] for i in sorted(picks)]

    directory, out = str(tmp_path / "killed"), str(tmp_path / "final.pt")
    for kill_at in kills:
        process = start(directory, kill_at, out)
        process.join(120)
        assert process.exitcode == -signal.SIGKILL, (kill_at, process.exitcode)
        published = check_published(directory)  # verifies every chain
        if kill_at.startswith("save "):
            saving = int(kill_at.split()[1])
            assert f"step-{saving:04d}" not in published, kill_at
            (left,) = [p for p in os.listdir(directory) if p.startswith(f"step-{saving:04d}.tmp-")]
            if " wrote " in kill_at:  # the half-written delta is not a checkpoint
                with pytest.raises(CheckpointError, match=r"has no embcore_manifest\.json"):
                    ec.checkpoint.verify(os.path.join(directory, left))

    process = start(directory, None, out)  # killed from outside, at a random moment
    time.sleep(rng.uniform(0.0, 0.5))
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGKILL)
    process.join(120)
    assert process.exitcode in (0, -signal.SIGKILL)
    check_published(directory)

    if os.path.exists(out):
        os.remove(out)
    process = start(directory, None, out)
    process.join(120)
    assert process.exitcode == 0
    assert_same(torch.load(out, weights_only=True), want)
    assert check_published(directory) == ["step-0003", "step-0006", "step-0009", "step-0012"]
    assert "base" not in ec.checkpoint.read_manifest(os.path.join(directory, "step-0003"))
    for n in (6, 9, 12):
        manifest = ec.checkpoint.read_manifest(os.path.join(directory, f"step-{n:04d}"))
        assert manifest["base"]["name"] == f"step-{n - EVERY:04d}"
    assert not any(".tmp" in p for p in os.listdir(directory))
