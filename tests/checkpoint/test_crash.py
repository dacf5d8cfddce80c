"""A training process killed by SIGKILL at random points, in the middle of a checkpoint save
included, resumes from its last complete checkpoint and ends bit-identical to a run that was
never interrupted (same steps, same data order).

The run is instrumented with named points: before each step, after each tensor DCP writes
during a save (files not yet closed or fsynced), before the manifest is written, before the
rename that publishes the checkpoint. A child process SIGKILLs itself at the point it is
given (no cleanup, no ``atexit``: what ``kill -9`` or an OOM kill does); the points are drawn
at random (seeded) from the uninterrupted run's points, and one more run is killed from
outside after a random delay. Children fork from a forkserver that has imported torch and
embcore once.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import re
import signal
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import embcore as ec
from embcore.checkpoint import _manifest, _save

STEPS = 12
EVERY = 3  # a checkpoint after steps 3, 6, 9 and 12


def make_engine(rows: str | None = None) -> ec.EmbeddingEngine:
    """Two tables with stateful optimizers (Adam's update depends on the step count);
    ``rows``: keep table ``a`` in DiskStorage there, with a cache of 3 rows (its working
    file outlives a kill, and is not a checkpoint: a new engine starts it afresh)."""
    storage = None if rows is None else ec.DiskStorage(rows, cache_bytes=3 * (4 * 8 + 40))
    a = ec.TableConfig(
        vocabulary_size=40,
        dim=4,
        name="a",
        optimizer=ec.Adagrad(learning_rate=0.1),
        storage=storage,
    )
    b = ec.TableConfig(
        vocabulary_size=25,
        dim=3,
        name="b",
        combiner="sum",
        optimizer=ec.Adam(learning_rate=0.05, lazy_adam=False),
    )
    features = {
        "a": ec.FeatureConfig(table=a),
        "b": ec.FeatureConfig(table=b),
        "b_seq": ec.FeatureConfig(table=b, max_sequence_length=2),
    }
    return ec.EmbeddingEngine(features, backend="reference", seed=3)


def train_step(engine: ec.EmbeddingEngine, step: int) -> None:
    """Step ``step``'s batch and gradients depend on ``step`` only (the data order)."""
    g = torch.Generator().manual_seed(1000 + step)

    def ragged(vocab: int, max_len: int) -> ec.RaggedIds:
        lengths = torch.randint(0, max_len + 1, (5,), generator=g)
        splits = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        return ec.RaggedIds(torch.randint(0, vocab, (int(splits[-1]),), generator=g), splits)

    features = {
        "a": ragged(40, 3),
        "b": torch.randint(0, 25, (5,), generator=g),
        "b_seq": ragged(25, 2),
    }
    if step % 2:
        engine.enqueue(features)
        acts = engine.dequeue()
        engine.apply_gradients({k: torch.randn(v.shape, generator=g) for k, v in acts.items()})
    else:
        acts = engine(features)
        sum((v * torch.randn(v.shape, generator=g)).sum() for v in acts.values()).backward()


class Points:
    """The named points of a run, in order; at ``kill_at`` the process SIGKILLs itself."""

    def __init__(self, kill_at: str | None = None) -> None:
        self.kill_at = kill_at
        self.seen: list[str] = []
        self.saving = 0

    def __call__(self, label: str) -> None:
        self.seen.append(label)
        if label == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def instrument(points: Points, patch: Callable[[Any, str, Any], None]) -> None:
    """Put ``points`` inside ``ec.checkpoint.save``: after each tensor DCP writes, before the
    manifest, before the publishing rename."""
    from torch.distributed.checkpoint import filesystem

    write_item, write_manifest, publish = (
        filesystem._write_item,
        _manifest.write,
        _save.publish,
    )

    def traced_write_item(*args: Any, **kwargs: Any) -> Any:
        result = write_item(*args, **kwargs)
        points(f"save {points.saving} wrote {result.index.fqn}")
        return result

    def traced_write_manifest(directory: str, manifest: dict) -> None:
        points(f"save {points.saving} manifest")
        write_manifest(directory, manifest)

    def traced_publish(tmp: str, path: str) -> None:
        points(f"save {points.saving} publish")
        publish(tmp, path)

    patch(filesystem, "_write_item", traced_write_item)
    patch(_manifest, "write", traced_write_manifest)
    patch(_save, "publish", traced_publish)


def latest_checkpoint(directory: str) -> str | None:
    """The newest published checkpoint: a ``step-NNNN`` directory, never a ``.tmp``."""
    done = sorted(p for p in os.listdir(directory) if re.fullmatch(r"step-\d{4}", p))
    return os.path.join(directory, done[-1]) if done else None


def run(directory: str, points: Points, disk: bool = False) -> ec.EmbeddingEngine:
    """Train to ``STEPS`` from the last checkpoint in ``directory`` (or from the start);
    ``disk``: table ``a`` in DiskStorage under ``directory/rows``."""
    os.makedirs(directory, exist_ok=True)
    engine = make_engine(os.path.join(directory, "rows") if disk else None)
    latest = latest_checkpoint(directory)
    if latest is not None:
        ec.checkpoint.load(engine, latest)
    for step in range(engine.step, STEPS):
        points(f"step {step}")
        train_step(engine, step)
        if (step + 1) % EVERY == 0:
            points.saving = step + 1
            ec.checkpoint.save(engine, os.path.join(directory, f"step-{step + 1:04d}"))
            points(f"save {step + 1} done")
    return engine


def state(engine: ec.EmbeddingEngine) -> dict[str, torch.Tensor]:
    out = {"step": torch.tensor(engine.step)}
    for table, weight in engine.embedding_tables.items():
        out[f"{table}.weight"] = weight.clone()
        for slot, value in engine.slot_variables[table].items():
            out[f"{table}.{slot}"] = value.clone()
    return out


def child(directory: str, kill_at: str | None, out: str, disk: bool) -> None:
    warnings.simplefilter("error")  # as pytest's filterwarnings = error
    torch.set_num_threads(1)
    points = Points(kill_at)
    instrument(points, setattr)
    torch.save(state(run(directory, points, disk)), out)


def start(directory: str, kill_at: str | None, out: str, disk: bool = False) -> mp.Process:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "embcore", "embcore.checkpoint"])
    process = ctx.Process(target=child, args=(directory, kill_at, out, disk))
    process.start()
    return process


def check_published(directory: str) -> list[str]:
    """Every published checkpoint verifies (manifest, metadata, every chunk's sha256)."""
    names = sorted(p for p in os.listdir(directory) if re.fullmatch(r"step-\d{4}", p))
    for name in names:
        ec.checkpoint.verify(os.path.join(directory, name))
    return names


@pytest.mark.parametrize(("seed", "disk"), [(0, False), (1, False), (2, True)])
def test_sigkill_anywhere_then_resume_is_bit_identical(tmp_path, monkeypatch, seed, disk):
    """``disk``: with table ``a`` in DiskStorage, killed runs resume as well, and end equal to
    an uninterrupted run in memory."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        points = Points()
        instrument(points, monkeypatch.setattr)
        want = state(run(str(tmp_path / "uninterrupted"), points))
    finally:
        torch.set_num_threads(threads)
    monkeypatch.undo()
    labels = points.seen
    assert labels.count("save 6 manifest") == 1 and "save 12 wrote b.velocities" in labels

    # One kill in the middle of DCP's writes, one between the files and the publishing
    # rename, one between steps; positions increase, so each is reached after resuming.
    rng = random.Random(seed)
    wrote = [i for i, p in enumerate(labels) if " wrote " in p]
    commit = [i for i, p in enumerate(labels) if p.endswith((" manifest", " publish"))]
    steps = [i for i, p in enumerate(labels) if p.startswith("step ")]
    kills = [labels[i] for i in sorted({rng.choice(wrote), rng.choice(commit), rng.choice(steps)})]

    directory, out = str(tmp_path / "killed"), str(tmp_path / "final.pt")
    for kill_at in kills:
        process = start(directory, kill_at, out, disk)
        process.join(60)
        assert process.exitcode == -signal.SIGKILL, (kill_at, process.exitcode)
        published = check_published(directory)
        if kill_at.startswith("save "):  # killed mid-save: that checkpoint does not exist
            saving = int(kill_at.split()[1])
            assert f"step-{saving:04d}" not in published, kill_at
            left = [p for p in os.listdir(directory) if p.startswith(f"step-{saving:04d}.tmp-")]
            assert len(left) == 1 and os.path.isdir(os.path.join(directory, left[0])), kill_at

    process = start(directory, None, out, disk)  # killed from outside, at a random moment
    time.sleep(rng.uniform(0.0, 0.5))
    with contextlib.suppress(ProcessLookupError):  # it may have finished (forkserver reaped it)
        os.kill(process.pid, signal.SIGKILL)
    process.join(60)
    assert process.exitcode in (0, -signal.SIGKILL)
    check_published(directory)

    if os.path.exists(out):
        os.remove(out)
    process = start(directory, None, out, disk)
    process.join(60)
    assert process.exitcode == 0
    got = torch.load(out, weights_only=True)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    assert check_published(directory) == ["step-0003", "step-0006", "step-0009", "step-0012"]
    assert not any(".tmp" in p for p in os.listdir(directory))  # later saves cleared them
    if disk:  # the working file was used, and a kill left its lock free for the next run
        assert os.path.getsize(os.path.join(directory, "rows", "a.rows")) == 40 * 512
