"""The sharded engine in one process (a one-rank plan) and single-process checkpoints.

Without a process group the sharded engine runs every scheme's protocol with messages to
itself, so these fast tests pin the plumbing: it must equal the plain engine bit for bit.
Multi-rank equivalence is in ``test_sharded_multiprocess.py``.
"""

from __future__ import annotations

import copy
import re

import pytest
import sharding_harness as h
import torch

import embcore as ec
from embcore.sharding import ShardingPlan, TableShard
from embcore.sharding.compat import ShardedEmbeddingEngine
from embcore.sharding.schemes import SCHEMES, Scheme


def one_rank_cases() -> list[h.Case]:
    return [c for c in h.all_cases(1) if c.scheme != "auto"]


@pytest.mark.parametrize("case", one_rank_cases(), ids=lambda c: c.id)
def test_one_rank_sharded_engine_equals_the_plain_engine(case: h.Case):
    ref = h.reference(case)
    engine = ec.EmbeddingEngine(
        case.feature_config(case.init),
        h.ec_optimizer(case),
        plan=case.plan(),
        **case.engine_kwargs(),
    )
    assert isinstance(engine, ShardedEmbeddingEngine)
    acts = h.train(engine, case, [0])
    got = h.final_state(engine)
    for step in range(h.STEPS):
        for name, value in ref["acts"][step].items():
            assert torch.equal(acts[step][name], value), (step, name)
    for table, value in ref["tables"].items():
        assert torch.equal(got["tables"][table], value), table
        for slot, s in ref["slots"][table].items():
            assert torch.equal(got["slots"][table][slot], s), (table, slot)
    assert got["step"] == ref["step"] == h.STEPS


def test_every_scheme_is_in_the_conformance_list():
    # One registry: the plan format accepts exactly its names, each an implementation.
    assert ec.sharding.SCHEMES is SCHEMES
    for name, scheme in SCHEMES.items():
        assert issubclass(scheme, Scheme) and scheme.scheme == name
    with pytest.raises(ValueError, match=re.escape(f"scheme must be one of {list(SCHEMES)}")):
        TableShard(scheme="hybrid", ranks=(0,))
    assert {c.scheme.partition(":")[0] for c in h.all_cases(2)} >= set(ec.sharding.SCHEMES)


def test_engine_dispatch():
    fc = h.feature_config()
    plain = ec.EmbeddingEngine(fc, ec.SGD(learning_rate=0.1))
    assert type(plain) is ec.EmbeddingEngine
    assert type(copy.deepcopy(plain)) is ec.EmbeddingEngine
    one = ShardingPlan(world_size=1, tables={n: TableShard.table_wise(0) for n in "abc"})
    sharded = ec.EmbeddingEngine(fc, ec.SGD(learning_rate=0.1), plan=one)
    assert isinstance(sharded, ShardedEmbeddingEngine) and sharded.world_size == 1
    assert "plan=[a: table_wise on 0" in repr(sharded)
    with pytest.raises(ValueError, match=r"plan must be an embcore\.sharding\.ShardingPlan"):
        ec.EmbeddingEngine(fc, ec.SGD(learning_rate=0.1), plan={"world_size": 1})
    two = h.Case("row_wise:div", "sgd", 2).plan()
    with pytest.raises(ValueError, match="world_size=2, but the process group has 1 ranks"):
        ec.EmbeddingEngine(fc, ec.SGD(learning_rate=0.1), plan=two)


def test_state_dict_holds_the_full_logical_tables():
    case = h.Case("row_wise:mod", "adam", 1)
    fc, opt = h.feature_config(), h.ec_optimizer(case)
    sharded = ec.EmbeddingEngine(fc, opt, plan=case.plan(), backend="reference")
    plain = ec.EmbeddingEngine(fc, opt, backend="reference")
    h.train(sharded, case, [0])
    h.train(plain, case, [0])
    got, want = sharded.state_dict(), plain.state_dict()
    assert list(got) == list(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key
    fresh = ec.EmbeddingEngine(fc, opt, plan=case.plan(), seed=3)
    fresh.load_state_dict(want)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in want.items())
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: \"a.momenta\""):
        fresh.load_state_dict({k: v for k, v in want.items() if k != "a.momenta"})
    bad = dict(want, **{"b.weight": torch.zeros(3, 5)})
    with pytest.raises(RuntimeError, match=r"b.weight: expected shape \(2, 5\), got \(3, 5\)"):
        fresh.load_state_dict(bad)


# ------------------------------------------------------------------------- checkpoints
def trained(plan: ShardingPlan | None, optimizer: ec.Optimizer | None = None, seed: int = 0):
    case = h.Case("row_wise:div", "adagrad", 1)
    engine = ec.EmbeddingEngine(
        h.feature_config(), optimizer or h.ec_optimizer(case), plan=plan, seed=seed
    )
    h.train(engine, case, [0])
    return engine


def assert_same_state(a: ec.EmbeddingEngine, b: ec.EmbeddingEngine) -> None:
    sa, sb = h.final_state(a), h.final_state(b)
    assert sa["step"] == sb["step"]
    for table, value in sa["tables"].items():
        assert torch.equal(value, sb["tables"][table]), table
        for slot, s in sa["slots"][table].items():
            assert torch.equal(s, sb["slots"][table][slot]), (table, slot)


def test_checkpoint_round_trips_between_plain_and_sharded_engines(tmp_path):
    plain = trained(None)
    ec.checkpoint.save(plain, tmp_path / "plain")
    mod = h.Case("row_wise:mod", "adagrad", 1).plan()
    restored = ec.EmbeddingEngine(
        h.feature_config(), ec.Adagrad(learning_rate=0.5), plan=mod, seed=9
    )
    ec.checkpoint.load(restored, tmp_path / "plain")
    assert_same_state(restored, plain)
    ec.checkpoint.save(restored, tmp_path / "sharded")
    again = ec.EmbeddingEngine(h.feature_config(), ec.Adagrad(learning_rate=0.5), seed=11)
    ec.checkpoint.load(again, tmp_path / "sharded")
    assert_same_state(again, plain)


def test_checkpoint_loads_into_a_serving_engine_without_slots(tmp_path):
    plain = trained(None)
    ec.checkpoint.save(plain, tmp_path / "c")
    serving = ec.EmbeddingEngine(h.feature_config(), seed=5)  # optimizer=None: no slots
    ec.checkpoint.load(serving, tmp_path / "c")
    for table, value in plain.embedding_tables.items():
        assert torch.equal(serving.embedding_tables[table], value)
    assert serving.slot_variables == {"a": {}, "b": {}, "c": {}}


def test_checkpoint_load_refuses_what_does_not_fit(tmp_path):
    ec.checkpoint.save(trained(None), tmp_path / "c")
    adam = ec.EmbeddingEngine(h.feature_config(), ec.Adam())
    before = {k: v.clone() for k, v in adam.state_dict().items()}
    with pytest.raises(
        ValueError,
        match=r"table 'a': 'a\.momenta', 'a\.velocities' missing \(the checkpoint's optimizer "
        r"is Adagrad, the engine's Adam\)",
    ):
        ec.checkpoint.load(adam, tmp_path / "c")
    assert all(torch.equal(adam.state_dict()[k], v) for k, v in before.items())
    bigger = {
        "x": ec.FeatureConfig(table=ec.TableConfig(vocabulary_size=8, dim=4, name="a")),
    }
    with pytest.raises(
        ValueError, match=r"'a.weight' has shape \(7, 4\), the engine expects \(8, 4\)"
    ):
        ec.checkpoint.load(ec.EmbeddingEngine(bigger), tmp_path / "c")
    with pytest.raises(TypeError, match="expected an EmbeddingEngine"):
        ec.checkpoint.save(torch.nn.Linear(2, 2), tmp_path / "d")  # type: ignore[arg-type]


def test_checkpoint_is_a_plain_full_table(tmp_path):
    """The stored tensors are (vocab, dim), readable without embcore
    (docs/semantics.md §6 pitfall 22)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    mod = h.Case("row_wise:mod", "adagrad", 1).plan()
    engine = trained(mod)
    ec.checkpoint.save(engine, tmp_path / "c")
    dcp_to_torch_save(tmp_path / "c", tmp_path / "full.pt")
    stored = torch.load(tmp_path / "full.pt")
    assert sorted(stored) == sorted(engine.state_dict())
    for table, value in engine.embedding_tables.items():
        assert torch.equal(stored[f"{table}.weight"], value)


def test_keyed_reads_go_to_the_tables_scheme_and_refuse_dense_rows():
    """The store asks each table's scheme for reads by key: a one-rank key-hash table answers
    as the one-process engine does; a dense table's scheme refuses, naming the table, and the
    store changes nothing."""
    import dynamic_sharding_harness as d

    one, sharded = d.engine(None), d.engine(1)
    d.train(one, [0], range(3))
    d.train(sharded, [0], range(3))
    user = next(t.index for t in sharded.tables if t.name == "user")
    fixed = next(t.index for t in sharded.tables if t.name == "fixed")
    assert torch.equal(sharded.store.table_keys(user), one.store.table_keys(user))
    probe = d.PROBE
    assert torch.equal(sharded.store.table_rows(user, probe), one.store.table_rows(user, probe))
    assert sharded.store.table_info(user) == one.store.table_info(user)
    state = sharded.store.dynamic_state(user)
    for name, value in one.store.dynamic_state(user).items():
        assert torch.equal(torch.as_tensor(state[name]), torch.as_tensor(value)), name
    before = sharded.embedding_tables["fixed"].clone()
    for read in (
        lambda: sharded.store.table_keys(fixed),
        lambda: sharded.store.table_rows(fixed, torch.tensor([0, 1])),
        lambda: sharded.store.table_info(fixed),
        lambda: sharded.store.dynamic_state(fixed),
        lambda: sharded.store.load_dynamic_state(fixed, state),
    ):
        with pytest.raises(ValueError, match=r"table 'fixed' .* has no keyed rows"):
            read()
    with pytest.raises(ValueError, match="table 'user' is dynamic: its rows are loaded"):
        sharded.store.load_full([(user, "weight", torch.zeros(2, 4))])
    assert torch.equal(sharded.embedding_tables["fixed"], before)
    assert torch.equal(sharded.store.table_keys(user), one.store.table_keys(user))
