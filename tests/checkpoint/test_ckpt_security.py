"""Crafted checkpoints: every file name in ``.metadata`` and the manifest stays inside the
checkpoint directory, byte ranges are bounded by file sizes, and nothing outside the
checkpoint is read, hashed or echoed. Each refusal leaves the engine unchanged."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import pytest
from ckpt_craft import (
    assert_state,
    make_engine,
    manifest,
    only_chunk,
    redirect,
    snapshot,
    train,
    write_manifest,
)

import embcore as ec


@pytest.fixture
def two(tmp_path: Path) -> tuple[Path, Path]:
    """A checkpoint ``mine`` and someone else's ``theirs`` (another seed) beside it."""
    ec.checkpoint.save(train(make_engine()), tmp_path / "mine")
    ec.checkpoint.save(train(make_engine(seed=77), seed=9), tmp_path / "theirs")
    return tmp_path / "mine", tmp_path / "theirs"


def refused(path: Path, match: str) -> str:
    """Both verify and load refuse ``path``; the engine stays as it was."""
    with pytest.raises(ec.checkpoint.CheckpointError, match=match):
        ec.checkpoint.verify(path)
    engine = make_engine()
    before = snapshot(engine)
    with pytest.raises(ec.checkpoint.CheckpointError, match=match) as caught:
        ec.checkpoint.load(engine, path)
    assert_state(engine, before)
    return str(caught.value)


@pytest.mark.parametrize("where", ["parent", "absolute"])
def test_a_chunk_name_outside_the_directory_is_refused(two, where):
    mine, theirs = two
    name = "../theirs/__0_0.distcp" if where == "parent" else str(theirs / "__0_0.distcp")
    offset = only_chunk(manifest(theirs), "a.weight")
    redirect(mine, "a.weight", relative_path=name, offset=offset["offset"])
    message = refused(mine, r"refusing the file name .*plain files inside its own directory")
    # nothing of the other checkpoint is hashed into the message
    data = (theirs / "__0_0.distcp").read_bytes()
    digest = hashlib.sha256(data[offset["offset"] : offset["offset"] + offset["length"]])
    assert digest.hexdigest() not in message


def test_a_symlink_to_another_checkpoints_file_is_refused(two):
    mine, theirs = two
    os.remove(mine / "__0_0.distcp")
    os.symlink(theirs / "__0_0.distcp", mine / "__0_0.distcp")
    refused(mine, r"__0_0\.distcp is a symbolic link")


def test_dev_zero_is_refused_at_once_by_name_and_through_a_link(tmp_path, two):
    mine, _ = two
    copy = tmp_path / "copy"
    shutil.copytree(mine, copy)
    redirect(mine, "step", relative_path="/dev/zero", length=1 << 62)
    refused(mine, r"refusing the file name '/dev/zero'")
    redirect(copy, "step", relative_path="zero", length=1 << 62)
    os.symlink("/dev/zero", copy / "zero")
    refused(copy, r"zero is a symbolic link")


def test_a_fifo_or_a_directory_is_not_a_chunk_file(tmp_path, two):
    mine, _ = two
    copy = tmp_path / "copy"
    shutil.copytree(mine, copy)
    redirect(mine, "b.weight", relative_path="pipe")
    os.mkfifo(mine / "pipe")  # opening it for reading would block without a writer
    refused(mine, r"pipe is not a regular file")
    redirect(copy, "b.weight", relative_path="sub")
    (copy / "sub").mkdir()
    refused(copy, r"sub is not a regular file")


def test_a_range_past_the_end_of_the_file_is_refused_before_reading(two):
    mine, _ = two
    size = os.path.getsize(mine / "__0_0.distcp")
    redirect(mine, "b.momenta", length=size * 4)
    message = refused(mine, rf"__0_0\.distcp has {size} bytes, \d+ expected: the file is truncated")
    assert "table 'b': 'b.momenta'" in message


@pytest.mark.parametrize("name", ["embcore_manifest.json", ".metadata"])
def test_the_manifest_and_the_metadata_must_be_regular_files(two, name):
    mine, _ = two
    os.remove(mine / name)
    os.symlink("/dev/zero", mine / name)
    refused(mine, re.escape(name) + " is a symbolic link")


def test_manifest_names_that_disagree_with_the_metadata_are_refused(two):
    """The manifest alone cannot point elsewhere: its chunk list must equal DCP's."""
    mine, _ = two
    document = manifest(mine)
    only_chunk(document, "a.weight")["file"] = "../theirs/__0_0.distcp"
    write_manifest(mine, document)
    refused(mine, r"DCP metadata and the manifest list different chunks for tables \['a'\]")
