"""The embedding engine on one process: tables, slots, lookups and in-engine updates.

Two ways to train, with identical results:

* the seeds' style: ``enqueue(batch)``, ``dequeue()`` for the activations, then
  ``apply_gradients(grads)`` with d(loss)/d(activation);
* the PyTorch style: ``acts = engine(batch)``; ``loss.backward()`` runs the same update inside
  autograd's backward pass.

Either way the engine sums every row's gradient over all its occurrences (all features sharing
the table, all samples) and then applies the table's optimizer once per touched row (SPEC 3.1).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from embcore import nest, ops
from embcore._autograd import LookupWithUpdate, StackedLookupWithUpdate
from embcore._queue import Pending, QueueStyle, is_feature
from embcore._validate import check_int
from embcore.config import ResolvedFeature, ResolvedTable, resolve
from embcore.initializers import initial_rows, initial_slots
from embcore.inputs import FeatureBatch, to_feature_batch
from embcore.optimizers.base import Optimizer
from embcore.stats import StatsCollector, StatsTable

__all__ = ["EmbeddingEngine", "PreparedBatch"]


#: The thread that applies pipelined updates on the CPU (one for every engine: updates from
#: several engines run one after another, each still overlapping its own engine's next step).
_update_thread = ThreadPoolExecutor(1, thread_name_prefix="embcore-update")


#: table storage dtypes -> the backends that can update them (slots and math stay float32)
_STORAGE_BACKENDS = {
    torch.float32: None,  # every backend
    torch.float16: ("triton",),
    torch.bfloat16: ("triton",),
}


def _storage_dtype(value: Any, backend: str) -> torch.dtype:
    """Check ``storage_dtype`` against the dtypes the chosen backend stores."""
    if not isinstance(value, torch.dtype) or value not in _STORAGE_BACKENDS:
        raise ValueError(
            f"EmbeddingEngine: storage_dtype must be torch.float32, torch.float16 or "
            f"torch.bfloat16, got {value!r}"
        )
    allowed = _STORAGE_BACKENDS[value]
    if allowed is not None and backend not in allowed:
        raise ValueError(
            f"EmbeddingEngine: storage_dtype={value} needs backend 'triton' (CUDA tables with "
            f"Triton installed), got backend {backend!r}; use storage_dtype=torch.float32 on "
            "the CPU and reference backends"
        )
    return value


@dataclass(frozen=True, eq=False)
class PreparedBatch:
    """A batch validated and converted by :meth:`EmbeddingEngine.prepare`.

    Preparing is pure work on the inputs (no table is read), so it can run in another thread
    while the previous step computes; ``enqueue`` and ``forward`` accept the result.
    """

    batches: tuple[FeatureBatch, ...]
    engine: int  # id() of the engine that prepared it


class EmbeddingEngine(QueueStyle, nn.Module):
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
        pipeline_execution_with_tensor_core: pipelined training (SPEC 4.5): step N's update
            is applied after step N+1's lookup, so step N+1's activations do not include step
            N's update (one step stale). Faster on hardware that overlaps the two; not
            equivalent to the default. ``pipeline`` is a short alias.
        profile_data_directory: collect lookup statistics (SPEC 4.6) on about
            ``profile_sample_rate`` of the batches; :meth:`write_statistics` writes them there.
        non_finite_gradients: ``"raise"`` (default): a NaN or Inf activation gradient raises
            ``ValueError`` naming the feature and table, and nothing is updated; ``"skip"``:
            the step's update is dropped and counted in :attr:`skipped_steps`.
        storage_dtype: how tables are stored: ``torch.float32`` (default), or
            ``torch.float16`` / ``torch.bfloat16`` with the ``"triton"`` backend (float32 slots
            and optimizer math, rows rounded once when stored; docs/gpu_backend.md).
        plan: an ``embcore.sharding.ShardingPlan``. Under an initialized process group of
            several ranks (``torchrun``) the engine shards its tables over the ranks, by this
            plan or by the planner's, and computes what one process computes on all ranks'
            batches (docs/sharding.md).

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
        pipeline_execution_with_tensor_core: bool = False,
        pipeline: bool | None = None,
        profile_data_directory: str | None = None,
        profile_sample_rate: float = 0.03,
        plan: Any = None,
        non_finite_gradients: str = "raise",
        storage_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self._features, self._tables = resolve(feature_config, optimizer)
        self._structure = feature_config
        self.seed = check_int("EmbeddingEngine", "seed", seed, minimum=0)
        device = torch.device("cpu" if device is None else device)
        self.backend = ops.default_backend(device) if backend == "auto" else backend
        ops.get_backend(self.backend)
        self.storage_dtype = _storage_dtype(storage_dtype, self.backend)
        if plan is not None:
            raise ValueError(
                f"{type(self).__name__}: plan= is for the sharded engine; construct "
                "embcore.EmbeddingEngine (or embcore.sharding.ShardedEmbeddingEngine) with it"
            )
        self._build_tables(device)
        self.register_buffer("_step", torch.zeros((), dtype=torch.int64))
        self._pending: Pending | None = None
        if pipeline is not None and bool(pipeline) != bool(pipeline_execution_with_tensor_core):
            if pipeline_execution_with_tensor_core:
                raise ValueError(
                    "EmbeddingEngine: pipeline and pipeline_execution_with_tensor_core disagree; "
                    "pass only one of them"
                )
            pipeline_execution_with_tensor_core = bool(pipeline)
        if non_finite_gradients not in ("raise", "skip"):
            raise ValueError(
                "EmbeddingEngine: non_finite_gradients must be 'raise' or 'skip', got "
                f"{non_finite_gradients!r}"
            )
        self.non_finite_gradients = non_finite_gradients
        self.skipped_steps = 0
        self.pipelined = bool(pipeline_execution_with_tensor_core)
        self._deferred: tuple[list[FeatureBatch], list[Tensor], list[float]] | None = None
        # pipelined on the CPU, the deferred update runs on a background thread (the CPU
        # backend's kernels release the GIL) while the caller computes; ``_wait`` joins it
        self._inflight: Future | None = None
        self._states_cache: tuple[tuple[Tensor, ...], list[ops.TableState]] | None = None
        self._stats = None
        if profile_data_directory is not None:
            tables = [
                StatsTable(t.name, t.vocabulary_size, t.dim, len(t.features)) for t in self._tables
            ]
            self._stats = StatsCollector(
                profile_data_directory, tables, sample_rate=profile_sample_rate, seed=self.seed
            )

    def __new__(cls, *args: Any, **kwargs: Any) -> EmbeddingEngine:
        # Under a process group of several ranks, or given plan=, build the sharded engine
        # (embcore.sharding): the same interface, with the tables split over the ranks.
        if cls is EmbeddingEngine and (args or kwargs):
            from embcore.sharding.engine import ShardedEmbeddingEngine, wants_sharding

            if wants_sharding(kwargs):
                cls = ShardedEmbeddingEngine
        return super().__new__(cls)

    # ----------------------------------------------------------------------------- state
    def _build_tables(self, device: torch.device) -> None:
        """Create every table and its slots (the sharded engine creates only its shards)."""
        for table in self._tables:
            cfg = table.config
            weight = initial_rows(
                table.name, cfg.vocabulary_size, cfg.dim, cfg.initializer, self.seed
            ).to(device=device, dtype=self.storage_dtype)
            self.register_buffer(f"_w{table.index}", weight)
            for name, value in initial_slots(table, weight).items():
                self.register_buffer(f"_s{table.index}_{name}", value)

    def _weight(self, table: ResolvedTable) -> Tensor:
        return getattr(self, f"_w{table.index}")

    def _slots(self, table: ResolvedTable) -> dict[str, Tensor]:
        if table.optimizer is None:
            return {}
        return {
            s.name: getattr(self, f"_s{table.index}_{s.name}") for s in table.optimizer.slot_specs()
        }

    def _state(self, table: ResolvedTable) -> ops.TableState:
        return ops.TableState(table.name, self._weight(table), self._slots(table), table.optimizer)

    def _states(self) -> list[ops.TableState]:
        """Every table's state, rebuilt only when a buffer was replaced (``.to()``, assignment):
        backends cache per-state work (descriptors, checks) on these objects."""
        buffers = tuple(self._buffers.values())
        cached = self._states_cache
        if (
            cached is None
            or len(cached[0]) != len(buffers)
            or any(a is not b for a, b in zip(cached[0], buffers, strict=True))
        ):
            cached = self._states_cache = (buffers, [self._state(t) for t in self._tables])
        return cached[1]

    @property
    def device(self) -> torch.device:
        return self._weight(self._tables[0]).device

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
    def embedding_tables(self) -> dict[str, Tensor]:
        """``{table name: (vocab, dim) float32}``, the live tensors."""
        self._wait()
        return {t.name: self._weight(t) for t in self._tables}

    @property
    def slot_variables(self) -> dict[str, dict[str, Tensor]]:
        """``{table name: {slot name: tensor}}``, the live tensors (``{}`` for SGD)."""
        self._wait()
        return {t.name: self._slots(t) for t in self._tables}

    @property
    def step(self) -> int:
        """Number of updates applied so far."""
        self._wait()
        return int(self._step)

    def extra_repr(self) -> str:
        parts = [
            f"{t.name}: {t.vocabulary_size}x{t.dim} {t.combiner} "
            f"{type(t.optimizer).__name__ if t.optimizer else 'no optimizer'}"
            for t in self._tables
        ]
        return f"backend={self.backend!r}, tables=[{'; '.join(parts)}]"

    # ------------------------------------------------------------------------ state dict
    def _state_keys(self, prefix: str) -> dict[str, str]:
        """State-dict key -> buffer name: ``{table}.weight``, ``{table}.{slot}``, ``step``."""
        keys = {f"{prefix}step": "_step"}
        for t in self._tables:
            keys[f"{prefix}{t.name}.weight"] = f"_w{t.index}"
            for name in self._slots(t):
                keys[f"{prefix}{t.name}.{name}"] = f"_s{t.index}_{name}"
        return keys

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        self.flush()  # a checkpoint drains the pipeline, as a TPU training loop ends drained
        for key, buffer in self._state_keys(prefix).items():
            value = getattr(self, buffer)
            destination[key] = value if keep_vars else value.detach()

    def _load_from_state_dict(
        self,
        state_dict: dict,
        prefix: str,
        local_metadata: dict,
        strict: bool,
        missing_keys: list,
        unexpected_keys: list,
        error_msgs: list,
    ) -> None:
        keys = self._state_keys(prefix)
        errors, missing = [], []
        for key, buffer in keys.items():
            if key not in state_dict:
                missing.append(key)
                continue
            value, current = state_dict[key], getattr(self, buffer)
            if not isinstance(value, Tensor) or value.shape != current.shape:
                shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                errors.append(f"{key}: expected shape {tuple(current.shape)}, got {shape}")
        unexpected = [k for k in state_dict if k.startswith(prefix) and k not in keys]
        missing_keys.extend(missing)
        unexpected_keys.extend(unexpected)
        error_msgs.extend(errors)
        if errors or (strict and (missing or unexpected)):
            return  # load nothing: a failed load leaves the engine as it was
        self._wait()
        with torch.no_grad():
            for key, buffer in keys.items():
                if key in state_dict:
                    getattr(self, buffer).copy_(state_dict[key])
        self._deferred = None  # an update computed before the load no longer applies
        self._pending = None

    # ---------------------------------------------------------------------------- inputs
    def _prepare(self, features: Any, weights: Any) -> list[FeatureBatch]:
        ids = nest.map_up_to(self._structure, features, "features", is_leaf=is_feature)
        if weights is None:
            ws: list[Any] = [None] * len(ids)
        else:
            ws = nest.map_up_to(
                self._structure, weights, "weights", is_leaf=is_feature, missing_ok=True
            )
        device = self.device
        batches = [
            to_feature_batch(f, self._tables[f.table], x, w, device)
            for f, x, w in zip(self._features, ids, ws, strict=True)
        ]
        if self._stats is not None:
            self._stats.maybe_observe(self._by_table(batches))
        return batches

    def prepare(self, features: Any, weights: Any = None) -> PreparedBatch:
        """Validate and convert a batch ahead of time (see :class:`PreparedBatch`)."""
        return PreparedBatch(tuple(self._prepare(features, weights)), id(self))

    def _batches(self, features: Any, weights: Any) -> list[FeatureBatch]:
        if not isinstance(features, PreparedBatch):
            return self._prepare(features, weights)
        if features.engine != id(self):
            raise ValueError("EmbeddingEngine: this PreparedBatch was prepared by another engine")
        if weights is not None:
            raise ValueError("EmbeddingEngine: pass weights to prepare(), not with a PreparedBatch")
        return list(features.batches)

    def _by_table(self, flat: list[Any]) -> list[list[Any]]:
        return [[flat[i] for i in t.features] for t in self._tables]

    def _lookup(self, batches: list[FeatureBatch], out: Tensor | None = None) -> list[Tensor]:
        """``(S_f, dim)`` activations of every feature, flat in feature order; with ``out``
        (``(S, F, dim)``-shaped), written into its ``[:, f, :]`` slices."""
        self._wait()
        slices = None
        if out is not None:
            flat_out = out.view(-1, len(batches), out.shape[-1])
            slices = self._by_table([flat_out[:, f, :] for f in range(len(batches))])
        with torch.no_grad():
            per_table = ops.lookup(
                self.backend, self._states(), self._by_table(batches), out=slices
            )
        # pipelined: the previous step's update lands after this step's lookup; on the CPU it
        # runs in the background while the caller computes on these activations
        if self._deferred is not None and self.device.type == "cpu":
            deferred, self._deferred = self._deferred, None
            self._inflight = _update_thread.submit(self._apply_update, *deferred)
        else:
            self.flush()
        out: list[Tensor | None] = [None] * len(batches)
        for t, acts in zip(self._tables, per_table, strict=True):
            for i, act in zip(t.features, acts, strict=True):
                out[i] = act
        return out  # type: ignore[return-value]

    def _pack(self, flat: list[Tensor], batches: list[FeatureBatch]) -> Any:
        shaped = [
            a.view(*b.output_shape, self._tables[f.table].dim)
            for a, b, f in zip(flat, batches, self._features, strict=True)
        ]
        return nest.pack(self._structure, shaped, is_leaf=is_feature)

    def _require_optimizers(self, what: str) -> None:
        missing = [t.name for t in self._tables if t.optimizer is None]
        if missing:
            raise RuntimeError(
                f"EmbeddingEngine.{what}: tables {missing} have no optimizer; pass optimizer= to "
                "the engine or to their TableConfig, or use training=False"
            )

    # --------------------------------------------------------------------------- updates
    def _learning_rates(self) -> list[float]:
        """One rate per table; each distinct callable is called once per step (SPEC 3.13)."""
        values: dict[int, float] = {}
        rates = []
        for t in self._tables:
            lr = t.optimizer.learning_rate  # type: ignore[union-attr]
            if callable(lr):
                if id(lr) not in values:
                    values[id(lr)] = float(lr())
                rates.append(values[id(lr)])
            else:
                rates.append(float(lr))
        return rates

    def _check_gradient(self, feature: ResolvedFeature, batch: FeatureBatch, grad: Any) -> Tensor:
        """A ``(S, dim) float32`` gradient on the table's device, or a clear error."""
        dim = self._tables[feature.table].dim
        expected = (*batch.output_shape, dim)
        if grad is None:
            return torch.zeros(batch.num_samples, dim, device=self.device)
        if not isinstance(grad, Tensor):
            raise ValueError(
                f"gradient for feature '{feature.name}': found non-tensor type "
                f"{type(grad).__name__}, expected a tensor of shape {expected}"
            )
        if tuple(grad.shape) != expected:
            raise ValueError(
                f"gradient for feature '{feature.name}': expected shape {expected} (the "
                f"activation's), got {tuple(grad.shape)}"
            )
        if not grad.is_floating_point():
            raise TypeError(
                f"gradient for feature '{feature.name}': expected a float tensor, got {grad.dtype}"
            )
        grad = grad.detach().to(device=self.device, dtype=torch.float32)
        grad = grad.reshape(batch.num_samples, dim)
        return grad

    def _update(
        self, batches: list[FeatureBatch], grads: list[Tensor], whole: Tensor | None = None
    ) -> None:
        """Apply one optimizer step to every table (gradients already checked); pipelined,
        keep it until after the next lookup. The learning rates are read now, with the step's
        gradients (SPEC 3.13). ``whole``, when given, holds every gradient (a stacked one):
        it is checked for NaN and Inf in one contiguous pass, the features only if it fails."""
        bad = []
        if whole is None or ops.non_finite(self.backend, [whole])[0]:
            bad = [
                f"'{f.name}' (table '{self._tables[f.table].name}')"
                for f, nonfinite in zip(
                    self._features, ops.non_finite(self.backend, grads), strict=True
                )
                if nonfinite
            ]
        if bad:
            if self.non_finite_gradients == "raise":
                raise ValueError(
                    f"gradients for features {', '.join(bad)} have NaN or Inf values; the tables "
                    "were not updated (non_finite_gradients='skip' drops such steps instead)"
                )
            self.skipped_steps += 1
            return
        rates = self._learning_rates()
        if self.pipelined:
            if self._deferred is not None:  # two updates with no lookup between them
                self.flush()
            self._deferred = (batches, grads, rates)  # a background update may still run
        else:
            self._apply_update(batches, grads, rates)

    def _apply_update(
        self, batches: list[FeatureBatch], grads: list[Tensor], rates: list[float]
    ) -> None:
        with torch.no_grad():
            ops.update(
                self.backend,
                self._states(),
                self._by_table(batches),
                self._by_table(grads),
                rates,
                int(self._step) + 1,
            )
            self._step += 1

    def _wait(self) -> None:
        """Join a pipelined update running in the background (re-raising its error)."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.result()

    def flush(self) -> None:
        """Apply a pipelined update still waiting for the next lookup (no-op otherwise)."""
        self._wait()
        if self._deferred is not None:
            deferred, self._deferred = self._deferred, None
            self._apply_update(*deferred)

    def write_statistics(self) -> list[str]:
        """Write the lookup statistics collected so far (``profile_data_directory``)."""
        if self._stats is None:
            raise RuntimeError(
                "EmbeddingEngine.write_statistics: no profile_data_directory was given"
            )
        return [str(p) for p in self._stats.flush()]

    # -------------------------------------------------------------------- PyTorch style
    def forward(self, features: Any, weights: Any = None) -> Any:
        """Look up a batch; in training mode under autograd, ``backward`` applies the update.

        Args and returns as :meth:`enqueue` and :meth:`dequeue`. Outside training mode, under
        ``torch.no_grad()``, or with lookup-only tables, this is a plain lookup.
        """
        batches = self._batches(features, weights)
        if not self._trains():
            return self._pack(self._lookup(batches), batches)
        anchor = torch.zeros(0, requires_grad=True)
        flat = LookupWithUpdate.apply(anchor, self, batches)
        return self._pack(list(flat), batches)

    def _trains(self) -> bool:
        return (
            self.training
            and torch.is_grad_enabled()
            and all(t.optimizer is not None for t in self._tables)
        )

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
        batches = self._batches(features, weights)
        first = self._features[0]
        shape, dim = batches[0].output_shape, self._tables[first.table].dim
        for f, b in zip(self._features, batches, strict=True):
            if b.output_shape != shape or self._tables[f.table].dim != dim:
                raise ValueError(
                    f"EmbeddingEngine.stacked: feature '{f.name}' has output shape "
                    f"{b.output_shape} and dim {self._tables[f.table].dim}, but feature "
                    f"'{first.name}' has {shape} and {dim}; stacked() needs every feature to "
                    "share both (use forward() for mixed features)"
                )
        shape = (*shape, len(batches), dim)
        if not self._trains():
            out = torch.empty(shape, dtype=torch.float32, device=self.device)
            self._lookup(batches, out=out)
            return out
        anchor = torch.zeros(0, requires_grad=True)
        return StackedLookupWithUpdate.apply(anchor, self, batches, shape)
