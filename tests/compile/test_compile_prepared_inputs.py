"""Batches prepared outside the compiled function (``engine.prepare``, as ``ec.Prefetcher``
does), from every input kind: the model around the engine compiles into one graph. What
docs/main_job.md ("torch.compile") tells users to do with sparse input, which ``torch.compile``
does not take raw."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from compile_cases import INPUTS, TwoFeatures

pytestmark = pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")


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
