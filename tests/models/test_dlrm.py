"""DLRM and its interactions against written-out references; who trains what."""

from __future__ import annotations

import pytest
import torch

import embcore as ec
from embcore.models import DLRM, CrossInteraction, DotInteraction
from embcore.models.dlrm import Linear


def test_dot_interaction_is_dense_plus_each_pairwise_dot_once() -> None:
    dense, sparse = torch.randn(5, 4), torch.randn(5, 3, 4)
    out = DotInteraction(3, 4)(dense, sparse)
    vectors = [dense] + [sparse[:, f] for f in range(3)]
    pairs = [(vectors[i] * vectors[j]).sum(1) for i in range(4) for j in range(i)]
    want = torch.cat([dense, torch.stack(pairs, 1)], 1)
    assert out.shape == (5, 4 + 6)
    torch.testing.assert_close(out, want)


def test_dot_interaction_gradients_are_those_of_the_written_out_dots() -> None:
    torch.manual_seed(1)
    dense = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    sparse = torch.randn(6, 3, 4, dtype=torch.float64, requires_grad=True)
    layer = DotInteraction(3, 4)
    weights = torch.randn(6, layer.output_dim, dtype=torch.float64)
    (layer(dense, sparse) * weights).sum().backward()
    got = dense.grad, sparse.grad
    # the same loss through autograd's own product rule on each dot
    d, s = dense.detach().requires_grad_(), sparse.detach().requires_grad_()
    vectors = [d] + [s[:, f] for f in range(3)]
    pairs = [(vectors[i] * vectors[j]).sum(1) for i in range(4) for j in range(i)]
    (torch.cat([d, torch.stack(pairs, 1)], 1) * weights).sum().backward()
    torch.testing.assert_close(got, (d.grad, s.grad))
    assert torch.autograd.gradcheck(layer, (dense, sparse))


@pytest.mark.parametrize("width", [13, 16, 367])
def test_mlp_linear_gradients_are_those_of_x_wt_plus_b(width: int) -> None:
    torch.manual_seed(2)
    layer = Linear(width, 5)
    x = torch.randn(7, width, requires_grad=True)
    upstream = torch.randn(7, 5)
    (layer(x) * upstream).sum().backward()
    # the same in float64 through autograd's own matmul
    w64 = layer.weight.detach().double().requires_grad_()
    b64 = layer.bias.detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    ((x64 @ w64.T + b64) * upstream.double()).sum().backward()
    for got, want in [
        (x.grad, x64.grad),
        (layer.weight.grad, w64.grad),
        (layer.bias.grad, b64.grad),
    ]:
        torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # serving: a plain nn.Linear
        torch.testing.assert_close(layer(x), x @ layer.weight.T + layer.bias)


def test_cross_interaction_follows_the_dcn_v2_formula() -> None:
    torch.manual_seed(0)
    layer = CrossInteraction(2, 3, layers=2, rank=0)
    dense, sparse = torch.randn(4, 3), torch.randn(4, 2, 3)
    x0 = torch.cat([dense, sparse[:, 0], sparse[:, 1]], 1)
    x = x0
    for lin in layer.mixers:
        x = x0 * (x @ lin.weight.T + lin.bias) + x
    torch.testing.assert_close(layer(dense, sparse), x)
    low = CrossInteraction(2, 3, layers=1, rank=2)
    u, v = low.mixers[0][0], low.mixers[0][1]
    torch.testing.assert_close(
        low(dense, sparse), x0 * ((x0 @ u.weight.T) @ v.weight.T + v.bias) + x0
    )


def _model(optimizer: ec.Optimizer | None = None) -> DLRM:
    torch.manual_seed(0)
    features = {
        n: ec.FeatureConfig(ec.TableConfig(vocabulary_size=10, dim=4, name=n), name=n)
        for n in ("a", "b")
    }
    engine = ec.EmbeddingEngine(features, optimizer=optimizer or ec.SGD(learning_rate=0.5))
    return DLRM(
        engine=engine,
        sparse_names=("a", "b"),
        num_dense=3,
        bottom=(8,),
        top=(6,),
        interaction=DotInteraction(2, 4),
    )


def test_the_engine_trains_the_tables_and_torch_the_dense_weights() -> None:
    model = _model()
    tables = {k: v.clone() for k, v in model.engine.embedding_tables.items()}
    names = [n for n, _ in model.named_parameters()]
    assert names and not any(n.startswith("engine") for n in names)  # tables are not parameters
    dense_before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.tensor([[1, 2], [1, 7]])
    logits = model(torch.randn(2, 3), ids)
    assert logits.shape == (2,)
    torch.nn.functional.binary_cross_entropy_with_logits(
        logits, torch.tensor([1.0, 0.0])
    ).backward()
    opt.step()
    after = model.engine.embedding_tables
    assert not torch.equal(after["a"][1], tables["a"][1])  # looked-up rows moved
    untouched = [r for r in range(10) if r != 1]
    assert torch.equal(after["a"][untouched], tables["a"][untouched])  # the rest did not
    assert torch.equal(after["b"][[0, 1, 3, 4, 5, 6, 8, 9]], tables["b"][[0, 1, 3, 4, 5, 6, 8, 9]])
    assert any(not torch.equal(a, b) for a, b in zip(dense_before, model.parameters(), strict=True))


def test_eval_mode_is_a_pure_lookup() -> None:
    model = _model().eval()
    before = {k: v.clone() for k, v in model.engine.embedding_tables.items()}
    model(torch.randn(2, 3), torch.tensor([[1, 2], [3, 4]])).sum()
    assert all(torch.equal(before[k], v) for k, v in model.engine.embedding_tables.items())
