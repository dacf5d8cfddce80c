"""``embcore export --format pt2`` + ``embcore predict --format pt2``: the exported program gives
the safetensors bundle's scores bit for bit, serves with PyTorch alone (embcore unimportable),
and a missing or damaged program is one clear line, exit status 2, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embcore.cli.main import main
from embcore.data.batch import rebatch
from embcore.train.config import Config, load_config
from embcore.train.loop import train
from embcore.train.sources import SyntheticSource

TINY = [
    "data.vocab_cap=300",
    "data.batch_size=64",
    "data.eval_rows=1500",
    "model.embedding_dim=4",
    "model.bottom_mlp=[8]",
    "model.top_mlp=[16]",
    "optim.warmup_steps=2",
    "train.steps=4",
    "train.eval_every=4",
    "train.checkpoint_every=4",
    "train.progress=false",
    "train.plot=false",
]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    """A tiny trained run exported with --format pt2."""
    run = tmp_path_factory.mktemp("pt2") / "run"
    train(load_config(None, [*TINY, f"train.out_dir={run}"]), echo=lambda _: None)
    assert main(["export", "--run", str(run), "--format", "pt2"]) == 0
    return run / "export"


def _predict(bundle: Path, out: Path, *extra: str) -> np.ndarray:
    args = ["predict", "--bundle", str(bundle), "--batch-size", "700", "--output", str(out)]
    assert main([*args, *extra]) == 0
    return np.load(out)


def test_pt2_scores_equal_the_safetensors_bundles(bundle: Path, tmp_path: Path, capsys) -> None:
    assert sorted(p.name for p in bundle.iterdir()) == [
        "config.json",
        "dense.safetensors",
        "model.pt2",
        "tables.safetensors",
    ]
    manifest = json.loads((bundle / "config.json").read_text())
    assert manifest["programs"]["pt2"]["file"] == "model.pt2"
    assert "model.pt2" in manifest["files_sha256"]
    capsys.readouterr()
    want = _predict(bundle, tmp_path / "a.npy")
    got = _predict(bundle, tmp_path / "b.npy", "--format", "pt2", "--trusted-program")
    assert got.shape == (1500,)  # batches of 700, 700 and 100: one program for every size
    np.testing.assert_array_equal(got, want)  # the same operations: the same bits
    out = capsys.readouterr().out
    assert f"with {bundle / 'model.pt2'}" in out and "rows/s" in out


def test_the_program_serves_with_pytorch_alone(bundle: Path, tmp_path: Path) -> None:
    want = _predict(bundle, tmp_path / "a.npy", "--rows", "40")
    rows = tmp_path / "rows.npz"
    config = Config.from_dict(json.loads((bundle / "config.json").read_text())["config"])
    batch = next(iter(rebatch(SyntheticSource(config.data).eval_set().batches, 40)))
    np.savez(rows, dense=batch.dense.numpy(), sparse=batch.sparse.numpy())
    script = f"""
import sys
sys.modules["embcore"] = sys.modules["numba"] = None  # importing either now fails
import numpy as np, torch
rows = np.load({str(rows)!r})
program = torch.export.load({str(bundle / "model.pt2")!r}).module()
with torch.no_grad():
    logits = program(torch.from_numpy(rows["dense"]), torch.from_numpy(rows["sparse"]))
np.save({str(tmp_path / "alone.npy")!r}, logits.numpy())
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    np.testing.assert_array_equal(np.load(tmp_path / "alone.npy"), want)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


def test_a_bundle_without_the_program_says_how_to_get_it(bundle, tmp_path, capsys) -> None:
    plain = tmp_path / "plain"
    assert main(["export", "--run", str(bundle.parent), "--out", str(plain)]) == 0
    capsys.readouterr()
    assert main(["predict", "--bundle", str(plain), "--format", "pt2", "--trusted-program"]) == 2
    err = _one_line_error(capsys)
    assert f"{plain / 'model.pt2'}: missing" in err and "embcore export --format pt2" in err
    assert main(["predict", "--bundle", str(plain), "--format", "aoti", "--trusted-program"]) == 2
    assert "model.aoti.pt2: missing" in _one_line_error(capsys)


def test_a_damaged_program_is_named(bundle: Path, tmp_path: Path, capsys) -> None:
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for f in bundle.iterdir():
        (damaged / f.name).write_bytes(f.read_bytes())
    program = damaged / "model.pt2"
    data = bytearray(program.read_bytes())
    data[len(data) // 2] ^= 0xFF
    program.write_bytes(bytes(data))
    assert main(["predict", "--bundle", str(damaged), "--format", "pt2", "--trusted-program"]) == 2
    err = _one_line_error(capsys)
    assert f"{program} does not match the sha256 in config.json" in err
    program.write_bytes(b"")
    assert main(["predict", "--bundle", str(damaged), "--format", "pt2", "--trusted-program"]) == 2
    assert str(program) in _one_line_error(capsys)
    with pytest.raises(SystemExit) as exit_info:  # argparse: one usage line, status 2
        main(["predict", "--bundle", str(damaged), "--format", "onnx"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'onnx'" in capsys.readouterr().err


def test_aoti_without_a_compiler_is_one_line_and_writes_nothing(bundle, tmp_path, capsys):
    from torch._inductor import config

    out = tmp_path / "aoti"
    # Inductor's own patch restores its config (monkeypatch's undo deletes the entry)
    with config.patch({"cpp.cxx": (None, "/nonexistent/g++")}):
        code = main(["export", "--run", str(bundle.parent), "--out", str(out), "--format", "aoti"])
    assert code == 2
    err = _one_line_error(capsys)
    assert "no working C++ compiler (tried '/nonexistent/g++')" in err and "--format pt2" in err
    assert not out.exists()
