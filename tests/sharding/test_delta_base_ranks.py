"""Delta saves on 2 gloo ranks refuse, on every rank and before writing, what could never
load: ranks given different bases (or one rank none), and a base whose chain on disk lost
its root or holds a corrupt chunk (one that only rank 1 verifies). Workers in
delta_base_ranks.py."""

from __future__ import annotations

import os
import shutil

import pytest
import sharding_harness as h

from embcore.checkpoint._chain import open_checkpoint

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    where = tmp_path_factory.mktemp("delta-ranks")
    h.launch("delta_base_ranks:worker_setup", 2, str(where))
    return where


def copy(chain, tmp_path):
    for name in ("c3", "c6"):
        shutil.copytree(chain / name, tmp_path / name)
    return str(tmp_path)


def run(tmp: str, bases: list[str | None]) -> list[dict]:
    return h.launch("delta_base_ranks:worker_bases", 2, tmp, bases)


@pytest.mark.parametrize("bases", [["c3", "c6"], [None, "c6"], ["c6", None]])
def test_ranks_given_different_bases_all_raise_and_write_nothing(chain, tmp_path, bases):
    got = run(copy(chain, tmp_path), bases)
    for rank in range(2):
        assert got[rank]["outcome"].startswith("ValueError: embcore.checkpoint.save: rank(s) [1]")
        assert "were given another base" in got[rank]["outcome"]
        assert got[rank]["left"] == ["c3", "c6"]  # no c9, no temporary directory


def test_the_same_base_on_every_rank_saves(chain, tmp_path):
    got = run(copy(chain, tmp_path), ["c6", "c6"])
    assert [g["outcome"] for g in got] == ["saved", "saved"]
    assert got[0]["left"] == ["c3", "c6", "c9"]


def test_a_deleted_root_refuses_on_every_rank(chain, tmp_path):
    tmp = copy(chain, tmp_path)
    shutil.rmtree(tmp_path / "c3")
    got = run(tmp, ["c6", "c6"])
    for rank in range(2):
        assert got[rank]["outcome"].startswith("FileNotFoundError: ")
        assert "c3 of the delta checkpoint" in got[rank]["outcome"]
        assert got[rank]["left"] == ["c6"]


def test_a_corrupt_chunk_only_rank_1_verifies_refuses_on_every_rank(chain, tmp_path):
    tmp = copy(chain, tmp_path)
    root = open_checkpoint(os.path.join(tmp, "c3"))
    chunk = root.chunks[1]  # the chain's chunks are shared out: rank 1 verifies index 1
    with open(os.path.join(tmp, "c3", chunk.file), "r+b") as f:
        f.seek(chunk.offset + chunk.length - 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x01]))
    got = run(tmp, ["c6", "c6"])
    for rank in range(2):
        assert got[rank]["outcome"].startswith("CheckpointError: embcore.checkpoint.save: base")
        assert "c3 is corrupt, a delta on it could never load" in got[rank]["outcome"]
        assert got[rank]["left"] == ["c3", "c6"]
    assert "a mismatch on another rank" in got[0]["outcome"]
    assert "a mismatch on another rank" not in got[1]["outcome"]
