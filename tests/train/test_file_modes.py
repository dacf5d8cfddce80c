"""One file-mode policy for everything a run writes: what the umask gives any new file
(``0o666 & ~umask``, directories ``0o777 & ~umask``), so a team's shared run directory
(umask 002) is group-writable and a private one (umask 077) stays private."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import embcore as ec
from embcore.train.bundle import export_checkpoint
from embcore.train.config import Config
from embcore.train.loop import train
from embcore.train.run_state import list_checkpoints


@pytest.fixture(params=[0o002, 0o077])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]
    }


def test_runs_bundles_checkpoints_and_statistics_follow_the_umask(
    tiny: Config, tmp_path: Path, umask: int
) -> None:
    cfg = tiny.with_overrides(["train.steps=4", "train.plot=true"])
    train(cfg, echo=lambda _: None)
    out = Path(cfg.train.out_dir)
    (_, newest), *_ = reversed(list_checkpoints(out / "checkpoints"))
    export_checkpoint(newest, tmp_path / "bundle")
    engine = ec.EmbeddingEngine(
        {"f": ec.FeatureConfig(table=ec.TableConfig(vocabulary_size=5, dim=2, name="t"))},
        optimizer=ec.SGD(0.1),
        profile_data_directory=str(tmp_path / "prof"),
        profile_sample_rate=1.0,
    )
    engine({"f": torch.tensor([1, 2])})
    engine.write_statistics()
    ec.checkpoint.save(engine, tmp_path / "ckpt")
    want_file, want_dir = 0o666 & ~umask, 0o777 & ~umask
    written = {}
    for root in (out, tmp_path / "bundle", tmp_path / "prof", tmp_path / "ckpt"):
        written.update({f"{root.name}/{k}": v for k, v in _modes(root).items()})
    files = [k for k in written if (tmp_path / k).is_file()]
    assert any(k.endswith(".safetensors") for k in files) and len(files) > 8, written
    bad = {k: oct(v) for k, v in written.items() if v != (want_file if k in files else want_dir)}
    assert not bad, f"umask {oct(umask)}: want {oct(want_file)} / {oct(want_dir)}, got {bad}"
