"""A new kind of table storage is one class plus one registration (docs/architecture.md).

``ListStore`` below keeps each table as a plain ``ops.TableState`` (no module buffers) and
implements only the ``TableStore`` members; registered and chosen, it trains, saves and loads
through the unchanged engine, checkpoints included, exactly as the built-in local store.
"""

from __future__ import annotations

import sys
import types
from typing import Any, ClassVar

import numpy as np
import torch

import embcore as ec
from embcore import ops
from embcore._comm import Comm
from embcore.engine import _store
from embcore.initializers import initial_rows, initial_slots
from embcore.rows.dense import DenseTensor
from embcore.stats import StatsTable


class ListStore:
    name: ClassVar[str] = "list"
    engine_name: ClassVar[str] = "EmbeddingEngine"
    background_updates: ClassVar[bool] = False

    def __init__(self, config: _store.StoreConfig, plan: Any = None, process_group: Any = None):
        self.tables, self.backend, self.device = config.tables, config.backend, config.device
        self.states = []
        for t in self.tables:
            cfg = t.config
            w = initial_rows(t.name, cfg.vocabulary_size, cfg.dim, cfg.initializer, config.seed)
            self.states.append(ops.TableState(t.name, w, initial_slots(t, w), t.optimizer))
        self.plan, self.lookups, self.updates = None, 0, 0

    @property
    def comm(self) -> Comm:
        return Comm(None, self.device)

    def _tensor(self, t: int, name: str) -> torch.Tensor:
        return self.states[t].weight if name == "weight" else self.states[t].slots[name]

    def lookup(self, features, out, training=False):
        self.lookups += 1
        return ops.lookup(self.backend, self.states, features, out=out)

    def update(self, features, grads, rates, step):
        self.updates += 1
        ops.update(self.backend, self.states, features, grads, rates, step)

    def agree(self, error, non_finite):
        if error is not None:
            raise error
        return (0,) if non_finite else ()

    def gather(self, items):
        return [self._tensor(t, n) for t, n in items]

    def load_full(self, items):
        for t, n, value in items:
            self._tensor(t, n).copy_(value)

    def shape(self, t, name):
        return tuple(self._tensor(t, name).shape)

    def records(self, t):
        return "tensors"

    def flush_before_training_lookup(self):
        return False

    def tensors(self):
        return [
            DenseTensor(f"{t.name}.{n}", self._tensor(t.index, n))
            for t in self.tables
            for n in _store.stored_names(t)
        ]

    def stats_tables(self):
        return [StatsTable(t.name, t.vocabulary_size, t.dim, len(t.features)) for t in self.tables]

    def write_statistics(self, stats):
        return stats.flush()

    def describe(self, tables):
        return f"list store, {tables}"


def make(use_list_store: bool, monkeypatch) -> ec.EmbeddingEngine:
    if use_list_store:  # the one registration: an entry in STORES and the rule choosing it
        module = types.ModuleType("embcore_test_list_store")
        module.ListStore = ListStore
        monkeypatch.setitem(sys.modules, module.__name__, module)
        monkeypatch.setitem(_store.STORES, "list", f"{module.__name__}:ListStore")
        monkeypatch.setattr(_store, "choose_store", lambda plan, group: "list")
    else:
        monkeypatch.setattr(_store, "choose_store", lambda plan, group: "local")
    a = ec.TableConfig(vocabulary_size=7, dim=3, name="a", combiner="sum")
    b = ec.TableConfig(vocabulary_size=5, dim=3, name="b")
    features = {
        "x": ec.FeatureConfig(table=a),
        "y": ec.FeatureConfig(table=a),
        "z": ec.FeatureConfig(table=b),
    }
    return ec.EmbeddingEngine(features, optimizer=ec.Adagrad(learning_rate=0.2), seed=1)


def train(engine: ec.EmbeddingEngine, steps: int) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        batch = {
            "x": torch.randint(0, 7, (4,), generator=g),
            "y": ec.RaggedIds(
                torch.randint(0, 7, (6,), generator=g), torch.tensor([0, 2, 2, 5, 6])
            ),
            "z": torch.randint(0, 5, (4,), generator=g),
        }
        sum((v * v).sum() for v in engine(batch).values()).backward()


def test_a_registered_store_trains_like_the_local_one(monkeypatch):
    listed = make(True, monkeypatch)
    assert isinstance(listed.store, ListStore) and "list store" in repr(listed)
    train(listed, 3)
    assert (listed.store.lookups, listed.store.updates, listed.step) == (3, 3, 3)
    local = make(False, monkeypatch)
    train(local, 3)
    want = local.state_dict()
    got = listed.state_dict()
    assert list(got) == list(want)
    for key in want:
        np.testing.assert_array_equal(got[key].numpy(), want[key].numpy(), err_msg=key)


def test_a_registered_store_checkpoints_without_changes_elsewhere(monkeypatch, tmp_path):
    local = make(False, monkeypatch)
    train(local, 2)
    ec.checkpoint.save(local, tmp_path / "c")
    listed = make(True, monkeypatch)
    ec.checkpoint.load(listed, tmp_path / "c")
    for key, value in local.state_dict().items():
        np.testing.assert_array_equal(listed.state_dict()[key].numpy(), value.numpy())
    ec.checkpoint.save(listed, tmp_path / "d")
    fresh = make(False, monkeypatch)
    ec.checkpoint.load(fresh, tmp_path / "d")
    assert fresh.step == 2
    for key, value in local.state_dict().items():
        np.testing.assert_array_equal(fresh.state_dict()[key].numpy(), value.numpy())


def test_the_store_is_chosen_in_init_by_composition():
    assert "__new__" not in vars(ec.EmbeddingEngine)
    table = ec.TableConfig(vocabulary_size=4, dim=2, name="t")
    features = {"f": ec.FeatureConfig(table=table)}
    plan = ec.sharding.plan(features, 1)
    local, sharded = ec.EmbeddingEngine(features), ec.EmbeddingEngine(features, plan=plan)
    assert type(local) is type(sharded) is ec.EmbeddingEngine
    assert (local.store.name, sharded.store.name) == ("local", "sharded")
    assert isinstance(sharded, ec.sharding.ShardedEmbeddingEngine)
    assert not isinstance(local, ec.sharding.ShardedEmbeddingEngine)
