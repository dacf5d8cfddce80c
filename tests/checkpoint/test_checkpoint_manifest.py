"""``ec.checkpoint``: the manifest, atomic publication, and verification before loading.

Checksums are checked against ``hashlib`` over the raw file bytes (not embcore's own hashing);
every refused load is also checked to leave the engine exactly as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle

import pytest
import torch

import embcore as ec
from embcore.sharding import ShardingPlan, TableShard


def schedule() -> float:
    return 0.25


def make_engine(plan: ShardingPlan | None = None, vocab: int = 9) -> ec.EmbeddingEngine:
    a = ec.TableConfig(vocabulary_size=vocab, dim=4, name="a", combiner="sum")
    b = ec.TableConfig(
        vocabulary_size=6, dim=3, name="b", optimizer=ec.Adam(learning_rate=schedule)
    )
    features = {
        "x": ec.FeatureConfig(table=a),
        "y": ec.FeatureConfig(table=b, max_sequence_length=2),
        "z": ec.FeatureConfig(table=b),
    }
    return ec.EmbeddingEngine(
        features, ec.Adagrad(learning_rate=0.1, clipvalue=(-1.0, 2.0)), plan=plan, seed=5
    )


def trained(plan: ShardingPlan | None = None) -> ec.EmbeddingEngine:
    engine = make_engine(plan)
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        features = {
            "x": torch.randint(0, 9, (4,), generator=g),
            "y": ec.RaggedIds(torch.tensor([1, 5, 2]), torch.tensor([0, 2, 2, 3, 3])),
            "z": torch.randint(0, 6, (4,), generator=g),
        }
        acts = engine(features)
        sum((v * v).sum() for v in acts.values()).backward()
    return engine


def snapshot(engine: ec.EmbeddingEngine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.state_dict().items()}


def assert_unchanged(engine: ec.EmbeddingEngine, before: dict[str, torch.Tensor]) -> None:
    after = engine.state_dict()
    assert sorted(after) == sorted(before)
    for key, value in before.items():
        assert torch.equal(after[key], value), key


def chunk(manifest: dict, key: str) -> dict:
    (only,) = manifest["tensors"][key]["chunks"]
    return only


# -------------------------------------------------------------------------- the manifest
def test_the_manifest_records_configs_plan_and_a_checksum_per_chunk(tmp_path):
    engine = trained()
    ec.checkpoint.save(engine, tmp_path / "c")
    manifest = ec.checkpoint.read_manifest(tmp_path / "c")
    assert manifest["format"] == "embcore-checkpoint" and manifest["format_version"] == 1
    assert manifest["step"] == 2 and manifest["world_size"] == 1
    assert manifest["sharding"] == "single process"
    a, b = manifest["tables"]
    assert (a["name"], a["vocabulary_size"], a["dim"], a["combiner"]) == ("a", 9, 4, "sum")
    assert a["optimizer"]["type"] == "Adagrad"
    assert a["optimizer"]["hyperparameters"]["learning_rate"] == 0.1
    assert a["optimizer"]["hyperparameters"]["clipvalue"] == [-1.0, 2.0]
    assert a["initializer"] == "default" and a["features"] == ["x"]
    # a callable (a learning-rate schedule) is recorded by name only
    assert b["optimizer"]["hyperparameters"]["learning_rate"] == (
        "<callable test_checkpoint_manifest.schedule>"
    )
    assert b["features"] == ["y", "z"]
    assert manifest["features"][1] == {
        "name": "y",
        "table": "b",
        "max_sequence_length": 2,
        "output_shape": None,
    }
    assert sorted(manifest["tensors"]) == sorted(engine.state_dict())
    state = engine.state_dict()
    for key, entry in manifest["tensors"].items():
        assert entry["shape"] == list(state[key].shape)
        assert entry["dtype"] == str(state[key].dtype).removeprefix("torch.")
        for c in entry["chunks"]:
            data = (tmp_path / "c" / c["file"]).read_bytes()[
                c["offset"] : c["offset"] + c["length"]
            ]
            assert len(data) == c["length"] > 0
            assert hashlib.sha256(data).hexdigest() == c["sha256"], key
    metadata = (tmp_path / "c" / ".metadata").read_bytes()
    assert hashlib.sha256(metadata).hexdigest() == manifest["dcp_metadata_sha256"]
    assert ec.checkpoint.verify(tmp_path / "c") == manifest


def test_a_sharded_engine_records_its_plan(tmp_path):
    plan = ShardingPlan(
        world_size=1,
        tables={"a": TableShard.row_wise([0], "mod"), "b": TableShard.column_wise([0], 3)},
    )
    ec.checkpoint.save(trained(plan), tmp_path / "c")
    manifest = ec.checkpoint.verify(tmp_path / "c")
    assert manifest["sharding"] == plan.to_dict()
    assert manifest["engine"]["class"] == "ShardedEmbeddingEngine"
    plain = make_engine()
    ec.checkpoint.load(plain, tmp_path / "c")
    assert_unchanged(plain, snapshot(trained()))


# ------------------------------------------------------------------------------ atomic
def test_save_never_overwrites_and_clears_an_interrupted_save(tmp_path):
    engine = trained()
    ec.checkpoint.save(engine, tmp_path / "c")
    first = (tmp_path / "c" / "embcore_manifest.json").read_bytes()
    with pytest.raises(
        FileExistsError, match=r"c already exists; a checkpoint is never overwritten"
    ):
        ec.checkpoint.save(engine, tmp_path / "c")
    assert (tmp_path / "c" / "embcore_manifest.json").read_bytes() == first
    # What a killed save leaves: a .tmp directory, which the next save to that path clears.
    (tmp_path / "d.tmp").mkdir()
    (tmp_path / "d.tmp" / "__0_0.distcp").write_bytes(b"torn")
    with pytest.raises(FileNotFoundError, match=r"d.tmp is a save that did not finish"):
        ec.checkpoint.load(make_engine(), tmp_path / "d")
    ec.checkpoint.save(engine, tmp_path / "d")
    assert sorted(os.listdir(tmp_path)) == ["c", "d"]
    ec.checkpoint.verify(tmp_path / "d")
    (tmp_path / "empty").mkdir()  # an empty directory is fine to save into
    ec.checkpoint.save(engine, tmp_path / "empty")
    ec.checkpoint.verify(tmp_path / "empty")


def test_a_save_that_fails_before_the_rename_publishes_nothing(tmp_path, monkeypatch):
    from embcore.checkpoint import _manifest

    def disk_full(directory: str, manifest: dict) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_manifest, "write", disk_full)
    with pytest.raises(OSError, match="No space left"):
        ec.checkpoint.save(trained(), tmp_path / "c")
    assert sorted(os.listdir(tmp_path)) == []  # a failed save removes its temporary directory
    monkeypatch.undo()
    ec.checkpoint.save(trained(), tmp_path / "c")
    assert sorted(os.listdir(tmp_path)) == ["c"]


# -------------------------------------------------------------------------- verification
def test_a_corrupt_chunk_is_refused_naming_its_table(tmp_path):
    ec.checkpoint.save(trained(), tmp_path / "c")
    manifest = ec.checkpoint.read_manifest(tmp_path / "c")
    c = chunk(manifest, "b.momenta")
    path = tmp_path / "c" / c["file"]
    data = bytearray(path.read_bytes())
    at = c["offset"] + c["length"] - 40  # inside the stored tensor's bytes
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    found = hashlib.sha256(data[c["offset"] : c["offset"] + c["length"]]).hexdigest()
    engine = make_engine()
    before = snapshot(engine)
    with pytest.raises(ec.checkpoint.CheckpointError) as caught:
        ec.checkpoint.load(engine, tmp_path / "c")
    message = str(caught.value)
    assert "is corrupt, nothing was loaded: table 'b': 'b.momenta'[0:6, 0:3]" in message
    assert f"sha256 expected {c['sha256']}, found {found}" in message
    assert "'b.weight'" not in message and "table 'a'" not in message
    assert_unchanged(engine, before)
    with pytest.raises(ValueError, match=r"table 'b': 'b\.momenta'"):
        ec.checkpoint.verify(tmp_path / "c")


def test_a_truncated_file_is_refused(tmp_path):
    ec.checkpoint.save(trained(), tmp_path / "c")
    c = chunk(ec.checkpoint.read_manifest(tmp_path / "c"), "step")
    path = tmp_path / "c" / c["file"]
    path.write_bytes(path.read_bytes()[: os.path.getsize(path) // 2])
    engine = make_engine()
    before = snapshot(engine)
    with pytest.raises(ValueError, match=r"found unreadable \(.*is truncated\)"):
        ec.checkpoint.load(engine, tmp_path / "c")
    assert_unchanged(engine, before)


def test_metadata_that_does_not_match_the_manifest_is_never_unpickled(tmp_path):
    ec.checkpoint.save(trained(), tmp_path / "c")
    (tmp_path / "c" / ".metadata").write_bytes(pickle.dumps({"not": "dcp"}))
    with pytest.raises(ValueError, match=r"\.metadata does not match the manifest: sha256"):
        ec.checkpoint.load(make_engine(), tmp_path / "c")


class _Payload:
    """A pickle that would create a directory when unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[override]
        return (os.mkdir, (self.path,))


def test_metadata_with_code_is_refused_even_with_a_matching_manifest(tmp_path):
    """The manifest is no signature (whoever edits the files can edit it too); the restricted
    unpickler is what keeps a crafted .metadata from running code."""
    ec.checkpoint.save(trained(), tmp_path / "c")
    evil = pickle.dumps(_Payload(str(tmp_path / "pwned")))
    (tmp_path / "c" / ".metadata").write_bytes(evil)
    manifest_path = tmp_path / "c" / "embcore_manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["dcp_metadata_sha256"] = hashlib.sha256(evil).hexdigest()
    manifest_path.write_text(json.dumps(manifest))
    engine = make_engine()
    before = snapshot(engine)
    with pytest.raises(ValueError, match=r"posix\.mkdir is not part of DCP checkpoint metadata"):
        ec.checkpoint.load(engine, tmp_path / "c")
    assert not (tmp_path / "pwned").exists()
    assert_unchanged(engine, before)


def test_incomplete_or_foreign_directories_are_refused(tmp_path):
    ec.checkpoint.save(trained(), tmp_path / "c")
    manifest_path = tmp_path / "c" / "embcore_manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps(dict(manifest, format_version=2)))
    with pytest.raises(
        ValueError, match=r"has format_version 2; this embcore .* reads format_version 1"
    ):
        ec.checkpoint.load(make_engine(), tmp_path / "c")
    manifest_path.unlink()
    with pytest.raises(ValueError, match=r"has no embcore_manifest\.json: it is not a complete"):
        ec.checkpoint.load(make_engine(), tmp_path / "c")
    with pytest.raises(FileNotFoundError, match=r"no checkpoint at .*nowhere$"):
        ec.checkpoint.load(make_engine(), tmp_path / "nowhere")


def test_a_checkpoint_that_does_not_fit_names_the_table_and_both_sides(tmp_path):
    ec.checkpoint.save(trained(), tmp_path / "c")
    bigger = make_engine(vocab=12)
    before = snapshot(bigger)
    with pytest.raises(
        ValueError, match=r"table 'a': 'a\.weight' has shape \(9, 4\), the engine expects \(12, 4\)"
    ):
        ec.checkpoint.load(bigger, tmp_path / "c")
    assert_unchanged(bigger, before)
    other = ec.EmbeddingEngine(
        {"w": ec.FeatureConfig(table=ec.TableConfig(vocabulary_size=3, dim=2, name="w"))},
        ec.SGD(learning_rate=0.1),
    )
    with pytest.raises(
        ValueError, match=r"table 'w' is not in the checkpoint \(it has \['a', 'b'\]\)"
    ):
        ec.checkpoint.load(other, tmp_path / "c")


def test_verify_returns_a_short_result_that_still_reads_as_the_manifest(tmp_path):
    ec.checkpoint.save(trained(), tmp_path / "c")
    result = ec.checkpoint.verify(tmp_path / "c")
    manifest = json.loads((tmp_path / "c" / "embcore_manifest.json").read_text())
    assert isinstance(result, ec.checkpoint.Verified) and result.manifest == manifest
    assert result == manifest and dict(result) == manifest and result["step"] == manifest["step"]
    chunks = [c for t in manifest["tensors"].values() for c in t["chunks"]]
    assert result.chunks == len(chunks) and result.nbytes == sum(c["length"] for c in chunks)
    assert result.tables == [t["name"] for t in manifest["tables"]] and result.bases == 0
    text = repr(result)
    assert text.startswith(f"Verified({str(tmp_path / 'c')!r}: step {manifest['step']}, ")
    assert f"{len(manifest['tables'])} tables, {len(manifest['tensors'])} tensors in " in text
    assert text.endswith(", ok)") and len(text) < 200 and "sha256" not in text
