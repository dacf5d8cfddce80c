"""Serving never runs code a bundle carries: a real bundle's ``model.pt2`` with a planted
pickle (or a pickle-free archive with Python in a shape expression), resealed so that every
sha256 in ``config.json`` matches, is refused before anything of it is read unless the caller
says it trusts the program; the default serving path never opens the program at all."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from embcore._fingerprint import seal, sha256_file
from embcore.cli.main import main
from embcore.data.batch import capped_vocab_sizes, rebatch
from embcore.errors import UserError
from embcore.train.bundle import export_bundle, load_bundle
from embcore.train.config import load_config
from embcore.train.model import build_model
from embcore.train.sources import SyntheticSource

TINY = [
    "data.eval_rows=64",
    "data.vocab_cap=40",
    "model.embedding_dim=4",
    "model.bottom_mlp=[8]",
    "model.top_mlp=[8]",
]


class _Plant:
    """Unpickling it creates the directory ``path`` (what a real attacker's payload would do)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (os.mkdir, (self.path,))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """A real bundle with its ``model.pt2`` (an untrained tiny DLRM)."""
    config = load_config(None, TINY)
    model = build_model(
        config.model, capped_vocab_sizes(config.data.vocab_cap), optimizer=None, seed=0
    )
    return export_bundle(model, config, tmp_path_factory.mktemp("b") / "bundle", fmt="pt2")


def _tampered(bundle: Path, out: Path, edit) -> Path:
    """A copy of ``bundle`` whose ``model.pt2`` entries went through ``edit(name, data)``,
    resealed: ``config.json`` records the new program's sha256 and its own."""
    out.mkdir()
    for f in bundle.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    with (
        zipfile.ZipFile(bundle / "model.pt2") as src,
        zipfile.ZipFile(out / "model.pt2", "w") as dst,
    ):
        for info in src.infolist():
            dst.writestr(info, edit(info.filename, src.read(info.filename)))
    manifest = json.loads((out / "config.json").read_text())
    manifest.pop("sha256")
    manifest["files_sha256"]["model.pt2"] = sha256_file(out / "model.pt2")
    (out / "config.json").write_text(json.dumps(seal(manifest), indent=2))
    return out


def _pickled_example_inputs(marker: Path):
    def edit(name: str, data: bytes) -> bytes:
        return pickle.dumps(_Plant(marker)) if name.endswith("sample_inputs/model.pt") else data

    return edit


def _python_in_a_shape(marker: Path):
    """No pickled entry left (the example inputs emptied); a symbolic size of the graph's
    JSON becomes Python, which ``torch.export.load`` hands to ``sympy.sympify`` (``eval``)."""

    def edit(name: str, data: bytes) -> bytes:
        if name.endswith("sample_inputs/model.pt"):
            return b""
        if name.endswith("models/model.json"):
            text = data.decode()
            symbol = text.index("Symbol(")  # the batch dimension's expression
            payload = f"__import__('pathlib').Path({str(marker)!r}).touch() or "
            return (text[:symbol] + payload + text[symbol:]).encode()
        return data

    return edit


@pytest.mark.parametrize("plant", [_pickled_example_inputs, _python_in_a_shape])
def test_a_tampered_program_is_refused_before_it_is_read(bundle, tmp_path, capsys, plant):
    marker = tmp_path / "the-payload-ran"
    bad = _tampered(bundle, tmp_path / "bad", plant(marker))
    for fmt in ("pt2", "aoti"):
        with pytest.raises(
            UserError, match=r"model(\.aoti)?\.pt2: not loaded: .*--trusted-program"
        ):
            load_bundle(bad, fmt)
        capsys.readouterr()
        assert main(["predict", "--bundle", str(bad), "--format", fmt]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.count("\n") == 1 and "--trusted-program" in err
    assert not marker.exists()
    # the default serving path reads tensors and JSON only: it serves, the payload stays inert
    config = load_config(None, TINY)
    batch = next(iter(rebatch(SyntheticSource(config.data).eval_set().batches, 16)))
    served = load_bundle(bad)
    assert served(batch.dense, batch.sparse).shape == (16,)
    assert main(["predict", "--bundle", str(bad), "--rows", "16"]) == 0
    assert not marker.exists()
    # the plant is live: trusting the program runs it (torch.export.load's own behaviour)
    with contextlib.suppress(Exception):  # PyTorch may fail after running the payload
        load_bundle(bad, "pt2", trusted_program=True)
    assert marker.exists()


def test_a_trusted_program_serves_the_same_scores(bundle) -> None:
    config = load_config(None, TINY)
    batch = next(iter(rebatch(SyntheticSource(config.data).eval_set().batches, 32)))
    want = load_bundle(bundle)(batch.dense, batch.sparse)
    got = load_bundle(bundle, "pt2", trusted_program=True)(batch.dense, batch.sparse)
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["config.json", "tables.safetensors", "dense.safetensors"])
def test_predict_refuses_a_fifo_in_a_bundle_without_waiting(bundle, tmp_path, name) -> None:
    """``predict`` used to read its bundle's files with plain ``open`` before checking them:
    a FIFO there blocked it for ever. A real subprocess, bounded in time."""
    bad = tmp_path / "bad"
    shutil.copytree(bundle, bad)
    (bad / name).unlink()
    os.mkfifo(bad / name)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-m", "embcore.cli.main", "predict", "--bundle", str(bad)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"{bad / name} is not a regular file" in done.stderr
