"""TorchRec's own ``KeyedJaggedTensor`` (tried with torchrec 1.8.0 and fbgemm-gpu-cpu 1.8.0):
built from lengths, from offsets, with weights, from its sync constructors, and with a variable
batch size per key (which the engine refuses, naming it). Skipped, saying why, without
torchrec (CI does not install it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kjt_stand_in import torchrec_kjt

import embcore as ec

KEYS = ["user", "item"]
ROWS = {"user": [[3, 1], [], [4]], "item": [[0], [2], [5, 6, 7]]}
WEIGHTS = {"user": [[0.5, 2.0], [], [1.5]], "item": [[1.0], [3.0], [0.25, 0.5, 2.0]]}
VALUES = torch.tensor([x for k in KEYS for row in ROWS[k] for x in row])
LENGTHS = torch.tensor([len(r) for k in KEYS for r in ROWS[k]])
FLAT_WEIGHTS = torch.tensor([w for k in KEYS for row in WEIGHTS[k] for w in row])


def _engine() -> ec.EmbeddingEngine:
    user = ec.TableConfig(vocabulary_size=6, dim=3, combiner="sum", name="user")
    item = ec.TableConfig(vocabulary_size=9, dim=2, combiner="mean", name="item")
    features = {"user": ec.FeatureConfig(table=user), "item": ec.FeatureConfig(table=item)}
    return ec.EmbeddingEngine(features, optimizer=ec.SGD(learning_rate=0.5), seed=3)


def _reference(tables: dict[str, np.ndarray], weighted: bool) -> dict[str, np.ndarray]:
    """Per sample: the sum (user) or weighted mean (item) of its rows, in float64."""
    out = {}
    for key, combiner in (("user", "sum"), ("item", "mean")):
        rows = []
        for b, ids in enumerate(ROWS[key]):
            w = np.array(WEIGHTS[key][b] if weighted else [1.0] * len(ids))
            v = tables[key][ids].astype(np.float64) if ids else np.zeros((0, tables[key].shape[1]))
            total = (w[:, None] * v).sum(0)
            rows.append(total / w.sum() if combiner == "mean" and ids else total)
        out[key] = np.stack(rows)
    return out


@pytest.mark.parametrize(
    "build",
    [
        lambda K, w: K(keys=KEYS, values=VALUES, lengths=LENGTHS, weights=w),
        lambda K, w: K(
            keys=KEYS,
            values=VALUES,
            offsets=torch.cat([torch.zeros(1, dtype=torch.int64), LENGTHS.cumsum(0)]),
            weights=w,
        ),
        lambda K, w: K.from_lengths_sync(keys=KEYS, values=VALUES, lengths=LENGTHS, weights=w),
        lambda K, w: K.from_offsets_sync(
            keys=KEYS,
            values=VALUES,
            offsets=torch.cat([torch.zeros(1, dtype=torch.int64), LENGTHS.cumsum(0)]),
            weights=w,
        ),
    ],
    ids=["lengths", "offsets", "from_lengths_sync", "from_offsets_sync"],
)
@pytest.mark.parametrize("weighted", [False, True])
def test_a_real_kjt_looks_up_and_trains_like_its_rows(build, weighted: bool) -> None:
    kjt = build(torchrec_kjt(), FLAT_WEIGHTS if weighted else None)
    engine, by_name = _engine(), _engine()
    tables = {n: t.detach().numpy().copy() for n, t in engine.embedding_tables.items()}
    acts = engine(kjt)
    want = _reference(tables, weighted)
    for key in KEYS:
        np.testing.assert_allclose(acts[key].detach().numpy(), want[key], rtol=1e-6)
    features = {k: ec.RaggedIds.from_lists(ROWS[k]) for k in KEYS}
    weights = {k: ec.RaggedIds.from_lists(WEIGHTS[k]) for k in KEYS} if weighted else None
    named = by_name(features, weights)
    sum((a**2).sum() for a in acts.values()).backward()
    sum((a**2).sum() for a in named.values()).backward()
    for name in tables:  # the same update as the same rows given by name
        torch.testing.assert_close(engine.embedding_tables[name], by_name.embedding_tables[name])
        assert not torch.equal(engine.embedding_tables[name], torch.from_numpy(tables[name]))


def test_a_real_kjt_with_a_variable_batch_per_key_is_refused_by_name() -> None:
    K = torchrec_kjt()
    kjt = K(keys=KEYS, values=VALUES[:5], lengths=torch.tensor([2, 0, 1, 1, 1]),
            stride_per_key_per_rank=[[2], [3]])  # fmt: skip
    assert kjt.variable_stride_per_key()
    engine = _engine()
    before = {n: t.detach().clone() for n, t in engine.embedding_tables.items()}
    with pytest.raises(ValueError, match="a variable batch size per key is not supported"):
        engine(kjt)
    assert all(torch.equal(engine.embedding_tables[n], t) for n, t in before.items())
