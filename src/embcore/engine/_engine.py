"""The embedding engine: tables, slots, lookups and in-engine updates, over a table store.

Two ways to train, with identical results:

* the TPU embedding API's calls: ``enqueue(batch)``, ``dequeue()`` for the activations, then
  ``apply_gradients(grads)`` with d(loss)/d(activation);
* PyTorch's: ``acts = engine(batch)``; ``loss.backward()`` runs the same update inside
  autograd's backward pass.

Either way the engine sums every row's gradient over all its occurrences (all features sharing
the table, all samples) and then applies the table's optimizer once per touched row
(docs/semantics.md §3.1). The tables live in a store (:mod:`embcore.engine._store`) chosen
when the engine is built; see docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from embcore import nest, ops
from embcore._validate import check_int
from embcore.config import ResolvedFeature, ResolvedTable, resolve
from embcore.engine._autograd import LookupWithUpdate, StackedLookupWithUpdate
from embcore.engine._batch import PreparedBatch, is_feature, stacked_shape
from embcore.engine._closing import Closing
from embcore.engine._compiled import attach_ops, compiled_lookup
from embcore.engine._dense_batch import dense_batches, dense_plan
from embcore.engine._dynamic import DynamicTablesAPI
from embcore.engine._enqueue import EnqueueDequeue, Pending
from embcore.engine._gradients import UpdatePath, check_gradients, check_policy
from embcore.engine._pipeline import UpdatePipeline, pipelining
from embcore.engine._placement import Placement
from embcore.engine._state_dict import StateDictMethods
from embcore.engine._store import (
    CounterTensor,
    StoreConfig,
    StoredTensor,
    TableStore,
    check_rounding,
    check_storage_dtype,
    make_store,
    stored_names,
)
from embcore.inputs import FeatureBatch, to_feature_batch
from embcore.keyed_jagged import unpack_keyed_jagged
from embcore.optimizers.base import Optimizer
from embcore.stats import StatsCollector

__all__ = ["EmbeddingEngine"]


class EmbeddingEngine(
    Closing, Placement, EnqueueDequeue, UpdatePath, DynamicTablesAPI, StateDictMethods, nn.Module
):
    """Embedding tables with their optimizers, looked up and trained as on a TPU.

    Args:
        feature_config: a :class:`FeatureConfig`, or any nesting of dicts, lists and tuples of
            them; activations come back in the same structure (dict keys in any order).
        optimizer: the global optimizer for tables without their own; ``None`` allows
            lookup-only tables (training them raises).
        seed: seeds the default initializer; a table's values depend only on the seed and the
            table's name.
        device: where tables, slots and activations live (default CPU).
        backend: kernel backend, ``"auto"`` or a name in ``embcore.ops.BACKENDS``.
        pipeline: pipelined training (docs/semantics.md §4.5): step N's update is applied
            after step N+1's lookup, so step N+1's activations do not include step N's update
            (one step stale). Faster on hardware that overlaps the two; not equivalent to the
            default. ``pipeline_execution_with_tensor_core`` is TF's name for it (either may
            be given; both must then agree).
        profile_data_directory: collect lookup statistics (docs/semantics.md §4.6) on about
            ``profile_sample_rate`` of the batches; :meth:`write_statistics` writes them there.
        non_finite_gradients: ``"raise"`` (default): a NaN or Inf activation gradient raises
            ``ValueError`` naming the feature and table, and nothing is updated; ``"skip"``:
            the step's update is dropped and counted in :attr:`skipped_steps`.
        storage_dtype: how tables are stored: ``torch.float32`` (default), or
            ``torch.float16`` / ``torch.bfloat16`` with the ``"triton"`` backend (float32 slots
            and optimizer math, rows rounded once when stored; docs/gpu_backend.md).
        stochastic_rounding: round half-precision rows stochastically (unbiased) instead of
            to nearest when they are stored; needs a float16 / bfloat16 ``storage_dtype``.
        plan: an ``embcore.sharding.ShardingPlan``: shard the tables by it. Under an
            initialized process group of several ranks (``torchrun``) the engine shards its
            tables over the ranks, by this plan or by the planner's, and computes what one
            process computes on all ranks' batches (docs/sharding.md).
        process_group: shard over this group instead of the default one.
        storage: where the tables without a ``storage`` of their own keep their rows:
            ``None`` in memory, or an :class:`~embcore.DiskStorage`, whose ``cache_bytes``
            is then shared by those tables (docs/disk_tables.md).

    Example::

        video = ec.TableConfig(vocabulary_size=1000, dim=8, name="video")
        emb = ec.EmbeddingEngine({"watched": ec.FeatureConfig(table=video)},
                                 optimizer=ec.Adagrad(learning_rate=0.1))
        acts = emb({"watched": torch.tensor([3, 7])})       # {"watched": (2, 8)}
        acts["watched"].sum().backward()                    # updates rows 3 and 7
    """

    def __init__(
        self,
        feature_config: Any,
        optimizer: Optimizer | None = None,
        *,
        seed: int = 0,
        device: torch.device | str | None = None,
        backend: str = "auto",
        pipeline: bool | None = None,
        pipeline_execution_with_tensor_core: bool | None = None,
        profile_data_directory: str | None = None,
        profile_sample_rate: float = 0.03,
        non_finite_gradients: str = "raise",
        storage_dtype: torch.dtype = torch.float32,
        stochastic_rounding: bool = False,
        plan: Any = None,
        process_group: Any = None,
        storage: Any = None,
    ) -> None:
        super().__init__()
        self._features, self._tables = resolve(feature_config, optimizer, storage)
        self._dense_plan = dense_plan(self._features, self._tables)  # one-id inputs at once
        self._structure = feature_config
        self.seed = check_int("EmbeddingEngine", "seed", seed, minimum=0)
        device = torch.device("cpu" if device is None else device)
        self.backend = ops.default_backend(device) if backend == "auto" else backend
        self._backend = ops.resolve(self.backend)
        self.storage_dtype = check_storage_dtype(storage_dtype, self._backend)
        self.stochastic_rounding = check_rounding(stochastic_rounding, self.storage_dtype)
        self.pipelined = pipelining(pipeline, pipeline_execution_with_tensor_core)
        self.non_finite_gradients = check_policy(non_finite_gradients)
        config = StoreConfig(tuple(self._tables), self.seed, device, self._backend,
                             self.storage_dtype, feature_config, optimizer,
                             stochastic_rounding)  # fmt: skip
        self.store: TableStore = make_store(config, plan=plan, process_group=process_group)
        self._evicting = self.store.flush_before_training_lookup()
        self.register_buffer("_step", torch.zeros((), dtype=torch.int64))
        attach_ops(self)  # the torch.ops.embcore operators' way to this engine
        self.skipped_steps = 0
        self._pending: Pending | None = None
        self._pipeline = UpdatePipeline()
        self._stats = None
        if profile_data_directory is not None:
            self._stats = StatsCollector(
                profile_data_directory,
                self.store.stats_tables(),
                sample_rate=profile_sample_rate,
                seed=self.seed,
                world_size=self.store.comm.world,
            )

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        attach_ops(self)  # a copy (deepcopy, pickle) gets its own operator handle
        self._dense_plan = dense_plan(self._features, self._tables)  # also for older pickles

    # ------------------------------------------------------------------------ properties
    @property
    def feature_names(self) -> list[str]:
        """Feature names in ``tf.nest`` order (the order of activations and gradients)."""
        return [f.name for f in self._features]

    @property
    def table_names(self) -> list[str]:
        """Table names in order of first use."""
        return [t.name for t in self._tables]

    @property
    def tables(self) -> tuple[ResolvedTable, ...]:
        """The resolved tables: final names, optimizers and the features that read them."""
        return tuple(self._tables)

    @property
    def structure(self) -> Any:
        """The feature config as given: the nest (dicts, lists, tuples) of ``FeatureConfig``
        leaves that :meth:`forward` takes inputs in and returns activations in."""
        return self._structure

    @property
    def features(self) -> tuple[ResolvedFeature, ...]:
        """The resolved features, in :attr:`feature_names` order (their tables by index)."""
        return tuple(self._features)

    @property
    def embedding_tables(self) -> dict[str, Tensor]:
        """``{table name: (vocab, dim)}``: the live tensors of one process; with sharded
        tables, full copies gathered on every rank (a collective: every rank must ask); for a
        dynamic table a copy of its rows in :meth:`table_keys` order."""
        self._pipeline.wait()
        full = self.store.gather([(t.index, "weight") for t in self._tables])
        return {t.name: w for t, w in zip(self._tables, full, strict=True)}

    @property
    def slot_variables(self) -> dict[str, dict[str, Tensor]]:
        """``{table name: {slot name: tensor}}`` (``{}`` for SGD), as :attr:`embedding_tables`."""
        self._pipeline.wait()
        names = [(t, stored_names(t)[1:]) for t in self._tables]
        full = iter(self.store.gather([(t.index, n) for t, slots in names for n in slots]))
        return {t.name: {n: next(full) for n in slots} for t, slots in names}

    @property
    def step(self) -> int:
        """Number of updates applied so far."""
        self._pipeline.wait()
        return int(self._step)

    def extra_repr(self) -> str:
        parts = [
            f"{t.name}: {'dynamic ' if t.dynamic else t.vocabulary_size}x{t.dim} {t.combiner} "
            f"{type(t.optimizer).__name__ if t.optimizer else 'no optimizer'}"
            for t in self._tables
        ]
        return self.store.describe(f"backend={self.backend!r}, tables=[{'; '.join(parts)}]")

    # ------------------------------------------------------------------------ state dict
    def checkpoint_tensors(self) -> list[StoredTensor]:
        """``step`` and every stored tensor (:meth:`TableStore.tensors`), as checkpoints
        write and read them (call :meth:`flush` first, :meth:`discard_pending` after a load)."""
        return [CounterTensor("step", self._step), *self.store.tensors()]

    def discard_pending(self) -> None:
        """Drop a pipelined update not yet applied and a batch between ``enqueue`` and
        ``apply_gradients``: what replacing the tables' values (a load) requires."""
        self._pipeline.discard()
        self._pending = None

    # ---------------------------------------------------------------------------- inputs
    def _prepare(self, features: Any, weights: Any, observe: bool = True) -> list[FeatureBatch]:
        features, weights = unpack_keyed_jagged(features, weights)  # TorchRec's KJT, by key
        ids = self._flatten(features, "features")
        if weights is None:
            ws: list[Any] = [None] * len(ids)
        else:
            ws = nest.map_up_to(
                self._structure, weights, "weights", is_leaf=is_feature, missing_ok=True
            )
        device = self.device
        batches = None if weights is not None else dense_batches(self._dense_plan, ids, device)
        if batches is None:  # any input but one-id dense ids, and every bad input
            batches = [
                to_feature_batch(f, self._tables[f.table], x, w, device)
                for f, x, w in zip(self._features, ids, ws, strict=True)
            ]
        if observe and self._stats is not None:  # observe: sample lookup statistics
            self._stats.maybe_observe(self._by_table(batches))
        return batches

    def _flatten(self, structure: Any, what: str) -> list[Any]:
        return nest.map_up_to(self._structure, structure, what, is_leaf=is_feature)

    def prepare(self, features: Any, weights: Any = None) -> PreparedBatch:
        """Validate and convert a batch ahead of time (see :class:`PreparedBatch`); tables in
        ``DiskStorage`` start reading its rows that are not cached.

        The batch's tensors are made outside ``torch.inference_mode`` (whose tensors have no
        version counter), so that a change made to them in place later is seen: every use of
        the batch then refuses it (:meth:`PreparedBatch.check_unchanged`)."""
        if torch.is_inference_mode_enabled():
            with torch.inference_mode(False):
                return self.prepare(features, weights)
        batches = tuple(self._prepare(features, weights))
        prefetch = getattr(self.store, "prefetch", None)
        if prefetch is not None:
            prefetch(self._by_table(list(batches)))
        self._ops.prepared(batches)  # valid: the operators need not check it again
        return PreparedBatch(batches, id(self)).seal(self._ops)

    def _batches(self, features: Any, weights: Any, caller: str) -> list[FeatureBatch]:
        """A batch's converted features: ``features`` converted now, or a PreparedBatch of this
        engine, refused if it was changed in place after it was prepared."""
        if not isinstance(features, PreparedBatch):
            return self._prepare(features, weights)
        if features.engine != id(self):
            raise ValueError("EmbeddingEngine: this PreparedBatch was prepared by another engine")
        if weights is not None:
            raise ValueError("EmbeddingEngine: pass weights to prepare(), not with a PreparedBatch")
        features.check_unchanged(self._ops, self._features, caller)
        return list(features.batches)

    def _by_table(self, flat: list[Any]) -> list[list[Any]]:
        return [[flat[i] for i in t.features] for t in self._tables]

    def _lookup(
        self, batches: list[FeatureBatch], out: Tensor | None = None, training: bool = False
    ) -> list[Tensor]:
        """``(S_f, dim)`` activations of every feature, flat in feature order; with ``out``
        (``(S, F, dim)``-shaped), written into its ``[:, f, :]`` slices. ``training``: a
        training lookup (dynamic tables count and admit its keys)."""
        self._check_open()
        if training and self._evicting:  # the pending update's step end may evict and free rows
            self._pipeline.flush()
        self._pipeline.wait()
        slices = None
        if out is not None:
            flat_out = out.view(-1, len(batches), out.shape[-1])
            slices = self._by_table(list(flat_out.unbind(1)))  # one call for every slice
        with torch.no_grad():
            per_table = self.store.lookup(self._by_table(batches), slices, training)
        # pipelined: the previous step's update lands after this step's lookup; on the CPU it
        # runs in the background while the caller computes on these activations
        self._pipeline.after_lookup(self.store.background_updates)
        flat: list[Tensor | None] = [None] * len(batches)
        for t, acts in zip(self._tables, per_table, strict=True):
            for i, act in zip(t.features, acts, strict=True):
                flat[i] = act
        return flat  # type: ignore[return-value]

    def _pack(self, flat: list[Tensor], batches: list[FeatureBatch]) -> Any:
        shaped = [
            a.view(*b.output_shape, self._tables[f.table].dim)
            for a, b, f in zip(flat, batches, self._features, strict=True)
        ]
        return nest.pack(self._structure, shaped, is_leaf=is_feature)

    # --------------------------------------------------------------------------- updates
    def _apply_gradients(
        self,
        batches: list[FeatureBatch],
        grads: list[Any],
        whole: Tensor | None = None,
        missing: Callable[[list[str]], None] | None = None,
        checked: bool = False,
    ) -> None:
        """The one path from a step's gradients to its update, for autograd, the compiled
        operator and ``apply_gradients``: each feature's gradient (``None``: zeros) checked
        and shaped to ``(S, dim) float32``; ``missing(names)`` told of the features without
        one when all are valid (``checked``: they are ``(S_f, dim) float32`` already, slices of
        ``whole``); then one optimizer step of every table (or, pipelined, kept
        until after the next lookup), once every rank agrees the gradients are valid and
        finite. The learning rates are read now, with the step's gradients
        (docs/semantics.md §3.13). ``whole``, when given, holds every gradient (a stacked
        one), checked in one contiguous pass."""
        if checked:  # (S_f, dim) float32 slices of one gradient autograd shaped
            self._update(batches, grads, None, whole)
            return
        shaped, error = check_gradients(self._features, self._tables, batches, grads, self.device)
        none = [f.name for f, g in zip(self._features, grads, strict=True) if g is None]
        if missing is not None and none and error is None:
            missing(none)
        self._update(batches, shaped, error, whole)

    def flush(self) -> None:
        """Apply a pipelined update still waiting for the next lookup (no-op otherwise)."""
        self._pipeline.flush()

    def write_statistics(self) -> list[str]:
        """Write the lookup statistics collected so far (``profile_data_directory``); with
        sharded tables a collective, rank 0 writing every rank's statistics summed."""
        if self._stats is None:
            raise RuntimeError(
                "EmbeddingEngine.write_statistics: no profile_data_directory was given"
            )
        return [str(p) for p in self.store.write_statistics(self._stats)]

    # ------------------------------------------------------------------------- PyTorch
    def forward(self, features: Any, weights: Any = None) -> Any:
        """Look up a batch; in training mode under autograd, ``backward`` applies the update.

        Args and returns as :meth:`enqueue` and :meth:`dequeue`. Outside training mode, under
        ``torch.no_grad()``, or with lookup-only tables, this is a plain lookup.
        """
        if (out := compiled_lookup(self, features, weights, stacked=False)) is not None:
            return out
        return self._forward(features, weights)

    @torch.compiler.disable  # never traced (engine/_compiled.py: _eager)
    def _forward(self, features: Any, weights: Any) -> Any:
        batches = self._batches(features, weights, "forward")
        if not self._trains():
            return self._pack(self._lookup(batches), batches)
        anchor = torch.zeros(0, requires_grad=True)
        prepared = _prepared(features)
        return self._pack(list(LookupWithUpdate.apply(anchor, self, batches, prepared)), batches)

    def _trains(self) -> bool:
        trainable = all(t.optimizer is not None for t in self._tables)
        return self.training and torch.is_grad_enabled() and trainable

    def stacked(self, features: Any, weights: Any = None) -> Tensor:
        """Look up a batch into one tensor: feature ``f``'s activation at ``[..., f, :]``.

        Where every feature has the same output shape and dim (a DLRM's categorical fields),
        this is ``torch.stack(list_of_activations, dim=-2)`` without the copy, forward or
        backward: the kernels write each feature's rows straight into their slice, and the
        backward reads the gradient's slices in place. Training works as in :meth:`forward`.

        Args:
            features, weights: as :meth:`forward` (or a :class:`PreparedBatch`).

        Returns:
            ``(*output_shape, F, dim) float32``, features in :attr:`feature_names` order;
            ``(B, F, dim)`` for pooled features.

        Raises:
            ValueError: the features differ in output shape or dim (naming them).
        """
        if (out := compiled_lookup(self, features, weights, stacked=True)) is not None:
            return out
        return self._stacked(features, weights)

    @torch.compiler.disable  # never traced (engine/_compiled.py: _eager)
    def _stacked(self, features: Any, weights: Any) -> Tensor:
        batches = self._batches(features, weights, "stacked")
        shape = stacked_shape(self._features, self._tables, [b.output_shape for b in batches])
        if not self._trains():
            out = torch.empty(shape, dtype=torch.float32, device=self.device)
            self._lookup(batches, out=out)
            return out
        anchor = torch.zeros(0, requires_grad=True)
        return StackedLookupWithUpdate.apply(anchor, self, batches, shape, _prepared(features))


def _prepared(features: Any) -> PreparedBatch | None:
    """``features`` if it is a PreparedBatch (which the update checks again), else ``None``."""
    return features if isinstance(features, PreparedBatch) else None
