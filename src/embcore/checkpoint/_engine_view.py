"""The one place where :mod:`embcore.checkpoint` looks inside an engine.

Everything else in the package sees an engine only through :class:`EngineView`:

- ``comm``: the ranks that save or load together (one process: world size 1);
- ``flush()``: apply a pipelined update still pending;
- ``tensors()``: every stored tensor as a :class:`StoredTensor` (key, logical shape, dtype,
  and how to get the boxes this rank writes or fills), ``step`` included;
- ``finish_load(keys)``: after the tensors ``keys`` were filled, drop what the engine computed
  before the load (a pending pipelined update, an enqueued batch);
- ``describe()``, ``step``, ``world_size``, ``optimizer_types()``: what the manifest records.

A local engine stores each tensor as one chunk at offset 0 (its live buffer, filled in place);
a sharded engine lists the boxes each rank holds. When the engine becomes a front over a table
store, only this module changes. See docs/reliability.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from embcore.engine import EmbeddingEngine
from embcore.sharding.comm import Comm

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
    """

    key: str
    shape: tuple[int, ...]
    dtype: str
    save_chunks: Callable[[], Chunks]
    load_chunks: Callable[[], Chunks]
    finish_load: Callable[[Chunks], None]

    @property
    def table(self) -> str:
        return table_of(self.key)

    @property
    def is_slot(self) -> bool:
        return self.key != "step" and not self.key.endswith(".weight")


def _one_chunk(t: Tensor) -> Callable[[], Chunks]:
    return lambda: [((0,) * t.dim(), t)]


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
        from embcore.sharding.engine import ShardedEmbeddingEngine

        self._engine = engine
        self._sharded = isinstance(engine, ShardedEmbeddingEngine)
        # The group the checkpoint's ranks agree over (a plain engine: the default one).
        self.comm: Comm = engine.store.comm if self._sharded else Comm(None, engine.device)
        self._state: dict[str, Tensor] | None = None

    def flush(self) -> None:
        self._engine.flush()

    @property
    def step(self) -> int:
        return self._engine.step

    @property
    def world_size(self) -> int:
        return self.comm.world if self._sharded else 1

    def tensors(self) -> list[StoredTensor]:
        """Every tensor a checkpoint of this engine stores, ``step`` first."""
        engine = self._engine
        if not self._sharded:
            self._state = state = dict(engine.state_dict())  # the live buffers (flushed)
            return [
                StoredTensor(
                    key,
                    tuple(t.shape),
                    str(t.dtype).removeprefix("torch."),
                    _one_chunk(t),
                    _one_chunk(t),
                    lambda chunks: None,
                )
                for key, t in sorted(state.items(), key=lambda kv: kv[0] != "step")
            ]
        step = engine._step  # type: ignore[attr-defined]
        out = [StoredTensor("step", (), "int64", _one_chunk(step), _one_chunk(step), _noop)]
        for t in engine.store.tensors():
            out.append(
                StoredTensor(t.key, t.shape, "float32", t.chunks, t.load_chunks, t.finish_load)
            )
        return out

    def finish_load(self, keys: list[str]) -> None:
        """The tensors ``keys`` were filled: what was computed before the load is dropped."""
        engine = self._engine
        if self._sharded:
            engine.discard_pending()
            return
        assert self._state is not None, "tensors() first"
        # Copies the buffers onto themselves and resets what a load resets (pending batches).
        engine.load_state_dict({k: self._state[k] for k in keys}, strict=False)

    def optimizer_types(self) -> dict[str, str | None]:
        """``{table: optimizer class name}`` (``None``: lookup only)."""
        return {
            t.name: None if t.optimizer is None else type(t.optimizer).__name__
            for t in self._engine.tables
        }

    def describe(self) -> dict[str, Any]:
        """The engine's configuration as JSON values: tables, features, sharding."""
        engine = self._engine
        features = engine._features  # type: ignore[attr-defined]
        tables = []
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
        plan = getattr(engine, "plan", None)
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


def _noop(chunks: Chunks) -> None:
    pass
