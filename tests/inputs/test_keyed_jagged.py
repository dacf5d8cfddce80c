"""TorchRec ``KeyedJaggedTensor`` batches: each key is the feature of that name.

The stand-in below has the methods embcore reads, laid out as TorchRec documents them
(key-major lengths); where torchrec is installed, the real class is checked the same way.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kjt_stand_in import StandInKJT, torchrec_kjt

import embcore as ec
from embcore.keyed_jagged import from_keyed_jagged, is_keyed_jagged

# two keys, three samples each: user rows [3, 1], [], [4]; item rows [0], [2], [5, 6, 7]
KEYS = ["user", "item"]
ROWS = {"user": [[3, 1], [], [4]], "item": [[0], [2], [5, 6, 7]]}
WEIGHTS = {"user": [[0.5, 2.0], [], [1.5]], "item": [[1.0], [3.0], [0.25, 0.5, 2.0]]}


def _flat(per_key):
    return [x for key in KEYS for row in per_key[key] for x in row]


def _kjt(kind: str, weighted: bool):
    values = torch.tensor(_flat(ROWS), dtype=torch.int64)
    lengths = torch.tensor([len(r) for key in KEYS for r in ROWS[key]], dtype=torch.int64)
    weights = torch.tensor(_flat(WEIGHTS), dtype=torch.float32) if weighted else None
    if kind == "stand-in":
        return StandInKJT(KEYS, values, lengths, weights)
    return torchrec_kjt()(keys=KEYS, values=values, lengths=lengths, weights=weights)


KINDS = ["stand-in", "torchrec"]  # torchrec: skipped, saying why, where it is not installed


def _engine():
    user = ec.TableConfig(vocabulary_size=6, dim=3, combiner="sum", name="user")
    item = ec.TableConfig(vocabulary_size=9, dim=2, combiner="mean", name="item")
    features = {"user": ec.FeatureConfig(table=user), "item": ec.FeatureConfig(table=item)}
    return ec.EmbeddingEngine(features, optimizer=ec.SGD(learning_rate=0.5), seed=3)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("weighted", [False, True])
def test_a_kjt_batch_equals_the_same_features_given_by_name(kind: str, weighted: bool) -> None:
    by_kjt, by_name = _engine(), _engine()
    tables = {n: t.detach().numpy().copy() for n, t in by_kjt.embedding_tables.items()}

    acts = by_kjt(_kjt(kind, weighted))
    features = {k: ec.RaggedIds.from_lists(ROWS[k]) for k in KEYS}
    weights = {k: ec.RaggedIds.from_lists(WEIGHTS[k]) for k in KEYS} if weighted else None
    want = by_name(features, weights)

    # independent check of the forward: per-sample sums (user) and weighted means (item)
    for key, combiner in (("user", "sum"), ("item", "mean")):
        rows = []
        for b, ids in enumerate(ROWS[key]):
            w = np.array(WEIGHTS[key][b] if weighted else [1.0] * len(ids), dtype=np.float64)
            v = tables[key][ids].astype(np.float64) if ids else np.zeros((0, tables[key].shape[1]))
            total = (w[:, None] * v).sum(0)
            rows.append(total / w.sum() if combiner == "mean" and len(ids) else total)
        np.testing.assert_allclose(acts[key].detach().numpy(), np.stack(rows), rtol=1e-6)
        torch.testing.assert_close(acts[key], want[key])

    sum((a**2).sum() for a in acts.values()).backward()
    sum((a**2).sum() for a in want.values()).backward()
    for name in tables:
        torch.testing.assert_close(by_kjt.embedding_tables[name], by_name.embedding_tables[name])


def test_a_kjt_is_recognised_and_a_dict_is_not() -> None:
    assert is_keyed_jagged(_kjt("stand-in", False))
    assert not is_keyed_jagged({"user": torch.tensor([1])})


def test_weights_come_from_the_kjt_not_from_an_argument() -> None:
    with pytest.raises(ValueError, match="KeyedJaggedTensor carries its own weights"):
        _engine()(_kjt("stand-in", True), {"user": torch.ones(3)})


def test_a_missing_key_names_the_feature() -> None:
    values = torch.tensor([3, 1, 4])
    kjt = StandInKJT(["user"], values, torch.tensor([2, 0, 1]))
    with pytest.raises((KeyError, ValueError), match="item"):
        _engine()(kjt)


@pytest.mark.parametrize(
    ("keys", "lengths", "values", "message"),
    [
        (["user", "user"], [1, 1], [1, 2], "unique"),
        (["user", "item"], [1, 1, 1], [1, 2, 3], "equal batch size"),
    ],
)
def test_malformed_kjts_are_refused(keys, lengths, values, message) -> None:
    kjt = StandInKJT(keys, torch.tensor(values), torch.tensor(lengths))
    with pytest.raises(ValueError, match=message):
        from_keyed_jagged(kjt)


def test_offsets_that_disagree_with_values_are_refused() -> None:
    kjt = StandInKJT(["user"], torch.tensor([1, 2]), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="offsets must run from 0 to len"):
        from_keyed_jagged(kjt)
