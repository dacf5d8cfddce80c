"""The whole engine on a CUDA device (marked ``gpu``), against the reference backend on the CPU.

Every optimizer of the conformance list, every combiner and sequence features, the sharded
engine on one device (each scheme's protocol, messages to itself), dynamic tables, and the
``torch.ops.embcore`` operators under ``torch.compile``. ``scripts/gpu_check.sh`` runs these
first on a GPU machine. With ``EMBCORE_TEST_DEVICE=cpu`` (the script's ``--dry-run``, run in
the normal suite by tests/test_gpu_check.py) the same tests run on the CPU with the Triton
backend in its interpreter, one optimizer case per kind, so they cannot rot between GPU runs.

Results agree to float32 rounding, not bit for bit: Triton sums a bag's rows and a row's
gradients as trees (docs/gpu_backend.md).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch._dynamo
from engine_cases import OPTIMIZER_CASES, OptCase

import embcore as ec
from embcore.sharding import ShardingPlan, TableShard

pytestmark = pytest.mark.gpu

#: tests/conftest.py runs this module's gpu tests without CUDA when EMBCORE_TEST_DEVICE=cpu
RUNS_IN_DRY_RUN = True

DEVICE = torch.device(os.environ.get("EMBCORE_TEST_DEVICE", "cuda"))
DRY_RUN = DEVICE.type == "cpu"
#: the dry run keeps one case per optimizer kind (the interpreter is slow)
CASES = [c for i, c in enumerate(OPTIMIZER_CASES)
         if not DRY_RUN or c.kind not in {d.kind for d in OPTIMIZER_CASES[:i]}]  # fmt: skip
TOL = {"rtol": 1e-5, "atol": 1e-6}


def _features(vocab: int | None = 40) -> dict[str, ec.FeatureConfig]:
    a = ec.TableConfig(vocabulary_size=vocab, dim=7, name="a", combiner="mean")
    b = ec.TableConfig(vocabulary_size=vocab, dim=16, name="b", combiner="sqrtn")
    return {
        "x": ec.FeatureConfig(table=a),
        "y": ec.FeatureConfig(table=a, max_sequence_length=3),  # a sequence, shared table
        "z": ec.FeatureConfig(table=b),
    }


def _batches(steps: int, device: torch.device, keys: bool = False) -> list[tuple[dict, dict]]:
    """``(ids, weights)`` per step: multi-hot bags with duplicates and empty bags, per-id
    weights on ``x``; ``keys``: raw int64 keys instead of row ids."""
    gen = torch.Generator().manual_seed(3)
    out = []
    for _ in range(steps):

        def ids(n: int) -> torch.Tensor:
            raw = torch.randint(0, 40, (n,), generator=gen)
            return (raw * 0x9E3779B97F4A7C15 - 2**62 if keys else raw).to(device)

        lengths = [3, 0, 5, 1]
        offsets = torch.tensor([0, 3, 3, 8, 9], device=device)
        weights = (torch.rand(9, generator=gen) + 0.5).to(device)
        batch = {
            "x": ec.RaggedIds(ids(sum(lengths)), offsets),
            "y": ec.RaggedIds(ids(6), torch.tensor([0, 2, 2, 5, 6], device=device)),
            "z": ec.RaggedIds(ids(sum(lengths)), offsets),
        }
        out.append((batch, {"x": ec.RaggedIds(weights, offsets), "y": None, "z": None}))
    return out


def _train(engine: ec.EmbeddingEngine, batches: list[tuple[dict, dict]]) -> None:
    for batch, weights in batches:
        acts = engine(batch, weights)
        sum(((a.float() * (i + 1)) ** 2).sum() for i, a in enumerate(acts.values())).backward()


def _pair(opt: ec.Optimizer, vocab: int | None = 40, **options) -> tuple:
    """The engine on DEVICE with the Triton backend, and its twin on the CPU reference."""
    on_device = ec.EmbeddingEngine(
        _features(vocab), opt, backend="triton", device=DEVICE, seed=1, **options
    )
    reference = ec.EmbeddingEngine(_features(vocab), opt, backend="reference", seed=1)
    return on_device, reference


def _assert_same_tables(got: ec.EmbeddingEngine, want: ec.EmbeddingEngine) -> None:
    for name, table in want.embedding_tables.items():
        torch.testing.assert_close(got.embedding_tables[name].cpu(), table, **TOL, msg=name)
        for slot, value in want.slot_variables[name].items():
            torch.testing.assert_close(
                got.slot_variables[name][slot].cpu(), value, **TOL, msg=f"{name}/{slot}"
            )


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_optimizer_trains_like_the_reference(case: OptCase) -> None:
    on_device, reference = _pair(case.make())
    _train(on_device, _batches(3, DEVICE))
    _train(reference, _batches(3, torch.device("cpu")))
    _assert_same_tables(on_device, reference)


@pytest.mark.parametrize(
    "shard",
    [
        TableShard.table_wise(0),
        TableShard.row_wise([0], "div"),
        TableShard.row_wise([0], "mod"),
        TableShard.data_parallel(1),
    ],
    ids=["table_wise", "row_wise_div", "row_wise_mod", "data_parallel"],
)
def test_sharded_engine_on_one_device_equals_the_reference(shard: TableShard) -> None:
    plan = ShardingPlan(world_size=1, tables={"a": shard, "b": TableShard.column_wise([0], 16)})
    on_device, reference = _pair(ec.Adagrad(learning_rate=0.3), plan=plan)
    _train(on_device, _batches(2, DEVICE))
    _train(reference, _batches(2, torch.device("cpu")))
    _assert_same_tables(on_device, reference)


def test_dynamic_tables_on_the_device_match_the_reference() -> None:
    on_device, reference = _pair(ec.RowwiseAdagrad(learning_rate=0.3), vocab=None)
    _train(on_device, _batches(3, DEVICE, keys=True))
    _train(reference, _batches(3, torch.device("cpu"), keys=True))
    for name in ("a", "b"):
        keys = reference.table_keys(name)
        assert torch.equal(on_device.table_keys(name).cpu(), keys), name
        got, want = on_device.table_rows(name, keys), reference.table_rows(name, keys)
        torch.testing.assert_close(got.cpu(), want, **TOL, msg=name)


def test_compiled_training_on_the_device_matches_eager() -> None:
    """The custom operators under ``torch.compile`` in one graph (Inductor on CUDA; dynamo
    alone in the dry run, where Inductor would compile C++ for minutes) train as the eager
    engine does."""
    torch._dynamo.reset()
    opt = ec.Adagrad(learning_rate=0.3)
    compiled_engine, eager_engine = (
        ec.EmbeddingEngine(_features(), opt, backend="triton", device=DEVICE, seed=1)
        for _ in range(2)
    )

    def step(engine: ec.EmbeddingEngine, prepared: ec.PreparedBatch) -> torch.Tensor:
        acts = engine(prepared)
        return sum(((a * (i + 1)) ** 2).sum() for i, a in enumerate(acts.values()))

    compiled = torch.compile(step, backend="eager" if DRY_RUN else "inductor", fullgraph=True)
    for batch, weights in _batches(2, DEVICE):  # prepared: ragged ids break graphs raw
        compiled(compiled_engine, compiled_engine.prepare(batch, weights)).backward()
        step(eager_engine, eager_engine.prepare(batch, weights)).backward()
    _assert_same_tables(compiled_engine, eager_engine)
