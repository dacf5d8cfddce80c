"""A serving bundle of a DLRM on dynamic tables: tables.safetensors holds each table's keys beside
its rows, model.pt2 serves it with the model's own logits, and the safetensors form (which
rebuilds fixed-size tables) refuses it with a message naming the way that works."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import embcore as ec
from embcore.cli.main import main
from embcore.data.batch import NUM_DENSE, SPARSE_NAMES, rebatch
from embcore.models import DLRM, DotInteraction
from embcore.train.bundle import export_bundle, load_bundle
from embcore.train.config import load_config
from embcore.train.sources import SyntheticSource

DIM = 4


def _dynamic_dlrm() -> DLRM:
    tables = {n: ec.TableConfig(vocabulary_size=None, dim=DIM, name=n) for n in SPARSE_NAMES}
    engine = ec.EmbeddingEngine(
        {n: ec.FeatureConfig(t, name=n) for n, t in tables.items()},
        optimizer=ec.Adagrad(learning_rate=0.1),
    )
    return DLRM(
        engine=engine,
        sparse_names=SPARSE_NAMES,
        num_dense=NUM_DENSE,
        bottom=[8],
        top=[8],
        interaction=DotInteraction(len(SPARSE_NAMES), DIM),
    )


def test_a_dynamic_bundle_serves_from_its_program(tmp_path: Path, capsys) -> None:
    config = load_config(None, ["data.eval_rows=300", "data.vocab_cap=50"])
    model = _dynamic_dlrm()
    batches = list(rebatch(SyntheticSource(config.data).eval_set().batches, 150))
    model(batches[0].dense, batches[0].sparse).sum().backward()  # admits the first half's ids
    model.eval()
    with pytest.raises(ValueError, match=r"are dynamic: .* export with --format pt2"):
        export_bundle(model, config, tmp_path / "bundle")  # the safetensors form could not serve
    assert not (tmp_path / "bundle").exists()
    out = export_bundle(model, config, tmp_path / "bundle", fmt="pt2")

    tables = load_file(out / "tables.safetensors")
    manifest = json.loads((out / "config.json").read_text())
    for name in SPARSE_NAMES:
        keys = model.engine.table_keys(name)
        assert torch.equal(tables[f"{name}.keys"], keys)
        assert torch.equal(tables[name], model.engine.table_rows(name, keys))
        assert manifest["tables"][name]["vocabulary_size"] is None
        assert manifest["tables"][name]["rows"] == keys.numel() > 0

    serving = load_bundle(out, "pt2")
    for batch in batches:  # seen and unseen ids
        with torch.no_grad():
            assert torch.equal(serving(batch.dense, batch.sparse), model(batch.dense, batch.sparse))
    with pytest.raises(
        ValueError,
        match=r"dynamic tables \(C1, C10, C11 and 23 more\) hold keys and rows.*--format pt2",
    ):
        load_bundle(out)
    # the same batches: a matrix product's rounding may depend on the number of rows
    assert main(["predict", "--bundle", str(out), "--format", "pt2", "--batch-size", "150",
                 "--output", str(tmp_path / "s.npy")]) == 0  # fmt: skip
    with torch.no_grad():
        want = torch.cat([model(b.dense, b.sparse) for b in batches]).numpy()
    np.testing.assert_array_equal(np.load(tmp_path / "s.npy"), want)
    capsys.readouterr()
    assert main(["predict", "--bundle", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "serve this bundle from its program, --format pt2" in err
