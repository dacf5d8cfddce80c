"""The built-in synthetic source: deterministic, Criteo-shaped, Zipf-skewed, calibrated."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from embcore.data import CRITEO_CARDINALITIES, Batch, SyntheticCriteo, capped_vocab_sizes
from embcore.data.synthetic import SIGNAL_IDS


@pytest.fixture(scope="module")
def source() -> SyntheticCriteo:
    return SyntheticCriteo(seed=3, vocab_cap=5000)


def test_batches_are_a_pure_function_of_seed_split_and_index(source: SyntheticCriteo) -> None:
    a = source.batch("train", 7, 256)
    b = SyntheticCriteo(seed=3, vocab_cap=5000).batch("train", 7, 256)
    for x, y in ((a.dense, b.dense), (a.sparse, b.sparse), (a.labels, b.labels)):
        assert torch.equal(x, y)
    assert not torch.equal(a.sparse, source.batch("train", 8, 256).sparse)
    assert not torch.equal(a.sparse, source.batch("eval", 7, 256).sparse)
    assert not torch.equal(
        a.sparse, SyntheticCriteo(seed=4, vocab_cap=5000).batch("train", 7, 256).sparse
    )


def test_rows_have_the_criteo_layout(source: SyntheticCriteo) -> None:
    batch = source.batch("train", 0, 4096)
    assert batch.dense.shape == (4096, 13) and batch.dense.dtype == torch.float32
    assert batch.sparse.shape == (4096, 26) and batch.sparse.dtype == torch.int64
    assert set(batch.labels.unique().tolist()) == {0.0, 1.0}
    assert bool((batch.dense >= 0).all()) and bool(torch.isfinite(batch.dense).all())
    vocab = torch.tensor(capped_vocab_sizes(5000))
    assert bool((batch.sparse >= 0).all()) and bool((batch.sparse < vocab).all())
    # missing dense values (0 after the transform) occur, as in Criteo
    assert 0 < float((batch.dense == 0).float().mean()) < 0.5


def test_vocab_sizes_are_the_capped_criteo_cardinalities() -> None:
    src = SyntheticCriteo(vocab_cap=1000)
    assert src.vocab_sizes == [min(c, 1000) for c in CRITEO_CARDINALITIES]
    assert src.vocab_sizes[8] == 3 and src.vocab_sizes[2] == 1000
    with pytest.raises(ValueError, match="cap must be an int >= 1, got 0"):
        capped_vocab_sizes(0)


def test_ids_follow_the_truncated_zipf_law() -> None:
    src = SyntheticCriteo(seed=1, vocab_cap=200, zipf_a=1.2)
    ids = np.concatenate([src.batch("train", i, 8192).sparse[:, 2].numpy() for i in range(4)])
    pmf = np.arange(1, 201, dtype=np.float64) ** -1.2
    pmf /= pmf.sum()  # an independent statement of P(id = k) ~ (k + 1) ** -a, k < 200
    freq = np.bincount(ids, minlength=200) / ids.size
    sigma = np.sqrt(pmf * (1 - pmf) / ids.size)
    assert np.all(np.abs(freq[:20] - pmf[:20]) < 5 * sigma[:20])
    # the tail is light but present
    assert abs(freq[100:].sum() - pmf[100:].sum()) < 0.01


def test_labels_are_drawn_from_the_returned_probabilities(source: SyntheticCriteo) -> None:
    batches = [source.sample("eval", i, 8192) for i in range(4)]
    y = np.concatenate([b.labels.numpy() for b, _ in batches])
    p = np.concatenate([p for _, p in batches])
    assert abs(y.mean() - p.mean()) < 4 * np.sqrt((p * (1 - p)).sum()) / y.size
    # calibrated in every probability decile, not only on average
    edges = np.quantile(p, np.linspace(0, 1, 11))
    for lo, hi in itertools.pairwise(edges):
        m = (p >= lo) & (p < hi)
        assert abs(y[m].mean() - p[m].mean()) < 5 * np.sqrt((p[m] * (1 - p[m])).sum()) / m.sum()
    assert 0.15 < y.mean() < 0.4  # near Criteo's click rate


def test_the_hidden_model_reads_only_observed_features(source: SyntheticCriteo) -> None:
    batch, p = source.sample("train", 2, 512)
    logits = source.true_logits(batch.dense.numpy(), batch.sparse.numpy())
    np.testing.assert_allclose(1 / (1 + np.exp(-logits)), p, rtol=1e-12)


def test_cold_ids_carry_no_signal() -> None:
    src = SyntheticCriteo(seed=0, vocab_cap=100_000)
    batch = src.batch("train", 0, 64)
    dense, sparse = batch.dense.numpy(), batch.sparse.numpy().copy()
    sparse[:, 2] = SIGNAL_IDS + 5
    a = src.true_logits(dense, sparse)
    sparse[:, 2] = 99_999
    np.testing.assert_array_equal(a, src.true_logits(dense, sparse))
    sparse[:, 2] = 0  # the most frequent id does matter
    assert not np.allclose(a, src.true_logits(dense, sparse))


def test_bad_arguments_name_the_value() -> None:
    with pytest.raises(ValueError, match=r"zipf_a must be a number > 1, got 1\.0"):
        SyntheticCriteo(zipf_a=1.0)
    with pytest.raises(ValueError, match="split must be one of"):
        SyntheticCriteo(vocab_cap=10).batch("test", 0, 4)
    with pytest.raises(ValueError, match="Batch: expected dense"):  # 3 dense rows for 2 labels
        Batch(torch.zeros(3, 13), torch.zeros(2, 26, dtype=torch.int64), torch.zeros(2))
    with pytest.raises(ValueError, match="Batch: expected dense"):
        Batch(torch.zeros(2, 13), torch.zeros(2, 26, dtype=torch.int32), torch.zeros(2))
