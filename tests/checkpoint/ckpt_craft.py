"""Shared by the checkpoint tests: a small trained engine, and tools to craft checkpoints
(edit the manifest or DCP's ``.metadata`` and keep their checksums consistent, as an attacker
who can write the files would)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
from pathlib import Path
from typing import Any

import torch

import embcore as ec

KEYS = ["a.accumulators", "a.weight", "b.momenta", "b.velocities", "b.weight", "step"]


def make_engine(seed: int = 5, b_optimizer: ec.Optimizer | None = None) -> ec.EmbeddingEngine:
    a = ec.TableConfig(vocabulary_size=9, dim=4, name="a", combiner="sum")
    b = ec.TableConfig(
        vocabulary_size=6, dim=3, name="b", optimizer=b_optimizer or ec.Adam(learning_rate=0.2)
    )
    features = {"x": ec.FeatureConfig(table=a), "y": ec.FeatureConfig(table=b)}
    return ec.EmbeddingEngine(features, ec.Adagrad(learning_rate=0.1), seed=seed)


def train(engine: ec.EmbeddingEngine, steps: int = 2, seed: int = 0) -> ec.EmbeddingEngine:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        acts = engine(
            {
                "x": torch.randint(0, 9, (4,), generator=g),
                "y": torch.randint(0, 6, (4,), generator=g),
            }
        )
        sum((v * v).sum() for v in acts.values()).backward()
    return engine


def snapshot(engine: ec.EmbeddingEngine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.state_dict().items()}


def assert_state(engine: ec.EmbeddingEngine, want: dict[str, torch.Tensor]) -> None:
    got = engine.state_dict()
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key


def manifest(path: Path) -> dict[str, Any]:
    return json.loads((path / "embcore_manifest.json").read_text())


def write_manifest(path: Path, document: dict[str, Any]) -> None:
    (path / "embcore_manifest.json").write_text(json.dumps(document))


def only_chunk(document: dict[str, Any], key: str) -> dict[str, Any]:
    (c,) = document["tensors"][key]["chunks"]
    return c


def redirect(path: Path, key: str, **changes: Any) -> None:
    """Change the storage entry of ``key``'s chunk (``relative_path``, ``offset``, ``length``)
    in ``.metadata`` and in the manifest alike, with a matching ``.metadata`` checksum."""
    metadata = pickle.loads((path / ".metadata").read_bytes())
    for index, info in list(metadata.storage_data.items()):
        if index.fqn == key:
            metadata.storage_data[index] = dataclasses.replace(info, **changes)
    raw = pickle.dumps(metadata)
    (path / ".metadata").write_bytes(raw)
    document = manifest(path)
    c = only_chunk(document, key)
    for field, value in changes.items():
        c[{"relative_path": "file"}.get(field, field)] = (
            str(value) if field == "relative_path" else value
        )
    document["dcp_metadata_sha256"] = hashlib.sha256(raw).hexdigest()
    write_manifest(path, document)
