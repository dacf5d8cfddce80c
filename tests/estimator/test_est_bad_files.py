"""An Estimator's files damaged every way (the checkpoint list, every file of the newest
checkpoint, every file of an export): a ``UserError`` naming the file, not a traceback from
deep inside a reader; whatever the checkpoint layout, each file it holds is damaged in turn."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import embcore.feature_column as fc
from embcore.errors import UserError
from embcore.estimator import Estimator, EstimatorSpec

KINDS = ["empty", "truncated", "binary", "directory", "other_kind"]


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.optimizer = torch.optim.SGD(self.linear.parameters(), lr=0.1)

    def forward(self, features, labels=None):
        x = fc.DenseFeatures([column()])(features)
        out = self.linear(x).squeeze(1)
        loss = ((out - labels) ** 2).mean() if labels is not None else None
        return EstimatorSpec("train" if labels is not None else "infer", out, loss, self.optimizer)


def column():
    return fc.embedding_column(fc.categorical_column_with_identity("v", 6), 2)


def estimator(model_dir: Path) -> Estimator:
    spec = fc.EmbeddingConfigSpec(
        feature_columns=[column()], optimization_parameters=fc.AdagradParameters(0.1)
    )
    return Estimator(Head(), model_dir, spec)


def batches():
    return [({"v": torch.tensor([1, 2, 3])}, torch.tensor([0.0, 1.0, 0.5]))] * 2


def _damage(path: Path, kind: str) -> None:
    valid = path.read_bytes() if path.is_file() else b"x" * 64
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    if kind == "directory":
        path.mkdir()
        return
    content = {
        "empty": b"",
        "truncated": valid[: len(valid) // 2],
        "binary": np.random.default_rng(3).bytes(512),
        "other_kind": b"\x89PNG\r\n\x1a\n" + b"\0" * 32,
    }[kind]
    path.write_bytes(content)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("est")
    est = estimator(root / "model")
    est.train(lambda: batches())
    est.export(root / "export")
    return root


def _files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def test_every_damaged_checkpoint_file_is_named(trained: Path, tmp_path: Path) -> None:
    model = trained / "model"
    newest = estimator(model).latest_checkpoint()
    assert newest is not None
    targets = ["checkpoint.json"] + [
        str(newest.relative_to(model) / name) for name in _files(newest)
    ]
    assert len(targets) >= 3
    cases = 0
    for name in targets:
        for kind in KINDS:
            copy = tmp_path / f"case{cases}"
            shutil.copytree(model, copy)
            _damage(copy / name, kind)
            with pytest.raises(UserError) as info:
                estimator(copy).train(lambda: batches())
            where = str(copy / name)
            message = str(info.value)
            # the file, or the checkpoint directory holding it, is named
            assert where in message or str(copy / Path(name).parent) in message, (name, kind)
            cases += 1
    assert cases == len(targets) * len(KINDS)


def test_every_damaged_export_file_is_named(trained: Path, tmp_path: Path) -> None:
    export = trained / "export"
    for name in _files(export):
        for kind in KINDS:
            copy = tmp_path / f"{name}-{kind}"
            shutil.copytree(export, copy)
            _damage(copy / name, kind)
            with pytest.raises(UserError, match=str(copy)):
                Estimator.from_export(copy, Head())
    with pytest.raises(UserError, match=r"no such file|not an embcore export"):
        Estimator.from_export(tmp_path / "nowhere", Head())
