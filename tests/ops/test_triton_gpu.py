"""The Triton backend on CUDA, compiled, against the reference backend on the same device.

Marked ``gpu``: skipped without CUDA (tests/conftest.py). Run on a GPU box with
``pip install -e .[gpu,test] && pytest -m gpu tests/ops/test_triton_gpu.py``. Sweeps dims
(including ones that are not a multiple of the block), combiners, weights, duplicate ids
(small vocabularies), empty bags, sequence features, every optimizer with its options,
float16/bfloat16 storage with nearest and stochastic rounding, and the engine end to end.
The kernel module is imported inside the tests so that collecting this file on a CPU-only
machine never imports Triton (tests/ops/test_triton_interpreter.py needs to be first).
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch
from triton_cases import (
    OPTIMIZERS,
    check_update,
    gradients,
    make_batch,
    make_state,
    sequence_batch,
)

import embcore as ec
from embcore import ops
from embcore.ops import reference

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
DIMS = [1, 7, 64, 100, 128, 257]


@pytest.fixture(scope="module")
def tb() -> ModuleType:
    from embcore.ops import triton as backend

    return backend


def _features(seed: int, vocab: int) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [
        make_batch(gen, vocab, 300, 12, "mean", weighted=True, device=DEVICE),
        make_batch(gen, vocab, 200, 5, "sqrtn", device=DEVICE),
        sequence_batch(gen, vocab, 16, 10, device=DEVICE),
    ]


def test_auto_picks_triton_on_cuda() -> None:
    assert ops.default_backend(torch.device("cuda")) == "triton"


def test_cpu_tensors_are_refused(tb: ModuleType) -> None:
    state = make_state(None, 4, 3, seed=0)
    with pytest.raises(NotImplementedError, match=r"table 'table0'.*CUDA device"):
        tb.lookup([state], [[make_batch(torch.Generator(), 4, 2, 2)]])


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_lookup_matches_reference(tb: ModuleType, dim: int, combiner: str, weighted: bool) -> None:
    gen = torch.Generator().manual_seed(dim)
    state = make_state(None, 500, dim, seed=1, device=DEVICE)
    feats = [make_batch(gen, 500, 1000, 40, combiner, weighted, device=DEVICE)]
    got = tb.lookup([state], [feats])[0][0]
    torch.testing.assert_close(got, reference.lookup([state], [feats])[0][0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dim", [7, 128])
def test_half_storage_lookup(tb: ModuleType, dtype: torch.dtype, dim: int) -> None:
    state = make_state(None, 300, dim, seed=2, device=DEVICE, dtype=dtype)
    feats = _features(3, 300)
    wide = ops.TableState(state.name, state.weight.float(), {}, None)
    got, want = tb.lookup([state], [feats])[0], reference.lookup([wide], [feats])[0]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dim", [1, 7, 64, 257])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_update_matches_reference(tb: ModuleType, name: str, dim: int) -> None:
    state = make_state(OPTIMIZERS[name], 200, dim, seed=4, device=DEVICE)
    feats = _features(5, 200)
    check_update(tb, state, feats, gradients(torch.Generator().manual_seed(6), feats, dim))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_half_storage_update(tb: ModuleType, dtype: torch.dtype, name: str) -> None:
    state = make_state(OPTIMIZERS[name], 200, 72, seed=7, device=DEVICE, dtype=dtype)
    feats = _features(8, 200)
    check_update(tb, state, feats, gradients(torch.Generator().manual_seed(9), feats, 72))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("magnitude", [1.0, 2.0**-20])  # 2**-20: float16 subnormals
def test_stochastic_rounding_is_unbiased(
    tb: ModuleType, dtype: torch.dtype, magnitude: float
) -> None:
    """SGD steps of a quarter of the spacing below ``magnitude`` (a power of two): round to
    nearest never moves; stochastic rounding moves down one spacing with probability 1/4 per
    step, so after 8 steps the mean drift is 2 spacings."""
    vocab, dim, steps = 4096, 64, 8
    if dtype == torch.float16 and magnitude < 2.0**-14:
        spacing = 2.0**-24  # subnormal
    else:
        spacing = magnitude * (2.0**-11 if dtype == torch.float16 else 2.0**-8)
    start = torch.full((vocab, dim), magnitude, dtype=dtype, device=DEVICE)
    offsets = torch.arange(vocab + 1, device=DEVICE)
    ids = torch.arange(vocab, device=DEVICE)
    batch = ec.inputs.FeatureBatch(ids, offsets, None, "sum", (vocab,))
    grads = [torch.full((vocab, dim), spacing / 4, device=DEVICE)]
    state = ops.TableState("t", start.clone(), {}, ec.SGD(learning_rate=1.0))
    tb.update([state], [[batch]], [grads], [1.0], 1)
    assert torch.equal(state.weight, start)
    state = ops.TableState("t", state.weight, {}, state.optimizer, stochastic_rounding=True)
    for s in range(steps):
        tb.update([state], [[batch]], [grads], [1.0], 2 + s)
    drift = (start.float() - state.weight.float()) / spacing  # whole spacings per element
    assert torch.equal(drift, drift.round())
    assert abs(drift.mean().item() - steps / 4) < 0.05 * steps / 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_engine_matches_reference_engine_on_cuda(dtype: torch.dtype) -> None:
    """Three tables (two features on one), four steps, Adagrad on one table and Adam on
    another, through the engine on CUDA with the auto backend."""
    a = ec.TableConfig(vocabulary_size=300, dim=20, name="a", combiner="mean")
    b = ec.TableConfig(vocabulary_size=50, dim=64, name="b", optimizer=ec.Adam(learning_rate=0.01))
    c = ec.TableConfig(vocabulary_size=1000, dim=3, name="c", combiner="sqrtn")
    config = {
        "a1": ec.FeatureConfig(table=a),
        "a2": ec.FeatureConfig(table=a),
        "b": ec.FeatureConfig(table=b),
        "c": ec.FeatureConfig(table=c),
    }
    opt = ec.Adagrad(learning_rate=0.05)
    fast = ec.EmbeddingEngine(config, opt, device=DEVICE, seed=3, storage_dtype=dtype)
    slow = ec.EmbeddingEngine(config, opt, device=DEVICE, seed=3, backend="reference")
    assert fast.backend == "triton"
    gen = torch.Generator().manual_seed(12)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 0, "atol": 5e-3}
    for _ in range(4):
        batch = {}
        for name, vocab in (("a1", 300), ("a2", 300), ("b", 50), ("c", 1000)):
            lengths = torch.randint(0, 6, (64,), generator=gen)
            splits = torch.zeros(65, dtype=torch.int64)
            splits[1:] = lengths.cumsum(0)
            values = torch.randint(0, vocab, (int(splits[-1]),), generator=gen)
            batch[name] = ec.RaggedIds(values.to(DEVICE), splits.to(DEVICE))
        outs = [e(batch) for e in (fast, slow)]
        for o in outs:
            sum(((o[k] ** 2) * (i + 1)).sum() for i, k in enumerate(sorted(o))).backward()
        for k in outs[0]:
            torch.testing.assert_close(outs[0][k], outs[1][k], **tol)
    for name, table in fast.embedding_tables.items():
        assert table.dtype == dtype
        torch.testing.assert_close(table.float(), slow.embedding_tables[name], **tol)
