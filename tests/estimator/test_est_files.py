"""Estimator directories: checksums verified on read (a flipped bit, a truncated or mixed
directory is refused, naming the file), and a ``checkpoint.json`` pointer that can name
nothing outside ``model_dir`` (nothing outside is read or deleted)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from embcore._fingerprint import IntegrityError
from embcore.estimator import model_dir as io


def tensors(step: int) -> dict[str, torch.Tensor]:
    return {"engine/a.weight": torch.full((4, 3), float(step)), "engine/step": torch.tensor(step)}


def write(model_dir: Path, step: int, keep: int = 3) -> Path:
    return io.write_checkpoint(model_dir, step, tensors(step), {"global_step": step}, keep)


def test_a_checkpoint_round_trips_and_corruption_is_refused(tmp_path):
    path = write(tmp_path, 2)
    got, meta = io.read_directory(path, "checkpoint")
    assert meta["global_step"] == 2 and torch.equal(
        got["engine/a.weight"], tensors(2)["engine/a.weight"]
    )
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.json", "ckpt-2"]

    flipped = tmp_path / "flipped"
    shutil.copytree(path, flipped)
    data = bytearray((flipped / "tensors.safetensors").read_bytes())
    data[-2] ^= 0x01
    (flipped / "tensors.safetensors").write_bytes(bytes(data))
    with pytest.raises(
        IntegrityError, match=r"flipped/tensors\.safetensors is missing or does not"
    ):
        io.read_directory(flipped, "checkpoint")

    mixed = tmp_path / "mixed"  # the tensors of another save beside this meta.json
    shutil.copytree(path, mixed)
    shutil.copy(write(tmp_path, 4) / "tensors.safetensors", mixed / "tensors.safetensors")
    with pytest.raises(IntegrityError, match=r"mixed/tensors\.safetensors is missing or does not"):
        io.read_directory(mixed, "checkpoint")

    edited = tmp_path / "edited"
    shutil.copytree(path, edited)
    meta_json = json.loads((edited / "meta.json").read_text())
    meta_json["global_step"] = 9
    (edited / "meta.json").write_text(json.dumps(meta_json))
    with pytest.raises(IntegrityError, match=r"edited/meta\.json is corrupt"):
        io.read_directory(edited, "checkpoint")

    (edited / "meta.json").write_text('{"format": "embcore.estimator", "ver')
    with pytest.raises(IntegrityError, match=r"edited/meta\.json is not valid JSON"):
        io.read_directory(edited, "checkpoint")


@pytest.mark.parametrize(
    "name",
    ["../victim", "/tmp/victim", "ckpt-1/../../victim", "victim", "ckpt-1/..", "", 3, None],
)
def test_a_pointer_naming_anything_else_is_refused_before_anything_is_deleted(tmp_path, name):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("x")
    model_dir = tmp_path / "model"
    write(model_dir, 1)
    pointer = model_dir / "checkpoint.json"
    pointer.write_text(json.dumps({"latest": "ckpt-1", "all": [name, "ckpt-1"]}))
    with pytest.raises(ValueError, match=r"checkpoint\.json: refusing the checkpoint name"):
        write(model_dir, 2, keep=1)
    with pytest.raises(ValueError, match=r"refusing the checkpoint name"):
        io.latest_checkpoint(model_dir)
    assert (victim / "precious").read_text() == "x"
    assert sorted(os.listdir(model_dir)) == ["checkpoint.json", "ckpt-1"]  # nothing written


def test_a_malformed_pointer_or_a_linked_checkpoint_is_refused(tmp_path):
    write(tmp_path / "m", 1)
    pointer = tmp_path / "m" / "checkpoint.json"
    pointer.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"checkpoint\.json is not a checkpoint pointer"):
        io.latest_checkpoint(tmp_path / "m")
    outside = write(tmp_path / "other", 7)
    pointer.write_text(json.dumps({"latest": "ckpt-7", "all": ["ckpt-7"]}))
    os.symlink(outside, tmp_path / "m" / "ckpt-7")
    with pytest.raises(ValueError, match=r"ckpt-7 is a symbolic link"):
        io.latest_checkpoint(tmp_path / "m")


def test_retention_deletes_only_its_own_old_checkpoints(tmp_path):
    for step in (1, 2, 3, 4):
        write(tmp_path, step, keep=2)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.json", "ckpt-3", "ckpt-4"]
    assert json.loads((tmp_path / "checkpoint.json").read_text()) == {
        "latest": "ckpt-4",
        "all": ["ckpt-3", "ckpt-4"],
    }


def test_linked_or_special_files_are_refused_without_reading_them(tmp_path):
    path = write(tmp_path / "m", 1)
    os.rename(path / "meta.json", tmp_path / "meta.json")
    os.symlink("/dev/zero", path / "meta.json")  # reading it would never end
    with pytest.raises(ValueError, match=r"ckpt-1' is not an embcore checkpoint: no meta\.json"):
        io.read_directory(path, "checkpoint")
    os.remove(path / "meta.json")
    os.mkfifo(path / "meta.json")  # opening it for reading would block without a writer
    with pytest.raises(ValueError, match=r"ckpt-1' is not an embcore checkpoint: no meta\.json"):
        io.read_directory(path, "checkpoint")
    os.remove(path / "meta.json")
    os.symlink(tmp_path / "meta.json", path / "meta.json")  # the right content, elsewhere
    with pytest.raises(ValueError, match=r"meta\.json is a symbolic link"):
        io.read_directory(path, "checkpoint")
    pointer = tmp_path / "m" / "checkpoint.json"
    elsewhere = tmp_path / "elsewhere.json"
    pointer.rename(elsewhere)
    os.symlink(elsewhere, pointer)
    with pytest.raises(ValueError, match=r"checkpoint\.json is a symbolic link"):
        io.latest_checkpoint(tmp_path / "m")
