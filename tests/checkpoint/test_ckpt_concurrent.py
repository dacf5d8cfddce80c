"""Saves that race or fail: two processes saving to one path (exactly one wins, the other is
told so, the published checkpoint is the winner's alone), a full disk (a clear error, no
temporary directory left), and leftovers of killed saves (removed; a live save's kept)."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import warnings
from pathlib import Path

import pytest
import torch
from ckpt_craft import assert_state, make_engine, snapshot, train

import embcore as ec
from embcore import _atomic


def _saver(path: str, seed: int, start: mp.synchronize.Barrier, out: str) -> None:
    warnings.simplefilter("error")  # as pytest's filterwarnings = error
    torch.set_num_threads(1)
    engine = train(make_engine(seed=seed), seed=seed)
    torch.save(snapshot(engine), f"{out}.state")
    start.wait(60)
    try:
        ec.checkpoint.save(engine, path)
        result = "ok"
    except (FileExistsError, RuntimeError) as error:
        result = f"{type(error).__name__}: {error}"
    Path(out).write_text(result)


@pytest.mark.multiprocess
@pytest.mark.parametrize("trial", range(3))
def test_two_processes_saving_to_one_path(tmp_path, trial):
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "embcore", "embcore.checkpoint", "ckpt_craft"])
    start = ctx.Barrier(2)
    path = str(tmp_path / "c")
    outs = [str(tmp_path / f"out{i}") for i in range(2)]
    procs = [
        ctx.Process(target=_saver, args=(path, 10 + i + 2 * trial, start, outs[i]))
        for i in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    results = [Path(o).read_text() for o in outs]
    winners = [i for i, r in enumerate(results) if r == "ok"]
    assert len(winners) == 1, results
    loser = results[1 - winners[0]]
    assert loser.startswith("FileExistsError: embcore.checkpoint.save: ") and (
        "was published by another save while this one was writing" in loser
        or "already exists; a checkpoint is never overwritten" in loser
    ), loser
    assert sorted(os.listdir(tmp_path)) == ["c", "out0", "out0.state", "out1", "out1.state"]
    ec.checkpoint.verify(path)
    engine = make_engine()
    ec.checkpoint.load(engine, path)
    want = torch.load(f"{outs[winners[0]]}.state", weights_only=True)
    other = torch.load(f"{outs[1 - winners[0]]}.state", weights_only=True)
    assert not torch.equal(want["a.weight"], other["a.weight"])  # the two states differ
    assert_state(engine, want)


def test_a_full_disk_says_so_and_leaves_no_temporary_directory(tmp_path, monkeypatch):
    from torch.distributed.checkpoint import filesystem

    write_item = filesystem._write_item
    written = []

    def disk_full(*args, **kwargs):
        if written:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(write_item(*args, **kwargs))
        return written[-1]

    monkeypatch.setattr(filesystem, "_write_item", disk_full)
    with pytest.raises(_atomic.DiskFullError) as caught:
        ec.checkpoint.save(train(make_engine()), tmp_path / "c")
    assert caught.value.errno == errno.ENOSPC
    assert f"no space left on the device while writing {tmp_path / 'c'}" in str(caught.value)
    assert written and os.listdir(tmp_path) == []


def test_a_killed_saves_leftover_is_removed_and_a_live_saves_kept(tmp_path):
    engine = train(make_engine())
    dead = tmp_path / "c.tmp-dead"  # what a SIGKILLed save leaves: nobody holds its lock
    dead.mkdir()
    (dead / "__0_0.distcp").write_bytes(b"torn")
    live = _atomic.TempDir(tmp_path / "c")  # another save of the same path, still writing
    try:
        with pytest.raises(FileNotFoundError, match=r"c\.tmp-\w+ is a save that did not finish"):
            ec.checkpoint.load(make_engine(), tmp_path / "c")
        ec.checkpoint.save(engine, tmp_path / "c")
        assert sorted(os.listdir(tmp_path)) == sorted(["c", live.path.name])
        ec.checkpoint.verify(tmp_path / "c")
    finally:
        live.remove()
    assert os.listdir(tmp_path) == ["c"]
