"""A serving bundle of a DLRM on dynamic tables: tables.safetensors holds each table's keys beside
its rows; the model embcore builds from them (no program file read) and model.pt2 (trusted)
both serve it with the model's own logits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import embcore as ec
from embcore._fingerprint import seal, sha256_file
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


def _config():
    """The run config of :func:`_dynamic_dlrm` (the bundle's model is rebuilt from it)."""
    model = ['model.tables="dynamic"', f"model.embedding_dim={DIM}", "model.bottom_mlp=[8]"]
    return load_config(
        None, ["data.eval_rows=300", "data.vocab_cap=50", *model, "model.top_mlp=[8]"]
    )


def test_a_dynamic_bundle_serves_from_its_tensors(tmp_path: Path, capsys) -> None:
    config = _config()
    model = _dynamic_dlrm()
    batches = list(rebatch(SyntheticSource(config.data).eval_set().batches, 150))
    model(batches[0].dense, batches[0].sparse).sum().backward()  # admits the first half's ids
    model.eval()
    out = export_bundle(model, config, tmp_path / "bundle", fmt="pt2")

    tables = load_file(out / "tables.safetensors")
    manifest = json.loads((out / "config.json").read_text())
    for name in SPARSE_NAMES:
        keys = model.engine.table_keys(name)
        assert torch.equal(tables[f"{name}.keys"], keys)
        assert torch.equal(tables[name], model.engine.table_rows(name, keys))
        assert manifest["tables"][name]["vocabulary_size"] is None
        assert manifest["tables"][name]["rows"] == keys.numel() > 0

    from_tensors = load_bundle(out)  # embcore's own model: no program file is read
    from_program = load_bundle(out, "pt2", trusted_program=True)
    for batch in batches:  # seen and unseen ids
        with torch.no_grad():
            want = model(batch.dense, batch.sparse)
        assert torch.equal(from_tensors(batch.dense, batch.sparse), want)
        assert torch.equal(from_program(batch.dense, batch.sparse), want)
    # the same batches: a matrix product's rounding may depend on the number of rows
    for extra in ([], ["--format", "pt2", "--trusted-program"]):
        scores = tmp_path / f"s{len(extra)}.npy"
        args = ["predict", "--bundle", str(out), "--batch-size", "150", "--output", str(scores)]
        assert main([*args, *extra]) == 0
        with torch.no_grad():
            want = torch.cat([model(b.dense, b.sparse) for b in batches]).numpy()
        np.testing.assert_array_equal(np.load(scores), want)


def test_a_dynamic_bundle_without_its_program_serves(tmp_path: Path) -> None:
    config = _config()
    model = _dynamic_dlrm()
    batch = next(iter(rebatch(SyntheticSource(config.data).eval_set().batches, 150)))
    model(batch.dense, batch.sparse).sum().backward()
    model.eval()
    out = export_bundle(model, config, tmp_path / "bundle")  # safetensors only
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "dense.safetensors",
        "tables.safetensors",
    ]
    with torch.no_grad():
        assert torch.equal(
            load_bundle(out)(batch.dense, batch.sparse), model(batch.dense, batch.sparse)
        )


def _crafted(good: Path, out: Path, tables=None, dense=None, manifest=None) -> Path:
    """A copy of ``good`` with its tensors or ``config.json`` edited, resealed (every sha256
    matches: what a crafted bundle looks like)."""
    shutil.copytree(good, out)
    doc = json.loads((out / "config.json").read_text())
    doc.pop("sha256")
    for name, edit in (("tables", tables), ("dense", dense)):
        if edit is not None:
            tensors = load_file(out / f"{name}.safetensors")
            edit(tensors)
            save_file(tensors, out / f"{name}.safetensors")
        doc["files_sha256"][f"{name}.safetensors"] = sha256_file(out / f"{name}.safetensors")
    if manifest is not None:
        manifest(doc)
    (out / "config.json").write_text(json.dumps(seal(doc)))
    return out


def _descending(t):
    t["C1.keys"] = t["C1.keys"].flip(0).contiguous()


def _duplicate(t):
    t["C1.keys"][1] = t["C1.keys"][0]


def _short(t):
    t["C1"] = t["C1"][:-1].contiguous()


def _int32(t):
    t["C1.keys"] = t["C1.keys"].int()


def _bias(t):
    t["bottom.0.bias"] = torch.zeros(3, 3)


def _rows(m):
    m["tables"]["C1"]["rows"] += 1


def _huge(m):
    m["config"]["model"]["bottom_mlp"] = [10**9]


CRAFTED = [
    ("keys descending", {"tables": _descending}, r"table 'C1': keys must be strictly ascending"),
    ("a key twice", {"tables": _duplicate}, r"table 'C1': keys must be strictly ascending"),
    ("a row short", {"tables": _short}, r"table 'C1': rows must be \(\d+, 4\) float32"),
    ("int32 keys", {"tables": _int32}, r"table 'C1': keys must be \(R,\) int64"),
    ("rows recorded", {"manifest": _rows}, r"table 'C1' holds \d+ keys, config.json records"),
    ("a dense weight", {"dense": _bias}, r"dense.safetensors: 'bottom.0.bias' is torch.float32"),
    ("a huge MLP", {"manifest": _huge}, r"the dense layers .* need at least 1,609.3 GiB"),
]


@pytest.fixture(scope="module")
def dynamic_bundle(tmp_path_factory) -> Path:
    config = _config()
    model = _dynamic_dlrm()
    batch = next(iter(rebatch(SyntheticSource(config.data).eval_set().batches, 150)))
    model(batch.dense, batch.sparse).sum().backward()
    return export_bundle(model.eval(), config, tmp_path_factory.mktemp("d") / "bundle")


@pytest.mark.parametrize(("case", "edit", "message"), CRAFTED, ids=[c for c, _, _ in CRAFTED])
def test_a_crafted_dynamic_bundle_is_one_clear_error(
    dynamic_bundle, tmp_path, capsys, case, edit, message
):
    bad = _crafted(dynamic_bundle, tmp_path / "bad", **edit)
    with pytest.raises(ValueError, match=message):
        load_bundle(bad)
    capsys.readouterr()
    assert main(["predict", "--bundle", str(bad), "--rows", "8"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1 and str(bad) in err, err
