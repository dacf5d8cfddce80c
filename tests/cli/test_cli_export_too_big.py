"""`embcore export` of a model whose tables are too big for one program (tables in
DiskStorage, or more rows than ``MAX_TABLE_BYTES``) says so in one message pointing to
serving from a lookup-only engine over disk tables, without reading the tables and without a
traceback; a model within the bound goes on to the ordinary export."""

from __future__ import annotations

import pytest
import torch

from embcore.cli import export
from embcore.cli.main import main
from embcore.errors import UserError
from embcore.train import bundle
from embcore.train.config import Config
from embcore.train.contract import vocab_sizes_for
from embcore.train.run_state import save_checkpoint


def checkpoint(tmp_path, overrides: list[str]):
    """A checkpoint of the main job's format whose config has ``overrides``; its tensors are
    a stand-in (the refusal reads the config alone)."""
    config = Config().with_overrides(overrides)
    path = tmp_path / "run" / "checkpoints" / "step-1.safetensors"
    path.parent.mkdir(parents=True)
    save_checkpoint(path, {"x": torch.zeros(1)}, {"config": config.to_dict(), "step": 1})
    return path, config


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (['model.storage="disk"', "model.cache_bytes=1000000"], 'model.storage="disk"'),
        (["data.vocab_cap=40000000", "model.embedding_dim=64"], "GiB"),
    ],
    ids=["disk", "size"],
)
def test_export_of_a_too_big_model_points_to_lookup_only_serving(
    tmp_path, capsys, overrides, reason
):
    path, config = checkpoint(tmp_path, overrides)
    out = tmp_path / "bundle"
    code = main(["export", "--run", str(tmp_path / "run"), "--checkpoint", str(path),
                 "--out", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "too big for one exported program" in err and reason in err
    assert "optimizer=None" in err and "DiskStorage" in err and "docs/disk_tables.md" in err
    assert not out.exists()
    if reason == "GiB":  # the bound, from the config alone
        size = 4 * sum(vocab_sizes_for(config)) * 64
        assert size > export.MAX_TABLE_BYTES
        assert f"{size / 2**30:.1f} GiB" in err


def test_a_model_within_the_bound_is_not_refused(tmp_path, capsys, monkeypatch):
    path, config = checkpoint(tmp_path, [])
    assert 4 * sum(vocab_sizes_for(config)) * config.model.embedding_dim <= export.MAX_TABLE_BYTES

    def reached(checkpoint):  # the ordinary export's first step: loading the model
        raise UserError(f"loading {checkpoint}")

    monkeypatch.setattr(bundle, "checkpoint_model", reached)
    code = main(["export", "--run", str(tmp_path / "run"), "--checkpoint", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and f"loading {path}" in err and "too big" not in err
