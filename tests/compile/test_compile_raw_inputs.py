"""Ragged and TorchRec input given raw to a compiled model (no ``engine.prepare``): the engine
is one ``embcore::lookup_raw`` call, converting the input inside with the eager code, so the
model is one graph without a graph break, trains exactly as eager mode, and bad input raises
the eager error from inside the compiled model, changing nothing. Input no operator takes
(sparse tensors) runs the engine's eager path untraced."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch._dynamo
from compile_cases import INPUTS, KJT_LENGTHS, KJT_VALUES, TwoFeatures
from kjt_stand_in import StandInKJT, torchrec_kjt

import embcore as ec

#: PyTorch's own: dynamo instantiates the autograd.Function classes it traces (Linear)
pytestmark = pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")

#: opcheck's checks that run the operator as a pure function (as tests/compile/test_compile_ops)
CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor")
RAW = sorted(k for k in INPUTS if k != "sparse")  # torch.compile takes no sparse tensor


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def _ops(explained: object) -> list[str]:
    return [
        str(n.target)
        for g in explained.graphs  # type: ignore[attr-defined]
        for n in g.graph.nodes
        if n.op == "call_function" and "embcore" in str(n.target)
    ]


@pytest.mark.parametrize("kind", RAW)
def test_raw_ragged_and_kjt_input_compiles_into_one_graph(kind: str) -> None:
    model = TwoFeatures()
    features, weights = INPUTS[kind]()
    explained = torch._dynamo.explain(model)(features, weights)
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    assert explained.graph_count == 1
    assert _ops(explained) == ["embcore.lookup_raw"]


def test_a_real_torchrec_kjt_compiles_into_one_graph_and_trains_as_eager() -> None:
    kjt_class = torchrec_kjt()

    def kjt(weights: torch.Tensor | None = None) -> object:
        return kjt_class(keys=["a", "b"], values=KJT_VALUES, lengths=KJT_LENGTHS, weights=weights)

    model = TwoFeatures()
    explained = torch._dynamo.explain(model)(kjt())
    assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
    assert _ops(explained) == ["embcore.lookup_raw"]
    torch._dynamo.reset()
    eager, compiled = TwoFeatures(), TwoFeatures()
    compiled.load_state_dict(eager.state_dict())
    forward = torch.compile(compiled, backend="aot_eager", fullgraph=True)
    for _ in range(2):
        want, got = eager(kjt()), forward(kjt())
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        want.backward(), got.backward()
    for name, table in compiled.engine.embedding_tables.items():
        torch.testing.assert_close(table, eager.engine.embedding_tables[name], rtol=0, atol=0)


class SequenceModel(torch.nn.Module):
    """A pooled feature (sum), a weighted pooled one (mean) and a sequence feature (length 3)
    on two tables of dim 4: the shapes the raw operator's fake implementation must give."""

    def __init__(self) -> None:
        super().__init__()
        a = ec.TableConfig(vocabulary_size=30, dim=4, name="a")
        b = ec.TableConfig(vocabulary_size=20, dim=4, name="b", combiner="mean")
        features = {
            "x": ec.FeatureConfig(a),
            "y": ec.FeatureConfig(b),
            "s": ec.FeatureConfig(a, max_sequence_length=3),
        }
        self.engine = ec.EmbeddingEngine(features, optimizer=ec.Adagrad(learning_rate=0.2))
        self.scale = torch.nn.Parameter(torch.arange(1.0, 5.0))

    def forward(self, features: object, weights: object = None) -> torch.Tensor:
        acts = self.engine(features, weights)
        return sum(((a * self.scale) ** 2).sum() for a in acts.values())  # type: ignore[union-attr]


def _batch(rng: np.random.Generator, rows: int, as_kjt: bool) -> tuple[object, object]:
    """Random ragged rows (some empty, some longer than the sequence), ids with weights for
    ``y``; as one KJT (keys in another order than the engine's) or as ``RaggedIds``."""
    vocab = {"x": 30, "y": 20, "s": 30}
    lists = {k: [rng.integers(0, v, int(rng.integers(0, 5))).tolist() for _ in range(rows)]
             for k, v in vocab.items()}  # fmt: skip
    weights = [rng.uniform(0.5, 2.0, len(r)).astype(np.float32).tolist() for r in lists["y"]]
    if not as_kjt:
        features = {k: ec.RaggedIds.from_lists(v) for k, v in lists.items()}
        return features, {"y": ec.RaggedIds.from_lists(weights, dtype=torch.float32)}
    keys = ["s", "y", "x"]
    values = torch.tensor([i for k in keys for r in lists[k] for i in r], dtype=torch.int64)
    lengths = torch.tensor([len(r) for k in keys for r in lists[k]])
    ones = {k: [[1.0] * len(r) for r in lists[k]] for k in keys}
    ones["y"] = weights
    flat = torch.tensor([w for k in keys for r in ones[k] for w in r], dtype=torch.float32)
    return StandInKJT(keys, values, lengths, flat), None


@pytest.mark.parametrize("as_kjt", [False, True], ids=["ragged", "kjt"])
def test_raw_ragged_input_trains_compiled_exactly_as_eager(as_kjt: bool) -> None:
    """Four steps, the batch size and the number of ids changing (dynamic shapes): the same
    losses, activations and tables, bit for bit (AOTAutograd without Inductor)."""
    rng = np.random.default_rng(0)
    eager, compiled = SequenceModel(), SequenceModel()
    forward = torch.compile(compiled, backend="aot_eager", fullgraph=True)  # a break raises
    for rows in (5, 7, 3, 7):
        features, weights = _batch(rng, rows, as_kjt)
        want, got = eager(features, weights), forward(features, weights)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        want.backward(), got.backward()
    assert compiled.engine.step == eager.engine.step == 4
    for name, table in compiled.engine.embedding_tables.items():
        torch.testing.assert_close(table, eager.engine.embedding_tables[name], rtol=0, atol=0)
        assert not torch.equal(table, SequenceModel().engine.embedding_tables[name])
    with torch.no_grad():  # the sequence feature's (B, 3, 4) activations, evaluated
        compiled.eval(), eager.eval()
        got = torch.compile(compiled.engine, backend="aot_eager", fullgraph=True)(features)
        assert got["s"].shape == (7, 3, 4)
        for name, acts in eager.engine(features).items():
            torch.testing.assert_close(got[name], acts, rtol=0, atol=0)


def test_stacked_raw_ragged_input_compiles_and_trains_as_eager() -> None:
    eager, compiled = TwoFeatures().engine, TwoFeatures().engine
    compiled.load_state_dict(eager.state_dict())
    stacked = torch.compile(compiled.stacked, backend="aot_eager", fullgraph=True)
    features, _ = INPUTS["ragged"]()
    want, got = eager.stacked(features), stacked(features)
    assert got.shape == (3, 2, 4)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    want.pow(2).sum().backward(), got.pow(2).sum().backward()
    for name, table in compiled.embedding_tables.items():
        torch.testing.assert_close(table, eager.embedding_tables[name], rtol=0, atol=0)


@pytest.mark.parametrize(
    ("features", "message"),
    [
        ({"a": ec.RaggedIds.from_lists([[1, 50]]), "b": ec.RaggedIds.from_lists([[2]])}, "50"),
        (StandInKJT(["a", "b"], torch.tensor([1, 2]), torch.tensor([1, 2])), "offsets must run"),
    ],
    ids=["ragged_id_out_of_range", "kjt_lengths_past_values"],
)
def test_bad_raw_input_raises_the_eager_error_inside_the_compiled_model(features, message) -> None:
    model = TwoFeatures()
    before = {n: t.clone() for n, t in model.engine.embedding_tables.items()}
    with pytest.raises(ValueError, match=message) as eager:
        model(features)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with pytest.raises(ValueError) as inside:
        compiled(features)
    assert str(inside.value) == str(eager.value)
    assert model.engine.step == 0
    for name, table in model.engine.embedding_tables.items():
        assert torch.equal(table, before[name])


def test_dense_ids_of_rank_three_train_compiled_as_eager() -> None:
    """``(B, k, 1)`` ids: the operators' activations and gradients are ``(B*k, dim)``, the
    engine's update checks them against the batch's (flat) samples."""
    t = ec.TableConfig(vocabulary_size=20, dim=4, name="t")
    eager, compiled = (
        ec.EmbeddingEngine({"x": ec.FeatureConfig(t)}, optimizer=ec.SGD(learning_rate=0.1))
        for _ in range(2)
    )
    forward = torch.compile(compiled, backend="aot_eager", fullgraph=True)
    ids = {"x": torch.randint(0, 20, (5, 3, 1))}
    want, got = eager(ids)["x"], forward(ids)["x"]
    assert got.shape == (5, 3, 4)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    (want * torch.arange(4.0)).sum().backward(), (got * torch.arange(4.0)).sum().backward()
    assert compiled.step == eager.step == 1
    torch.testing.assert_close(
        compiled.embedding_tables["t"], eager.embedding_tables["t"], rtol=0, atol=0
    )


#: in a fresh process, so that the engine's Numba kernels are first called under torch.compile
FRESH = """
import sys
import torch, torch._dynamo
sys.path[:0] = sys.argv[1:]
from compile_cases import INPUTS, TwoFeatures
eager, compiled = TwoFeatures(), TwoFeatures()
compiled.load_state_dict(eager.state_dict())
features, _ = INPUTS["sparse"]()
got = torch.compile(compiled, backend="eager")(features)
torch.testing.assert_close(got, eager(features), rtol=0, atol=0)
features, _ = INPUTS["ragged"]()
print(torch._dynamo.explain(TwoFeatures())(features).graph_break_count)
"""


@pytest.mark.slow
def test_sparse_input_runs_untraced_and_nothing_crashes_dynamo() -> None:
    """``torch.compile`` takes no sparse tensor: the engine's eager path runs (untraced: traced,
    the first call of a Numba kernel crashes dynamo in torch 2.13, building the frame to resume
    in after a graph break inside Numba's dispatcher). Then raw ragged input in the same process,
    explained: no graph break."""
    here = str(Path(__file__).parent)
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", FRESH, here, str(Path(here).parent)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "0"


def test_opcheck_the_raw_lookup_and_its_layout_errors() -> None:
    """Fake shapes agree with the kernels'; a layout that does not describe the tensors is
    refused by name before anything is looked up."""
    model = SequenceModel()
    features, weights = _batch(np.random.default_rng(1), 4, as_kjt=False)
    engine = model.engine
    tensors = [features["s"].values, features["s"].row_splits]
    tensors += [features["x"].values, features["x"].row_splits]
    tensors += [features["y"].values, features["y"].row_splits, weights["y"].values]
    tensors += [weights["y"].row_splits]
    anchor = torch.zeros(0, requires_grad=True)
    args = (engine._handle, tensors, "r,r,rw", [12, 4, 4], False, False, anchor)
    assert engine.feature_names == ["s", "x", "y"]
    torch.library.opcheck(torch.ops.embcore.lookup_raw.default, args, test_utils=CHECKS)
    for layout, message in (("r,r", "not one of d, r, rw"), ("r,r,r", "does not take")):
        with pytest.raises(ValueError, match=message):
            torch.ops.embcore.lookup_raw(engine._handle, tensors, layout, [12, 4, 4], False,
                                         False, anchor)  # fmt: skip
    with pytest.raises(ValueError, match="feature 'x': the input has 4 samples, samples says 5"):
        torch.ops.embcore.lookup_raw(engine._handle, tensors, "r,r,rw", [12, 5, 4], False,
                                     False, anchor)  # fmt: skip
