"""Verification covers every stored tensor and every branch of the manifest-versus-metadata
comparison: each tensor corrupted in turn (``step`` included), a corrupt chunk that only rank 1
verifies, and each way the manifest's chunk list can disagree with DCP's."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import re
import warnings
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from ckpt_craft import (
    KEYS,
    assert_state,
    make_engine,
    manifest,
    only_chunk,
    snapshot,
    train,
    write_manifest,
)

import embcore as ec


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    ec.checkpoint.save(train(make_engine()), tmp_path / "c")
    return tmp_path / "c"


def flip_a_byte(path: Path, key: str) -> str:
    """Flip one bit inside ``key``'s stored bytes; the sha256 of what is now stored."""
    c = only_chunk(manifest(path), key)
    file = path / c["file"]
    data = bytearray(file.read_bytes())
    data[c["offset"] + c["length"] // 2] ^= 0x10
    file.write_bytes(bytes(data))
    return hashlib.sha256(data[c["offset"] : c["offset"] + c["length"]]).hexdigest()


def test_the_manifest_stores_exactly_these_tensors(saved):
    assert sorted(manifest(saved)["tensors"]) == KEYS


@pytest.mark.parametrize("key", KEYS)
def test_each_corrupt_tensor_is_found_and_named(saved, key):
    expected = only_chunk(manifest(saved), key)["sha256"]
    found = flip_a_byte(saved, key)
    table = key.rsplit(".", 1)[0]
    with pytest.raises(ec.checkpoint.CheckpointError) as caught:
        ec.checkpoint.verify(saved)
    message = str(caught.value)
    assert f"table '{table}': '{key}'[" in message
    assert f"sha256 expected {expected}, found {found}" in message
    assert all(f"'{other}'[" not in message for other in KEYS if other != key)
    engine = make_engine()
    before = snapshot(engine)
    with pytest.raises(ec.checkpoint.CheckpointError, match=f"'{key}'"):
        ec.checkpoint.load(engine, saved)
    assert_state(engine, before)


# ------------------------------------------------------------------- two ranks verifying
def _rank(rank: int, store: str, path: str, out: str) -> None:
    warnings.simplefilter("error")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    engine = make_engine()
    before = snapshot(engine)
    try:
        ec.checkpoint.load(engine, path)
        result = "loaded"
    except ec.checkpoint.CheckpointError as error:
        result = str(error)
    unchanged = all(torch.equal(engine.state_dict()[k], v) for k, v in before.items())
    dist.destroy_process_group()
    Path(out).write_text(f"{unchanged}\n{result}")
    # The outcome is on disk: leave without the interpreter's teardown, where gloo's threads
    # occasionally abort a loaded machine's process ("terminate called without an active
    # exception") after everything under test has finished.
    os._exit(0)


@pytest.mark.multiprocess
def test_a_chunk_that_rank_1_verifies_stops_both_ranks(saved, tmp_path):
    """Chunks are verified round-robin (chunk i by rank i % 2, in key order); ``step`` is the
    last of 6, so rank 1 alone reads it and rank 0 learns of the mismatch from rank 1."""
    assert KEYS.index("step") % 2 == 1
    found = flip_a_byte(saved, "step")
    ctx = mp.get_context("spawn")
    outs = [str(tmp_path / f"rank{r}") for r in range(2)]
    procs = [
        ctx.Process(target=_rank, args=(r, str(tmp_path / "store"), str(saved), outs[r]))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    (unchanged0, message0), (unchanged1, message1) = (
        Path(o).read_text().split("\n", 1) for o in outs
    )
    assert unchanged0 == unchanged1 == "True"
    assert "is corrupt, nothing was loaded: table 'step': 'step'[] " in message0
    assert message0.endswith("found a mismatch on another rank")
    assert message1.endswith(f"found {found}")


# ------------------------------------------------ the manifest against DCP's chunk list
def _drop(c: dict, entry: dict) -> None:
    entry["chunks"].remove(c)


def _add(c: dict, entry: dict) -> None:
    entry["chunks"].append({**c, "offsets": [c["offsets"][0] + 9, 0]})


def _offset(c: dict, entry: dict) -> None:
    c["offset"] += 4


def _length(c: dict, entry: dict) -> None:
    c["length"] -= 4


@pytest.mark.parametrize("edit", [_drop, _add, _offset, _length], ids=lambda f: f.__name__[1:])
def test_a_chunk_list_that_differs_from_the_metadata_is_refused(saved, edit):
    document = manifest(saved)
    entry = document["tensors"]["a.weight"]
    edit(entry["chunks"][0], entry)
    write_manifest(saved, document)
    with pytest.raises(
        ec.checkpoint.CheckpointError,
        match=r"DCP metadata and the manifest list different chunks for tables \['a'\]$",
    ):
        ec.checkpoint.verify(saved)


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [("shape", [9, 5], "float32 [9, 5]"), ("dtype", "float64", "float64 [9, 4]")],
)
def test_a_shape_or_dtype_that_differs_from_the_metadata_is_refused(saved, field, value, said):
    document = manifest(saved)
    document["tensors"]["a.weight"][field] = value
    write_manifest(saved, document)
    match = re.escape(
        f"table 'a': 'a.weight' is {said} in the manifest but float32 [9, 4] in DCP metadata"
    )
    with pytest.raises(ec.checkpoint.CheckpointError, match=match):
        ec.checkpoint.verify(saved)
    engine = make_engine()
    before = snapshot(engine)
    with pytest.raises(ec.checkpoint.CheckpointError, match=match):
        ec.checkpoint.load(engine, saved)
    assert_state(engine, before)
    assert os.path.isdir(saved)
