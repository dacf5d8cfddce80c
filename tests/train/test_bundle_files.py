"""Serving bundles: ``config.json`` holds the sha256 of both tensor files and of itself, so a
flipped bit, a truncated file or files of two exports mixed are refused, naming the file; an
export that fails or is killed half-way leaves the previous bundle intact."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
from pathlib import Path

import pytest

from embcore._fingerprint import IntegrityError
from embcore.train import bundle
from embcore.train.bundle import export_checkpoint, load_bundle
from embcore.train.config import Config
from embcore.train.loop import train
from embcore.train.run_state import list_checkpoints


@pytest.fixture
def run(tiny: Config) -> list[Path]:
    """The checkpoints (steps 4, 8, 12) of a tiny run."""
    train(tiny, echo=lambda _: None)
    return [p for _, p in list_checkpoints(Path(tiny.train.out_dir) / "checkpoints")]


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_corrupt_truncated_or_mixed_bundles_are_refused(run, tmp_path):
    out = export_checkpoint(run[-1], tmp_path / "b")
    load_bundle(out)
    for name in ("tables.safetensors", "dense.safetensors"):
        copy = tmp_path / f"flip-{name}"
        shutil.copytree(out, copy)
        flip(copy / name, -3)  # a weight's byte: safetensors alone would load it
        with pytest.raises(IntegrityError, match=rf"{copy / name} does not match the sha256"):
            load_bundle(copy)
        cut = tmp_path / f"cut-{name}"
        shutil.copytree(out, cut)
        (cut / name).write_bytes((cut / name).read_bytes()[:-100])
        with pytest.raises(IntegrityError, match=rf"{cut / name} does not match the sha256"):
            load_bundle(cut)

    edited = tmp_path / "edited"
    shutil.copytree(out, edited)
    manifest = json.loads((edited / "config.json").read_text())
    manifest["preprocessing"]["dense"] = "x"
    (edited / "config.json").write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match=r"config\.json is corrupt: its content does not"):
        load_bundle(edited)

    linked = tmp_path / "linked"  # a tensor file that is a link to an endless device
    shutil.copytree(out, linked)
    os.remove(linked / "dense.safetensors")
    os.symlink("/dev/zero", linked / "dense.safetensors")
    with pytest.raises(FileNotFoundError, match=r"dense\.safetensors is missing"):
        load_bundle(linked)  # not a regular file: never opened
    os.remove(linked / "dense.safetensors")
    os.symlink(out / "dense.safetensors", linked / "dense.safetensors")
    with pytest.raises(ValueError, match=r"dense\.safetensors is a symbolic link"):
        load_bundle(linked)

    # A kill between the files of two exports could leave tables of step 8 beside dense
    # weights and a config of step 12: refused.
    older = export_checkpoint(run[-2], tmp_path / "older")
    mixed = tmp_path / "mixed"
    shutil.copytree(out, mixed)
    shutil.copy(older / "tables.safetensors", mixed / "tables.safetensors")
    with pytest.raises(IntegrityError, match=r"mixed/tables\.safetensors does not match"):
        load_bundle(mixed)


def test_an_export_that_fails_half_way_keeps_the_previous_bundle(run, tmp_path, monkeypatch):
    tmp_path = tmp_path / "exports"  # (the run is in tmp_path/run)
    out = export_checkpoint(run[0], tmp_path / "b")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = []

    def killed(*args, **kwargs):  # the second file is never written
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return save_file(*args, **kwargs)

    save_file = bundle.save_file
    monkeypatch.setattr(bundle, "save_file", killed)
    with pytest.raises(KeyboardInterrupt):
        export_checkpoint(run[-1], out)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["b"]  # no temporary directory left
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert load_bundle(out).manifest["step"] == 4

    # A SIGKILL leaves its temporary directory: the bundle is untouched and the next export
    # removes the leftover.
    leftover = tmp_path / "b.tmp-killed"
    leftover.mkdir()
    (leftover / "tables.safetensors").write_bytes(b"half")
    assert load_bundle(out).manifest["step"] == 4
    export_checkpoint(run[-1], out)
    assert sorted(os.listdir(tmp_path)) == ["b"]
    assert load_bundle(out).manifest["step"] == 12


def test_an_export_never_replaces_a_directory_of_other_files(run, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match=r"mine is a non-empty directory without config"):
        export_checkpoint(run[-1], mine)
    assert os.listdir(mine) == ["notes.txt"]


def _export_killed_after_the_first_file(checkpoint: str, out: str) -> None:
    from embcore.train import bundle

    save_file = bundle.save_file

    def then_die(*args, **kwargs):
        save_file(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, as kill -9 or an OOM kill

    bundle.save_file = then_die
    bundle.export_checkpoint(checkpoint, out)


@pytest.mark.multiprocess
def test_an_export_sigkilled_half_way_keeps_the_previous_bundle(run, tmp_path):
    out = tmp_path / "exports" / "b"
    export_checkpoint(run[0], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "embcore.train.bundle"])
    child = ctx.Process(target=_export_killed_after_the_first_file, args=(str(run[-1]), str(out)))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL
    left = sorted(os.listdir(out.parent))
    assert left[0] == "b" and len(left) == 2 and left[1].startswith("b.tmp-"), left
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert load_bundle(out).manifest["step"] == 4
    export_checkpoint(run[-1], out)  # removes the dead export's directory
    assert os.listdir(out.parent) == ["b"] and load_bundle(out).manifest["step"] == 12
