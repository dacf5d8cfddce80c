"""The one place where :mod:`embcore.checkpoint` looks inside an engine.

Everything else in the package sees an engine only through :class:`EngineView`:

- ``comm``: the ranks that save or load together (one process: world size 1);
- ``flush()``: apply a pipelined update still pending;
- ``tensors()``: every stored tensor as a :class:`StoredTensor` (key, logical shape, dtype,
  and how to get the boxes this rank writes or fills), ``step`` included;
- ``finish_load(keys)``: after the tensors ``keys`` were filled, drop what the engine computed
  before the load (a pending pipelined update, an enqueued batch);
- ``dynamic_tables()``, ``dynamic_state(table)``, ``load_dynamic_state(table, state)``: the
  tables whose row storage persists them by key (``store.records(t) == "keyed"``: dynamic
  tables), as a dict of arrays by key rather than fixed-shape tensors;
- ``describe()``, ``step``, ``world_size``, ``optimizer_types()``: what the manifest records.

The engine lists its tensors itself (``engine.checkpoint_tensors()``: the step, then its
table store's): a local store gives each tensor as one chunk at offset 0 (its live buffer,
filled in place), a sharded store the boxes each rank holds. See docs/reliability.md and
docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from embcore._comm import Comm
from embcore.dynamic import state_check
from embcore.engine import EmbeddingEngine
from embcore.initializers import slot_values

__all__ = ["EngineView", "StoredTensor", "table_of"]

Chunks = list[tuple[tuple[int, ...], Tensor]]


def table_of(key: str) -> str:
    """``'a.weight'`` -> ``'a'`` (``step`` has no table)."""
    return key.rsplit(".", 1)[0] if "." in key else key


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a checkpoint, as this rank sees it.

    Attributes:
        key: ``{table}.weight``, ``{table}.{slot}`` or ``step``.
        shape: the full logical shape, e.g. ``(vocab, dim)``.
        dtype: its dtype as a string (``"float32"``, ``"int64"``).
        save_chunks: ``() -> [(offsets, tensor)]``, the boxes this rank writes (together the
            ranks cover the tensor once). May communicate: every rank calls it, in order.
        load_chunks: ``() -> [(offsets, tensor)]``, the boxes this rank fills on load.
        finish_load: ``(chunks) -> None``, moves filled boxes into place (may communicate).
        touched_since, read_rows, checkpointed: given by a tensor that knows which rows were
            written since a checkpoint (a fixed table in ``DiskStorage``), else ``None``:
            ``touched_since(manifest sha256) -> (K,) int64`` ascending rows, or ``None`` when
            the table is not known to have equalled that checkpoint; ``read_rows(ids) ->
            (K, ...)`` their values; ``checkpointed(sha256 | None)``: the tensor now equals
            that checkpoint (a save or load of it just finished).
    """

    key: str
    shape: tuple[int, ...]
    dtype: str
    save_chunks: Callable[[], Chunks]
    load_chunks: Callable[[], Chunks]
    finish_load: Callable[[Chunks], None]
    touched_since: Callable[[str], np.ndarray | None] | None = None
    read_rows: Callable[[np.ndarray], Tensor] | None = None
    checkpointed: Callable[[str | None], None] | None = None

    @property
    def table(self) -> str:
        return table_of(self.key)

    @property
    def is_slot(self) -> bool:
        return self.key != "step" and not self.key.endswith(".weight")


def _numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().copy()
    return np.array(value, copy=True)


def _named(value: Any) -> Any:
    """A JSON value for a config field: callables by name, tuples as lists."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [_named(v) for v in value]
    if callable(value):
        name = getattr(value, "__qualname__", None) or type(value).__qualname__
        return f"<callable {getattr(value, '__module__', '?')}.{name}>"
    return repr(value)


class EngineView:
    """What a checkpoint reads and writes of ``engine`` (see the module docstring)."""

    def __init__(self, engine: Any, what: str) -> None:
        if not isinstance(engine, EmbeddingEngine):
            raise TypeError(
                f"embcore.checkpoint.{what}: expected an EmbeddingEngine, got "
                f"{type(engine).__name__}"
            )
        self._engine = engine
        self.comm: Comm = engine.store.comm  # the ranks that save or load together

    @property
    def engine(self) -> Any:
        return self._engine

    def flush(self) -> None:
        self._engine.flush()

    def table_names(self) -> list[str]:
        return [t.name for t in self._engine.tables]

    def dynamic_tables(self) -> list[str]:
        """The names of the tables persisted by key (dynamic tables), in engine order."""
        store = self._engine.store
        return [t.name for t in self._engine.tables if store.records(t.index) == "keyed"]

    def dynamic_state(self, table: str) -> dict[str, np.ndarray]:
        """A dynamic table's state: keys, frequencies, last-seen steps, pending counts, and
        weight and optimizer slots ``(R, ...)`` by ascending key (NumPy arrays, copies)."""
        state = self._engine.store.dynamic_state(self._index(table))
        return {k: _numpy(v) for k, v in state.items()}

    def load_dynamic_state(self, table: str, state: dict[str, np.ndarray]) -> None:
        """Replace a dynamic table's state with ``state`` (as :meth:`dynamic_state` gives)."""
        self._engine.store.load_dynamic_state(self._index(table), state)

    def dynamic_problems(self, table: str, state: dict[str, np.ndarray]) -> list[str]:
        """Why ``state`` cannot be this dynamic table's (empty: it can); see
        :func:`embcore.dynamic.state_check.problems`."""
        return state_check.problems(self._engine.tables[self._index(table)], state)

    def initial_slots(self, table: str, rows: int) -> dict[str, np.ndarray]:
        """A dynamic table's optimizer slots for ``rows`` new rows: ``{slot: (rows, ...)
        float32}`` at the optimizer's initial values (as a newly admitted key gets)."""
        t = self._engine.tables[self._index(table)]
        return {k: v.numpy() for k, v in slot_values(t.optimizer, rows, t.dim).items()}

    def _index(self, table: str) -> int:
        return next(t.index for t in self._engine.tables if t.name == table)

    @property
    def step(self) -> int:
        return self._engine.step

    @property
    def world_size(self) -> int:
        return self.comm.world

    def tensors(self) -> list[StoredTensor]:
        """Every tensor a checkpoint of this engine stores, ``step`` first (the dynamic
        tables' state is not among them: see :meth:`dynamic_state`)."""
        dynamic = set(self.dynamic_tables())
        return [
            StoredTensor(
                t.key,
                t.shape,
                str(t.dtype).removeprefix("torch."),
                t.chunks,
                t.load_chunks,
                t.finish_load,
                getattr(t, "touched_since", None),
                getattr(t, "read_rows", None),
                getattr(t, "checkpointed", None),
            )
            for t in self._engine.checkpoint_tensors()
            if table_of(t.key) not in dynamic
        ]

    def finish_load(self, keys: list[str]) -> None:
        """The tensors ``keys`` were filled: what was computed before the load is dropped."""
        self._engine.discard_pending()

    def optimizer_types(self) -> dict[str, str | None]:
        """``{table: optimizer class name}`` (``None``: lookup only)."""
        return {
            t.name: None if t.optimizer is None else type(t.optimizer).__name__
            for t in self._engine.tables
        }

    def describe(self) -> dict[str, Any]:
        """The engine's configuration as JSON values: tables, features, sharding."""
        engine = self._engine
        features = engine.features
        tables = []
        keyed = set(self.dynamic_tables())
        for t in engine.tables:
            opt = t.optimizer
            tables.append(
                {
                    "name": t.name,
                    "vocabulary_size": t.vocabulary_size,
                    "dim": t.dim,
                    "combiner": t.combiner,
                    "initializer": "default"
                    if t.config.initializer is None
                    else _named(t.config.initializer),
                    "optimizer": None
                    if opt is None
                    else {
                        "type": type(opt).__name__,
                        "hyperparameters": {k: _named(v) for k, v in opt.hyperparameters().items()},
                    },
                    "features": [features[i].name for i in t.features],
                }
            )
            if t.name in keyed:  # recorded, not enforced (as hyperparameters)
                tables[-1] |= {
                    k: None if v is None else dataclasses.asdict(v)
                    for k, v in (("admission", t.config.admission), ("eviction", t.config.eviction))
                }
        plan = engine.plan
        return {
            "engine": {"class": engine.store.engine_name, "seed": engine.seed},
            "tables": tables,
            "features": [
                {
                    "name": f.name,
                    "table": engine.tables[f.table].name,
                    "max_sequence_length": f.config.max_sequence_length,
                    "output_shape": _named(f.config.output_shape),
                }
                for f in features
            ],
            "sharding": "single process" if plan is None else json.loads(plan.to_json()),
        }
