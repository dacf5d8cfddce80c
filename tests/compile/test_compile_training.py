"""Training the main job's DLRM compiled (``torch.compile``, Inductor) computes what eager mode
computes: the same losses step by step and the same tables afterwards, over batch sizes that
change without a recompilation per size."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from compile_cases import batches, small_dlrm
from torch._dynamo.utils import counters

#: PyTorch's own Inductor warns on import that it uses a deprecated TorchScript decorator, and
#: dynamo instantiates the autograd.Function classes it traces (the DLRM's Linear, interaction)
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning"),
]

#: four batch sizes: the first compiles for its shapes, the second once for any size (dynamo's
#: automatic dynamic shapes), the others reuse that graph
SIZES = [32, 48, 64, 20, 32]


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()
    counters.clear()


def _train(backend: str | None, prepared: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Losses of SIZES' steps (Adam on the dense weights, Adagrad in the engine), and the
    tables after them."""
    model = small_dlrm()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    # fullgraph: a graph break would raise
    forward = model if backend is None else torch.compile(model, backend=backend, fullgraph=True)
    losses = []
    for dense, sparse, labels in batches(SIZES):
        ids = model.engine.prepare(model.features(sparse)) if prepared else sparse
        loss = F.binary_cross_entropy_with_logits(forward(dense, ids), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # the engine's update runs here, compiled or not
        opt.step()
        losses.append(loss.detach())
    assert model.engine.step == len(SIZES)
    return torch.stack(losses), model.engine.embedding_tables


def _compiled_frames() -> int:
    return counters["stats"]["unique_graphs"]


@pytest.mark.slow
def test_inductor_trains_as_eager_with_one_recompilation_for_every_batch_size() -> None:
    """Prepared batches (the main job's path, through ``ec.Prefetcher``). Tolerance: Inductor
    fuses the dense layers' elementwise work and may sum in another order (a few float32 ulps
    per step); the engine's side runs the same kernels compiled or not."""
    eager_losses, eager_tables = _train(None, prepared=True)
    losses, tables = _train("inductor", prepared=True)
    torch.testing.assert_close(losses, eager_losses, rtol=1e-6, atol=1e-6)
    for name, table in tables.items():
        torch.testing.assert_close(table, eager_tables[name], rtol=1e-6, atol=1e-6)
    assert _compiled_frames() == 2


def test_raw_ids_train_as_eager_with_one_recompilation_for_every_batch_size() -> None:
    """Raw ids, validated inside the operator (AOTAutograd without Inductor: exact)."""
    eager_losses, eager_tables = _train(None, prepared=False)
    losses, tables = _train("aot_eager", prepared=False)
    torch.testing.assert_close(losses, eager_losses, rtol=0, atol=0)
    for name, table in tables.items():
        torch.testing.assert_close(table, eager_tables[name], rtol=0, atol=0)
    assert _compiled_frames() == 2
