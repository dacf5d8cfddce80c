"""``save(..., base=)`` refuses, before writing anything, a delta that could never load: one on
a chain whose root or middle link was deleted, or one of whose files no longer verifies, even
when the engine remembers the base's keys (it saved that very base). Real chains on disk,
damaged for real; the undamaged chain then takes the delta, which loads. (Ranks given
different bases: tests/sharding/test_delta_base_ranks.py.)"""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest
from dynamic_ckpt_cases import assert_same, make_engine, snapshot, train_step

import embcore as ec
from embcore.checkpoint import CheckpointError, _delta


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An engine that saved c3 (full), c6 on c3 and c9 on c6 (it remembers c9), trained to
    step 12, and the directory of the chain."""
    where = tmp_path_factory.mktemp("chain")
    engine = make_engine()
    base = None
    for step in range(12):
        train_step(engine, step)
        if step + 1 in (3, 6, 9):
            ec.checkpoint.save(engine, where / f"c{step + 1}", base=base)
            base = where / f"c{step + 1}"
    return engine, where


def chain(saved, tmp_path):
    """A fresh copy of the chain in ``tmp_path`` (the engine recognises its manifests)."""
    engine, where = saved
    for name in ("c3", "c6", "c9"):
        shutil.copytree(where / name, tmp_path / name)
    return engine


def flip_a_byte(path, key: str) -> None:
    manifest = ec.checkpoint.read_manifest(path)
    chunk = manifest["tensors"][key]["chunks"][0]
    with open(os.path.join(path, chunk["file"]), "r+b") as f:
        f.seek(chunk["offset"] + chunk["length"] - 3)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))


def nothing_written(tmp_path) -> bool:
    return not any(p.name.startswith("c12") for p in tmp_path.iterdir())


def test_a_deleted_root_or_middle_link_refuses_the_delta(saved, tmp_path):
    engine = chain(saved, tmp_path)
    raw = (tmp_path / "c9" / "embcore_manifest.json").read_bytes()
    assert hashlib.sha256(raw).hexdigest() in _delta._KNOWN[engine]  # remembered: no read
    for gone in ("c3", "c6"):
        aside = tmp_path.parent / f"aside-{gone}"
        shutil.move(tmp_path / gone, aside)
        with pytest.raises(FileNotFoundError, match=rf"could never load.*{gone} of the delta"):
            ec.checkpoint.save(engine, tmp_path / "c12", base=tmp_path / "c9")
        assert nothing_written(tmp_path)
        shutil.move(aside, tmp_path / gone)
    ec.checkpoint.save(engine, tmp_path / "c12", base=tmp_path / "c9")  # whole again: fine
    fresh = make_engine()
    ec.checkpoint.load(fresh, tmp_path / "c12")
    assert_same(snapshot(fresh), snapshot(engine))


@pytest.mark.parametrize(
    ("link", "key"),
    [("c3", "user.weight"), ("c6", "item.keys"), ("c9", "fixed.weight"), ("c3", "step")],
)
def test_a_corrupt_file_anywhere_in_the_chain_refuses_the_delta(saved, tmp_path, link, key):
    engine = chain(saved, tmp_path)
    flip_a_byte(tmp_path / link, key)
    with pytest.raises(CheckpointError, match=rf"{link} is corrupt, a delta on it could never"):
        ec.checkpoint.save(engine, tmp_path / "c12", base=tmp_path / "c9")
    assert nothing_written(tmp_path)


def test_a_base_replaced_under_its_name_refuses_the_delta(saved, tmp_path):
    chain(saved, tmp_path)
    engine = make_engine()
    ec.checkpoint.load(engine, tmp_path / "c9")  # the engine remembers c9 (and c9 alone)
    shutil.rmtree(tmp_path / "c6")
    ec.checkpoint.save(engine, tmp_path / "c6")  # another checkpoint under the middle's name
    raw = (tmp_path / "c9" / "embcore_manifest.json").read_bytes()
    assert hashlib.sha256(raw).hexdigest() in _delta._KNOWN[engine]
    with pytest.raises(CheckpointError, match=r"could never load.*c6 is not the base .*c9 was"):
        ec.checkpoint.save(engine, tmp_path / "c12", base=tmp_path / "c9")
    assert nothing_written(tmp_path)
