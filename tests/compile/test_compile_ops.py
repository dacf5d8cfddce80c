"""The ``torch.ops.embcore`` operators themselves: fake shapes agree with the kernels'
(``torch.library.opcheck``), the per-feature ``forward`` trains compiled as eager, and every
engine (a copy included) is reached by its own handle."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch._dynamo
from engine_cases import BACKENDS

import embcore as ec
from embcore.ops import _library

#: opcheck's checks that run the operator as a pure function: its AOT check also runs the
#: backward, whose update changes the tables between the two forwards it compares
CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def _engine(pipeline: bool = False, backend: str = "auto") -> ec.EmbeddingEngine:
    a = ec.TableConfig(vocabulary_size=20, dim=4, name="a", combiner="mean")
    b = ec.TableConfig(vocabulary_size=30, dim=3, name="b")
    features = {"x": ec.FeatureConfig(a), "y": ec.FeatureConfig(a), "z": ec.FeatureConfig(b)}
    return ec.EmbeddingEngine(
        features, optimizer=ec.Adagrad(learning_rate=0.5), pipeline=pipeline, backend=backend
    )


def _ids(batch: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randint(0, 20, (batch,), generator=g),
        "y": torch.randint(0, 20, (batch, 1), generator=g),
        "z": torch.randint(0, 30, (batch,), generator=g),
    }


def test_opcheck_the_lookup_of_prepared_and_raw_ids() -> None:
    engine = _engine()
    ragged = ec.RaggedIds.from_lists([[1, 2, 2], [], [5]])
    prepared = engine.prepare({"x": ragged, "y": torch.tensor([3, 4, 5]), "z": ragged})
    batches = prepared.batches
    codes = [_library.COMBINERS.index(b.combiner) for b in batches]
    anchor = torch.zeros(0, requires_grad=True)
    values, offsets = [b.values for b in batches], [b.offsets for b in batches]
    weights = [b.weights for b in batches]
    args = (engine._handle, values, offsets, weights, codes, False, False, anchor)
    torch.library.opcheck(torch.ops.embcore.lookup.default, args, test_utils=CHECKS)
    raw = [ids.reshape(-1) for ids in _ids(5, 0).values()]
    args = (engine._handle, raw, [], [None] * 3, [], False, False, anchor)
    torch.library.opcheck(torch.ops.embcore.lookup.default, args, test_utils=CHECKS)


@pytest.mark.parametrize(("backend", "pipeline"), [(b, False) for b in BACKENDS] + [("auto", True)])
def test_the_compiled_per_feature_forward_trains_as_eager(backend: str, pipeline: bool) -> None:
    """Every kernel backend behind the operators (CPU, Triton where it runs, reference)."""
    eager, compiled = _engine(pipeline, backend), _engine(pipeline, backend)
    forward = torch.compile(compiled, backend="aot_eager", fullgraph=True)
    for step, batch in enumerate([7, 9, 11, 7]):
        ids = _ids(batch, step)
        want, got = eager(ids), forward(ids)
        for name in ("x", "y", "z"):
            torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)
        scale = torch.arange(1.0, 4.0)
        for acts in (want, got):
            (acts["x"].sum() + (acts["y"] ** 2).sum() + (acts["z"] * scale[:3]).sum()).backward()
    eager.flush(), compiled.flush()
    assert compiled.step == eager.step == 4
    for name, table in compiled.embedding_tables.items():
        torch.testing.assert_close(table, eager.embedding_tables[name], rtol=0, atol=0)


def test_a_copy_of_an_engine_has_its_own_handle_and_tables() -> None:
    engine = _engine()
    twin = copy.deepcopy(engine)
    assert twin._handle != engine._handle
    assert _library.target(twin._handle).engine is twin
    unpickled = pickle.loads(pickle.dumps(engine))
    assert len({unpickled._handle, twin._handle, engine._handle}) == 3
    assert _library.target(unpickled._handle).engine is unpickled
    with torch.no_grad():
        twin.store.rows[0].weight.fill_(1.0)  # table "a"
    ids = _ids(4, 0)
    for e, value in ((engine, None), (twin, 1.0)):
        got = torch.compile(e.eval(), backend="aot_eager", fullgraph=True)(ids)["x"]
        if value is None:
            assert not torch.all(got == 1.0)
        else:
            torch.testing.assert_close(got, torch.ones(4, 4))
    del engine
    with pytest.raises(RuntimeError, match="no engine has handle"):
        _library.target(twin._handle - 1)


@pytest.mark.parametrize("min_count", [1, 2])
def test_a_compiled_dynamic_table_counts_admits_and_trains_as_eager(min_count: int) -> None:
    """The operator passes the training flag through: a compiled training step admits keys
    (``min_count``) exactly as eager does; a compiled evaluation lookup inserts nothing."""

    def engine() -> ec.EmbeddingEngine:
        user = ec.TableConfig(
            vocabulary_size=None, dim=4, name="user",
            admission=ec.CountAdmission(min_count=min_count),
        )  # fmt: skip
        return ec.EmbeddingEngine({"u": ec.FeatureConfig(user)}, optimizer=ec.Adagrad(0.5))

    eager, compiled = engine(), engine()
    forward = torch.compile(compiled, backend="aot_eager", fullgraph=True)
    keys = [[-(2**63), 7, 7, 2**40], [7, 2**40, 5, 5, 2**63 - 1], [3, 7, -1]]
    for ids in keys:
        batch = {"u": torch.tensor(ids)}
        want, got = eager(batch), forward(batch)
        torch.testing.assert_close(got["u"], want["u"], rtol=0, atol=0)
        want["u"].pow(2).sum().backward()
        got["u"].pow(2).sum().backward()
    assert torch.equal(compiled.table_keys("user"), eager.table_keys("user"))
    held = eager.table_keys("user")
    assert held.numel() == (7 if min_count == 1 else 3)  # 1: every key; 2: 7, 2**40, 5
    torch.testing.assert_close(
        compiled.table_rows("user", held), eager.table_rows("user", held), rtol=0, atol=0
    )
    compiled.eval(), eager.eval()
    with torch.no_grad():
        got = forward({"u": torch.tensor([123456789, 7])})["u"]
    assert torch.equal(compiled.table_keys("user"), held)  # evaluation inserted nothing
    assert torch.equal(got[0], torch.zeros(4))
