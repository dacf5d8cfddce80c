"""Dynamic-vocabulary tables in the serving lookup and its exported program: a key reads its row
(found by binary search among the sorted keys), a key without a row reads zeros and still counts
in the mean's denominator, as in the engine's evaluation lookups (docs/dynamic_tables.md)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from numpy_reference import lookup

import embcore as ec
from embcore.models import DLRM, DotInteraction
from embcore.serving import ServingLookup, export, lookup_dynamic_shapes

DIM = 4
SEEN = [-(2**63), -7, 0, 5, 2**40, 2**63 - 1]  # admitted by training on them


@pytest.fixture(scope="module")
def engine() -> ec.EmbeddingEngine:
    dynamic = ec.TableConfig(vocabulary_size=None, dim=DIM, name="user", combiner="mean")
    fixed = ec.TableConfig(vocabulary_size=6, dim=DIM, name="item", combiner="sum")
    features = {
        "user": ec.FeatureConfig(dynamic),
        "users": ec.FeatureConfig(dynamic),
        "item": ec.FeatureConfig(fixed),
    }
    engine = ec.EmbeddingEngine(features, optimizer=ec.SGD(learning_rate=0.5), backend="reference")
    seen = torch.tensor(SEEN)
    batch = {
        "user": seen,
        "users": ec.RaggedIds(seen, torch.tensor([0, 3, 6])),
        "item": torch.arange(6),
    }
    for _ in range(2):  # admit the keys, then move their rows away from the initial values
        acts = engine(batch)
        (acts["user"].sum() + acts["users"].sum() * 2 + acts["item"].sum()).backward()
    return engine.eval()


def _numpy(engine: ec.EmbeddingEngine, rows: list[list[int]], combiner: str) -> np.ndarray:
    """``lookup`` over a table of the keys' rows plus one zero row for every absent key."""
    keys = engine.table_keys("user").tolist()
    table = np.concatenate([engine.embedding_tables["user"].numpy(), np.zeros((1, DIM))])
    where = {k: i for i, k in enumerate(keys)}
    samples = [[(where.get(k, len(keys)), 1.0) for k in row] for row in rows]
    return lookup(table, samples, combiner)


def test_exported_dynamic_lookup_equals_engine_and_numpy(engine, tmp_path) -> None:
    assert engine.table_keys("user").tolist() == sorted(SEEN)
    unseen = [1, -1, 2**62, -(2**63) + 1]
    example = {
        "user": torch.tensor([5, 1, -(2**63)]),
        "users": (torch.tensor([0, 1, 2**40, 5]), torch.tensor([0, 2, 2, 4])),
        "item": torch.tensor([0, 3, 5]),
    }
    shapes = lookup_dynamic_shapes(engine, example)
    torch.export.save(export(engine, (example,), dynamic_shapes=(shapes,)), tmp_path / "d.pt2")
    program = torch.export.load(tmp_path / "d.pt2").module()
    rows = [[5, 1, 2**63 - 1], [], [-7, *unseen], [-(2**63)], [2**62]]  # seen and unseen mixed
    users = ec.RaggedIds.from_lists(rows)
    dense = torch.tensor([SEEN[0], unseen[0], SEEN[3], unseen[2], SEEN[-1]])
    items = torch.tensor([4, 0, 1, 2, 5])
    got = program({"user": dense, "users": (users.values, users.row_splits), "item": items})
    want = engine({"user": dense, "users": users, "item": items})
    for name in want:
        assert torch.equal(got[name], want[name]), name
    np.testing.assert_allclose(got["users"].numpy(), _numpy(engine, rows, "mean"), atol=1e-6)
    np.testing.assert_allclose(
        got["user"].numpy(), _numpy(engine, [[k] for k in dense.tolist()], "mean"), atol=0
    )
    assert not got["user"][1].any() and not got["users"][4].any()  # no row: zeros
    assert engine.table_info("user")["rows"] == len(SEEN)  # serving inserted nothing


def test_a_dynamic_table_without_keys_reads_zeros() -> None:
    table = ec.TableConfig(vocabulary_size=None, dim=3, name="t", combiner="sqrtn")
    engine = ec.EmbeddingEngine({"f": ec.FeatureConfig(table)}).eval()
    out = ServingLookup(engine)({"f": (torch.tensor([4, 9]), torch.tensor([0, 1, 2]))})
    assert torch.equal(out["f"], torch.zeros(2, 3))


def test_a_dlrm_on_dynamic_tables_exports_with_identical_logits(tmp_path) -> None:
    names = ["c0", "c1", "c2"]
    tables = [ec.TableConfig(vocabulary_size=None, dim=DIM, name=n) for n in names]
    engine = ec.EmbeddingEngine(
        {n: ec.FeatureConfig(t) for n, t in zip(names, tables, strict=True)},
        optimizer=ec.Adagrad(learning_rate=0.1),
    )
    model = DLRM(
        engine=engine,
        sparse_names=names,
        num_dense=2,
        bottom=[8],
        top=[8],
        interaction=DotInteraction(len(names), DIM),
    )
    rng = np.random.default_rng(0)

    def rows(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        dense = torch.from_numpy(rng.random((n, 2), dtype=np.float32))
        return dense, torch.from_numpy(rng.integers(-(2**62), 2**62, (n, 3)) // 2**58)

    model.train()
    model(*rows(64)).sum().backward()  # admits the keys of one batch
    model.eval()
    batch = torch.export.Dim("batch", min=0)
    program = export(model, rows(4), dynamic_shapes=({0: batch}, {0: batch}))
    torch.export.save(program, tmp_path / "dlrm.pt2")
    served = torch.export.load(tmp_path / "dlrm.pt2").module()
    with torch.no_grad():
        for n in (100, 1, 0):
            dense, sparse = rows(n)  # about half the keys were seen in training
            assert torch.equal(served(dense, sparse), model(dense, sparse)), n
