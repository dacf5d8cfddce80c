"""The Triton backend's kernels on CPU tensors, in Triton's interpreter (``TRITON_INTERPRET=1``).

These run in CI (no GPU): the same kernels as on a GPU, executed program by program in NumPy,
compared with the reference backend. Cases are tiny because the interpreter is slow. The full
sweep (more dims, bigger batches, stochastic-rounding statistics) is tests/ops/test_triton_gpu.py,
on CUDA. On a machine with CUDA this module is skipped: the kernels there are compiled, not
interpreted, and the GPU module covers them.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if torch.cuda.is_available():
    pytest.skip(
        "CUDA present: the kernels are tested compiled (test_triton_gpu.py)",
        allow_module_level=True,
    )
# Triton reads TRITON_INTERPRET when it decorates a kernel, its own library included, so this
# must precede the process's first import of triton (nothing in embcore imports it on the CPU).
os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")

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
from embcore.ops import triton as tb
from embcore.ops.triton.rules import sgd

VOCAB = 12


@pytest.fixture(autouse=True, scope="module")
def _interpreted() -> None:
    """Fail loudly if triton was imported before this module set TRITON_INTERPRET=1."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    for fn in (tl.zeros, sgd._kernel):
        if not isinstance(fn, InterpretedFunction):
            pytest.fail(
                "triton was imported before TRITON_INTERPRET=1 was set (by an earlier test "
                "module?); run tests/ops/test_triton_interpreter.py in its own process"
            )


def _features(seed: int, dim: int) -> list:
    """Two features of one table: mean-weighted bags and sqrtn bags, with duplicates and
    empty bags (mixed combiners in one launch)."""
    gen = torch.Generator().manual_seed(seed)
    return [
        make_batch(gen, VOCAB, 5, 4, "mean", weighted=True),
        make_batch(gen, VOCAB, 4, 3, "sqrtn"),
    ]


@pytest.mark.parametrize("dim", [5, 33])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_lookup_matches_reference(dim: int, combiner: str, weighted: bool) -> None:
    gen = torch.Generator().manual_seed(dim)
    state = make_state(None, VOCAB, dim, seed=1)
    feats = [make_batch(gen, VOCAB, 6, 5, combiner, weighted)]
    got = tb.lookup([state], [feats])[0]
    want = reference.lookup([state], [feats])[0]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_lookup_of_several_features_and_tables() -> None:
    gen = torch.Generator().manual_seed(3)
    a, b = make_state(None, VOCAB, 7, seed=1), make_state(None, VOCAB, 16, seed=2)
    feats = [
        [make_batch(gen, VOCAB, 4, 3, "mean", weighted=True), sequence_batch(gen, VOCAB, 2, 3)],
        [make_batch(gen, VOCAB, 3, 4, "sqrtn")],
    ]
    got = tb.lookup([a, b], feats)
    want = reference.lookup([a, b], feats)
    assert [len(t) for t in got] == [2, 1]
    for gt, wt in zip(got, want, strict=True):
        for g, w in zip(gt, wt, strict=True):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_storage_lookup_accumulates_in_float32(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(4)
    state = make_state(None, VOCAB, 9, seed=3, dtype=dtype)
    feats = [make_batch(gen, VOCAB, 5, 6, "mean", weighted=True)]
    got = tb.lookup([state], [feats])[0][0]
    wide = make_state(None, VOCAB, 9, seed=3, dtype=dtype)
    wide = ops.TableState(wide.name, wide.weight.float(), {}, None)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, reference.lookup([wide], [feats])[0][0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_update_matches_reference(name: str) -> None:
    opt = OPTIMIZERS[name]
    dim = 13  # not a multiple of the block
    state = make_state(opt, VOCAB, dim, seed=5)
    feats = _features(6, dim)
    check_update(tb, state, feats, gradients(torch.Generator().manual_seed(7), feats, dim))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["adagrad", "rowwise_adagrad", "adam-non-lazy"])
def test_half_storage_update_rounds_the_float32_update(dtype: torch.dtype, name: str) -> None:
    state = make_state(OPTIMIZERS[name], VOCAB, 6, seed=8, dtype=dtype)
    feats = _features(9, 6)
    check_update(tb, state, feats, gradients(torch.Generator().manual_seed(10), feats, 6))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_stochastic_rounding_picks_a_neighbour_and_is_unbiased(dtype: torch.dtype) -> None:
    """An SGD step far smaller than the storage precision: round-to-nearest never moves the
    weights, stochastic rounding moves each to one of its two neighbours, on average by the
    true step. Ones (ulp 2**-10 or 2**-7 above 1, half that below) take a step of ulp / 8:
    nearest keeps 1, stochastic rounding goes down one (ulp / 2) with probability 1/4."""
    vocab, dim = 32, 16
    ulp = 2.0**-10 if dtype == torch.float16 else 2.0**-7
    weight = torch.ones(vocab, dim, dtype=dtype)
    state = ops.TableState("t", weight, {}, ec.SGD(learning_rate=1.0))
    offsets = torch.arange(vocab + 1)
    feats = [ec.inputs.FeatureBatch(torch.arange(vocab), offsets, None, "sum", (vocab,))]
    grads = [torch.full((vocab, dim), ulp / 8)]
    tb.update([state], [feats], [grads], [1.0], 1)
    assert torch.equal(state.weight, torch.ones(vocab, dim, dtype=dtype))  # nearest: no move
    state = ops.TableState("t", state.weight, {}, state.optimizer, stochastic_rounding=True)
    tb.update([state], [feats], [grads], [1.0], 2)
    down = 1.0 - ulp / 2  # the neighbour below 1 (the binade below has half the spacing)
    moved = state.weight.float()
    assert bool(((moved == 1.0) | (moved == down)).all())
    mean_step = float((1.0 - moved).mean())
    # 512 draws of ulp/2 with probability 1/4: the mean's sigma is ulp/104, 5 sigma ~ ulp/20
    assert abs(mean_step - ulp / 8) < ulp / 20


def test_backend_checks_its_tables() -> None:
    state = ops.TableState("video", torch.zeros(4, 3, dtype=torch.float64), {}, ec.SGD())
    with pytest.raises(NotImplementedError, match=r"table 'video'.*float64"):
        tb.lookup([state], [[make_batch(torch.Generator(), 4, 2, 2)]])
    state = ops.TableState("video", torch.zeros(4, 3), {}, None)
    feats = [make_batch(torch.Generator(), 4, 2, 2)]
    with pytest.raises(RuntimeError, match="'video' has no optimizer"):
        tb.update([state], [feats], [[torch.zeros(2, 3)]], [0.1], 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_engine_with_the_triton_backend_matches_the_reference_engine(dtype: torch.dtype) -> None:
    """Two tables (one shared by two features, one a sequence table) through the engine, two
    steps. A bfloat16 engine is compared with the float32 reference engine to bfloat16
    precision (its rows are rounded after every step)."""
    video = ec.TableConfig(vocabulary_size=20, dim=6, name="video", combiner="mean")
    query = ec.TableConfig(vocabulary_size=15, dim=4, name="query")
    config = {
        "watched": ec.FeatureConfig(table=video),
        "liked": ec.FeatureConfig(table=video),
        "query": ec.FeatureConfig(table=query, max_sequence_length=3),
    }
    gen = torch.Generator().manual_seed(11)
    opt = ec.Adagrad(learning_rate=0.2)
    engines = [
        ec.EmbeddingEngine(config, opt, backend="triton", seed=1, storage_dtype=dtype),
        ec.EmbeddingEngine(config, opt, backend="reference", seed=1),
    ]
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 0, "atol": 2e-2}
    for _ in range(2):
        batch = {
            "watched": ec.RaggedIds(
                torch.randint(0, 20, (7,), generator=gen), torch.tensor([0, 3, 3, 5, 7])
            ),
            "liked": torch.randint(0, 20, (4, 1), generator=gen),
            "query": ec.RaggedIds(
                torch.randint(0, 15, (6,), generator=gen), torch.tensor([0, 3, 4, 4, 6])
            ),
        }
        outs = [e(batch) for e in engines]
        loss = [sum((o[k] * (i + 1)).sum() for i, k in enumerate(sorted(o))) for o in outs]
        for value in loss:
            value.backward()
        for k in outs[0]:
            assert outs[0][k].dtype == torch.float32
            torch.testing.assert_close(outs[0][k], outs[1][k], **tol)
    for name, table in engines[0].embedding_tables.items():
        assert table.dtype == dtype
        torch.testing.assert_close(table.float(), engines[1].embedding_tables[name], **tol)


def test_engine_rejects_half_storage_on_other_backends() -> None:
    config = {"f": ec.FeatureConfig(table=ec.TableConfig(vocabulary_size=4, dim=2, name="t"))}
    with pytest.raises(ValueError, match=r"storage_dtype=torch.float16 needs backend 'triton'"):
        ec.EmbeddingEngine(config, ec.SGD(), backend="reference", storage_dtype=torch.float16)
    with pytest.raises(ValueError, match=r"storage_dtype must be .* got 'float16'"):
        ec.EmbeddingEngine(config, ec.SGD(), backend="triton", storage_dtype="float16")


def test_gpu_benchmark_mode_runs_on_tiny_workloads(tmp_path) -> None:
    """The GPU mode of ``embcore bench`` end to end, on CPU tensors with the interpreted
    kernels (FBGEMM TBE is skipped off CUDA): the tables and the bandwidth fields exist."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        from sidebyside import gpu
    finally:
        sys.path.pop(0)
    results = gpu.run(
        ["W1-gpu-quick", "W2-gpu-quick"],
        device="cpu",
        backend="triton",
        warmup=0,
        steps=1,
        copy_megabytes=1,
        log=lambda line: None,
    )
    for w in results["workloads"].values():
        assert w["backend"] == "triton"
        assert set(w["steps"]) == {"embcore", "plain PyTorch"}
        assert "FBGEMM TBE" in w["skipped"]
        for kernel in ("lookup", "update"):
            assert w["kernels"][kernel]["fraction_of_copy"] > 0
    table = gpu.markdown(results)
    assert "| W2-gpu-quick | update (triton) |" in table


@pytest.mark.parametrize("name", ["sgd", "adam-non-lazy"])
def test_long_runs_are_split_across_programs_and_combined(name: str) -> None:
    """A hot id seen 500 times (plus 200 ids of five others, runs straddling the blocks of
    ``split`` sorted positions) with one id per bag: the run is summed by several programs
    and combined, deterministically. SGD is checked against NumPy in float64, non-lazy Adam
    against the reference backend."""
    gen = torch.Generator().manual_seed(12)
    ids = torch.cat([torch.full((500,), 3), torch.randint(0, 6, (200,), generator=gen)])
    ids = ids[torch.randperm(ids.numel(), generator=gen)]
    batch = ec.inputs.FeatureBatch(ids, torch.arange(ids.numel() + 1), None, "sum", (700,))
    plan = tb.backward.row_plan(tb.jagged.table_batch([batch]), 8)
    assert plan.split == 64 and int((ids == 3).sum()) > 7 * plan.split  # the run is split
    grads = [torch.randn(700, 8, generator=gen)]
    state = make_state(OPTIMIZERS[name], 6, 8, seed=13)
    if name == "adam-non-lazy":
        check_update(tb, state, [batch], grads)
        return
    twin = make_state(OPTIMIZERS[name], 6, 8, seed=13)
    want = state.weight.double().numpy().copy()
    np.add.at(want, ids.numpy(), -0.1 * grads[0].double().numpy())
    tb.update([state], [[batch]], [grads], [0.1], 1)
    np.testing.assert_allclose(state.weight.numpy(), want, rtol=1e-5, atol=1e-5)
    tb.update([twin], [[batch]], [grads], [0.1], 1)
    assert torch.equal(state.weight, twin.weight)  # the combine order is fixed


def test_non_finite_flags_stay_on_the_device_and_match_numpy(monkeypatch) -> None:
    """One flag per tensor (contiguous float32 scanned by the kernel, others by PyTorch), the
    same as NumPy's; building them reads nothing back to the host."""
    x = torch.randn(3 * 4096 + 5)
    tensors = [torch.zeros(0), torch.ones(1), x.clone(), x.clone(), x.clone()]
    tensors[2][-1] = float("nan")
    tensors[3][4096] = float("-inf")
    stacked = torch.zeros(6, 3, 4)
    stacked[2, 1, 3] = float("inf")
    tensors += [stacked[:, f, :] for f in range(3)]  # strided slices
    tensors.append(torch.tensor([1e300, 1.0], dtype=torch.float64))  # finite in float64
    want = [not np.isfinite(t.numpy()).all() for t in tensors]
    assert want == [False, False, True, True, False, False, True, False, False]
    for method in ("tolist", "item", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, method, _no_host_reads, raising=False)
    flags = tb.finite.non_finite_flags(tensors)
    monkeypatch.undo()
    assert flags.device == x.device and flags.tolist() == [int(w) for w in want]
    assert tb.non_finite(tensors) == want
    assert ops.non_finite("triton", tensors) == want


def _no_host_reads(*args, **kwargs):
    raise AssertionError("non_finite_flags read a tensor back to the host")


def test_stochastic_rounding_is_an_engine_option() -> None:
    """A bfloat16 table of ones with steps far below its precision (a gradient of 1 per id,
    lr 2**-10, ulp of 1 is 2**-7): round to nearest leaves the table as it was,
    ``stochastic_rounding=True`` moves touched rows only. float32 tables reject the option."""
    config = {"f": ec.FeatureConfig(table=ec.TableConfig(vocabulary_size=10, dim=8, name="t"))}
    ids = torch.tensor([1, 4, 4, 7])
    tables = []
    for sr in (False, True):
        engine = ec.EmbeddingEngine(
            config, ec.SGD(learning_rate=2.0**-10), backend="triton", seed=2,
            storage_dtype=torch.bfloat16, stochastic_rounding=sr,
        )  # fmt: skip
        engine.embedding_tables["t"].fill_(1.0)
        before = engine.embedding_tables["t"].clone()
        engine({"f": ids})["f"].sum().backward()
        tables.append((before, engine.embedding_tables["t"]))
    (before, nearest), (start, stochastic) = tables
    assert torch.equal(before, start) and torch.equal(nearest, before)
    moved = (stochastic != start).any(dim=1)
    assert moved.any() and not moved[[0, 2, 3, 5, 6, 8, 9]].any()
    with pytest.raises(ValueError, match=r"stochastic_rounding=True needs .*float32"):
        ec.EmbeddingEngine(config, ec.SGD(), backend="triton", stochastic_rounding=True)
