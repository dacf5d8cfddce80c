"""torch.compile sees the engine as ``torch.ops.embcore`` operators: no graph break from
embcore in the main job's DLRM, whatever the input (raw ids or a prepared batch), in training
and in evaluation; bad ids raise inside the compiled model exactly as in eager mode."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from compile_cases import VOCAB, batches, small_dlrm

#: PyTorch's own: dynamo instantiates the autograd.Function classes it traces (the DLRM's
#: Linear and interaction)
pytestmark = pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


@pytest.mark.parametrize("prepared", [False, True], ids=["raw_ids", "prepared_batch"])
def test_the_dlrm_compiles_into_one_graph(prepared: bool) -> None:
    model = small_dlrm()
    dense, sparse, _ = batches([16])[0]
    ids = model.engine.prepare(model.features(sparse)) if prepared else sparse
    explained = torch._dynamo.explain(model)(dense, ids)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    assert explained.graph_count == 1
    ops = [
        str(n.target)
        for g in explained.graphs
        for n in g.graph.nodes
        if n.op == "call_function" and "embcore" in str(n.target)
    ]
    assert ops == ["embcore.lookup"]  # the custom operator, one call for all 26 tables


def test_evaluation_and_the_per_feature_forward_compile_into_one_graph() -> None:
    model = small_dlrm().eval()
    dense, sparse, _ = batches([16])[0]
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(dense, sparse)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    engine = model.engine.train()
    explained = torch._dynamo.explain(engine)(model.features(sparse))
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]


def test_an_id_out_of_range_raises_the_eager_error_inside_the_compiled_model() -> None:
    model = small_dlrm()
    dense, sparse, _ = batches([8])[0]
    sparse[3, 5] = VOCAB + 7
    with pytest.raises(ValueError) as eager:
        model(dense, sparse)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with pytest.raises(ValueError) as inside:
        compiled(dense, sparse)
    assert str(inside.value) == str(eager.value)
    assert str(VOCAB + 7) in str(eager.value) and "C6" in str(eager.value)
    assert model.engine.step == 0
