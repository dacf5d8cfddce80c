"""What docs/main_job.md ("torch.compile") tells users to do with ragged, sparse, weighted and
TorchRec inputs: prepare them outside the compiled function (``engine.prepare``, as
``ec.Prefetcher`` does), and the model around the engine compiles into one graph."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from kjt_stand_in import StandInKJT

import embcore as ec

pytestmark = pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")


class TwoFeatures(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        tables = {n: ec.TableConfig(vocabulary_size=50, dim=4, name=n) for n in ("a", "b")}
        features = {n: ec.FeatureConfig(table=t) for n, t in tables.items()}
        self.engine = ec.EmbeddingEngine(features, optimizer=ec.Adagrad(learning_rate=0.1))
        self.head = torch.nn.Linear(8, 1)

    def forward(self, features, weights=None):  # type: ignore[no-untyped-def]
        acts = self.engine(features, weights)
        return self.head(torch.cat([acts["a"], acts["b"]], 1)).sum()


RAGGED = {
    "a": ec.RaggedIds.from_lists([[1, 2], [], [3]]),
    "b": ec.RaggedIds.from_lists([[4], [5], [6, 7]]),
}
INPUTS = {
    "ragged": lambda: (RAGGED, None),
    "weighted_ragged": lambda: (RAGGED, {"a": ec.RaggedIds.from_lists([[1.0, 2.0], [], [3.0]])}),
    "sparse": lambda: (
        {"a": torch.tensor([[1, 0], [3, 4], [0, 6]]).to_sparse(), "b": RAGGED["b"]}, None
    ),
    "kjt": lambda: (StandInKJT(["a", "b"], torch.tensor([1, 2, 3, 4, 5, 6, 7]),
                               torch.tensor([2, 0, 1, 1, 1, 2])), None),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(INPUTS))
def test_prepared_inputs_compile_into_one_graph_with_the_eager_result(kind: str) -> None:
    torch._dynamo.reset()
    model = TwoFeatures()
    features, weights = INPUTS[kind]()
    eager = model(features, weights)
    prepared = model.engine.prepare(features, weights)
    explained = torch._dynamo.explain(model)(prepared)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    assert explained.graph_count == 1
    with torch.no_grad():
        torch.testing.assert_close(model(prepared), eager)
