"""The embedding engine with its tables sharded over a torch.distributed process group.

``ec.EmbeddingEngine(...)`` builds a :class:`ShardedEmbeddingEngine` when a process group of
several ranks is initialized (or ``plan=`` is given). It has the engine's whole interface:
each rank feeds its own batch (``forward``/``backward`` or ``enqueue``/``dequeue``/
``apply_gradients``) and gets that batch's activations, while the tables live where the plan
puts them. Every step computes what one process computes on the concatenation of all ranks'
batches in rank order: each row's gradient is summed over every occurrence on every rank, then
the table's optimizer runs once (SPEC 3.1, 3.16; gradients are summed, not averaged).

Every engine call that touches the tables is a collective: all ranks make the same calls in
the same order (as with DistributedDataParallel). ``embedding_tables``, ``slot_variables`` and
``state_dict()`` gather the full logical tables on every rank; ``embcore.checkpoint`` saves and
loads without gathering.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from embcore import ops
from embcore.config import ResolvedFeature
from embcore.engine import EmbeddingEngine
from embcore.inputs import FeatureBatch
from embcore.sharding.comm import Comm, CommStats
from embcore.sharding.plan import ShardingPlan
from embcore.sharding.planner import plan as make_plan
from embcore.sharding.schemes import SCHEMES, ShardEnv, lookup_load
from embcore.sharding.schemes import Scheme as ShardedTable
from embcore.stats import StatsTable

__all__ = ["ShardedEmbeddingEngine", "wants_sharding"]


def wants_sharding(kwargs: dict[str, Any]) -> bool:
    """Whether ``EmbeddingEngine(**kwargs)`` should be sharded: a plan or a process group is
    given, or the default process group has several ranks."""
    if kwargs.get("plan") is not None or kwargs.get("process_group") is not None:
        return True
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class ShardedEmbeddingEngine(EmbeddingEngine):
    """:class:`EmbeddingEngine` with tables sharded over the ranks of a process group.

    Args:
        feature_config, optimizer, seed, device, backend: as :class:`EmbeddingEngine`; every
            rank passes the same configuration. ``device`` is this rank's device (its GPU
            with NCCL; the CPU with gloo).
        plan: a :class:`ShardingPlan` for this world size; ``None`` asks the planner
            (:func:`embcore.sharding.plan`) with its defaults.
        process_group: the group to shard over (default: the default group). Without an
            initialized group the engine runs alone with a one-rank plan.
        **kwargs: the other :class:`EmbeddingEngine` options.

    Raises:
        ValueError: the plan does not fit the tables or the world size, or ranks disagree on
            the configuration or the plan.
    """

    def __init__(
        self,
        feature_config: Any,
        optimizer: Any = None,
        *,
        plan: ShardingPlan | None = None,
        process_group: dist.ProcessGroup | None = None,
        **kwargs: Any,
    ) -> None:
        if plan is not None and not isinstance(plan, ShardingPlan):
            raise ValueError(
                f"EmbeddingEngine: plan must be an embcore.sharding.ShardingPlan or None, got "
                f"{type(plan).__name__}; ShardingPlan.from_json reads a stored plan"
            )
        # Read by _build_tables, which the base constructor calls.
        object.__setattr__(self, "_shard_args", (plan, process_group, feature_config, optimizer))
        super().__init__(feature_config, optimizer, **kwargs)
        if self._stats is not None:  # record each rank's load under this plan
            self._stats = self._stats.regrouped(
                [
                    StatsTable(
                        t.name,
                        t.vocabulary_size,
                        t.dim,
                        len(t.features),
                        load_of=lookup_load(
                            self.plan[t.name], t.vocabulary_size, self.world_size, self.rank
                        ),
                        num_shards=self.world_size,
                        strategy=self.plan[t.name].describe(),
                    )
                    for t in self._tables
                ],
                world_size=self.world_size,
            )

    # ----------------------------------------------------------------------------- state
    def _build_tables(self, device: torch.device) -> None:
        plan, group, feature_config, optimizer = self.__dict__.pop("_shard_args")
        self._device = device
        self._grad_error: Exception | None = None
        self._comm = Comm(group, device)
        world = self._comm.world
        if plan is None:
            plan = make_plan(feature_config, world, optimizer=optimizer)
        plan.check(self._tables, world)
        self._check_everyone_agrees(plan)
        self.plan = plan
        env = ShardEnv(self._comm, device, self.seed, self.backend)
        self._sharded = [SCHEMES[plan[t.name].scheme](t, plan[t.name], env) for t in self._tables]
        self._exchanges = any(s.scheme != "data_parallel" for s in self._sharded)

    def _check_everyone_agrees(self, plan: ShardingPlan) -> None:
        described = repr(
            (
                plan.to_json(),
                [
                    (
                        t.name,
                        t.vocabulary_size,
                        t.dim,
                        t.combiner,
                        t.features,
                        t.config.initializer is None,
                        type(t.optimizer).__name__,
                        {  # callables (rates, slot functions) cannot be compared across ranks
                            k: v
                            for k, v in (
                                t.optimizer.hyperparameters() if t.optimizer else {}
                            ).items()
                            if not callable(v)
                        },
                    )
                    for t in self._tables
                ],
                self.seed,
            )
        )
        digest = hashlib.blake2b(described.encode(), digest_size=8).digest()
        fingerprint = int.from_bytes(digest, "little") & ((1 << 62) - 1)
        everyone = [v[0] for v in self._comm.all_gather_ints([fingerprint])]
        differ = [r for r, v in enumerate(everyone) if v != everyone[0]]
        if differ:
            raise ValueError(
                f"EmbeddingEngine: ranks {differ} have a different feature config, seed or plan "
                "than rank 0; every rank must build the engine identically"
            )

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def comm_stats(self) -> CommStats:
        """This rank's cumulative communication (bytes sent and received, collectives)."""
        return self._comm.stats

    @property
    def rank(self) -> int:
        return self._comm.rank

    @property
    def world_size(self) -> int:
        return self._comm.world

    def _weight(self, table: Any) -> Tensor:
        raise RuntimeError(
            "ShardedEmbeddingEngine: a rank holds only its shards; use embedding_tables "
            "(gathered) or embcore.checkpoint"
        )

    def _gather(self, items: list[tuple[ShardedTable, str]]) -> list[Tensor]:
        """Full logical tensors, every rank's pieces in one exchange (a collective). Like the
        plain engine's tensors, they show the updates applied so far (no flush)."""
        ex = self._comm.exchange()
        for table, name in items:
            table.gather_send(name, ex)
        inbox = ex.run() if self._exchanges else ex.run_local()
        out = [table.gather_take(name, inbox) for table, name in items]
        inbox.check_empty()
        return out

    @property
    def embedding_tables(self) -> dict[str, Tensor]:
        """``{table name: (vocab, dim)}`` full tables, gathered on every rank (a collective:
        every rank must ask). Copies: writing to them changes nothing."""
        full = self._gather([(s, "weight") for s in self._sharded])
        return {t.name: f for t, f in zip(self._tables, full, strict=True)}

    @property
    def slot_variables(self) -> dict[str, dict[str, Tensor]]:
        """``{table name: {slot name: full tensor}}``, gathered like :attr:`embedding_tables`."""
        items = [(s, name) for s in self._sharded for name in s.tensor_names()[1:]]
        full = iter(self._gather(items))
        return {
            t.name: {name: next(full) for name in s.tensor_names()[1:]}
            for t, s in zip(self._tables, self._sharded, strict=True)
        }

    def extra_repr(self) -> str:
        placed = "; ".join(
            f"{name}: {shard.describe()}" for name, shard in self.plan.tables.items()
        )
        return f"rank={self.rank}/{self.world_size}, {super().extra_repr()}, plan=[{placed}]"

    def write_statistics(self) -> list[str]:
        """Write the lookup statistics of every rank's batches (a collective): rank 0 sums
        the ranks' statistics and writes them; every rank returns the paths once written."""
        if self._stats is None or not self._comm.distributed or self.world_size == 1:
            return super().write_statistics()
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, self._stats.stats, group=self._comm.group)
        others = [s for r, s in enumerate(everyone) if r != self.rank]
        paths = self._stats.flush(others=others, write=self.rank == 0)
        dist.barrier(group=self._comm.group)  # the files exist when any rank returns
        return [str(p) for p in paths]

    def _checkpoint_items(self) -> list[tuple[str, ShardedTable, str]]:
        """``(state-dict key, sharded table, tensor name)`` for every table tensor."""
        return [
            (f"{t.name}.{name}", s, name)
            for t, s in zip(self._tables, self._sharded, strict=True)
            for name in s.tensor_names()
        ]

    # ------------------------------------------------------------------------ state dict
    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        """Full logical tensors under the single-process keys (gathered: a collective)."""
        self.flush()  # as the plain engine: a checkpoint holds every update
        items = self._checkpoint_items()
        full = self._gather([(table, name) for _, table, name in items])
        destination[f"{prefix}step"] = self._step if keep_vars else self._step.detach()
        for (key, _, _), value in zip(items, full, strict=True):
            destination[prefix + key] = value

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
        """Each rank copies its pieces out of full logical tensors (no communication)."""
        items = {prefix + key: (table, name) for key, table, name in self._checkpoint_items()}
        expected = {f"{prefix}step": ()} | {k: t.logical_shape(n) for k, (t, n) in items.items()}
        missing = [k for k in expected if k not in state_dict]
        unexpected = [k for k in state_dict if k.startswith(prefix) and k not in expected]
        errors = []
        for key, shape in expected.items():
            value = state_dict.get(key)
            if value is not None and (not isinstance(value, Tensor) or tuple(value.shape) != shape):
                got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                errors.append(f"{key}: expected shape {shape}, got {got}")
        missing_keys.extend(missing)
        unexpected_keys.extend(unexpected)
        error_msgs.extend(errors)
        if errors or (strict and (missing or unexpected)):
            return
        with torch.no_grad():
            for key, (table, name) in items.items():
                if key in state_dict:
                    table.load_full(name, state_dict[key].to(self.device))
            if f"{prefix}step" in state_dict:
                self._step.copy_(state_dict[f"{prefix}step"])
        self._deferred = None
        self._pending = None

    # ------------------------------------------------------------------------- the step
    def _lookup(self, batches: list[FeatureBatch], out: Tensor | None = None) -> list[Tensor]:
        """Forward: input_dist -> lookup -> output_dist, one fused exchange per phase (with
        ``out``, ``(S, F, dim)``: the activations are also copied into its slices)."""
        with torch.no_grad():
            ex = self._comm.exchange()
            ctxs = [
                s.input_dist(b, ex)
                for s, b in zip(self._sharded, self._by_table(batches), strict=True)
            ]
            inbox = ex.run() if self._exchanges else ex.run_local()
            ex = self._comm.exchange()
            for s, ctx in zip(self._sharded, ctxs, strict=True):
                s.lookup(inbox, ex, ctx)
            inbox.check_empty()
            inbox = ex.run() if self._exchanges else ex.run_local()
            per_table = [s.output_dist(inbox, c) for s, c in zip(self._sharded, ctxs, strict=True)]
            inbox.check_empty()
        self.flush()  # pipelined: the previous step's update lands after this lookup
        flat: list[Tensor | None] = [None] * len(batches)
        for t, acts in zip(self._tables, per_table, strict=True):
            for i, act in zip(t.features, acts, strict=True):
                flat[i] = act
        if out is not None:
            stacked = out.view(-1, len(batches), out.shape[-1])
            for i, act in enumerate(flat):
                stacked[:, i, :].copy_(act.reshape(stacked.shape[0], -1))
        return flat  # type: ignore[return-value]

    def _check_gradient(self, feature: ResolvedFeature, batch: FeatureBatch, grad: Any) -> Tensor:
        # A bad gradient on one rank must stop every rank, not leave the others waiting in a
        # collective: remember the error and raise it, on all ranks, in _update.
        try:
            return super()._check_gradient(feature, batch, grad)
        except (ValueError, TypeError) as error:
            if self._grad_error is None:
                self._grad_error = error
            dim = self._tables[feature.table].dim
            return torch.zeros(batch.num_samples, dim, device=self.device)

    def _update(
        self, batches: list[FeatureBatch], grads: list[Tensor], whole: Tensor | None = None
    ) -> None:
        """Agree on the gradients before any collective of the update: an invalid gradient
        raises on every rank, and non-finite gradients anywhere raise (or skip the step) on
        every rank, as ``non_finite_gradients`` says."""
        error, self._grad_error = self._grad_error, None
        # A NaN or Inf makes its sum non-finite; a finite sum proves every element finite
        # (an overflowing sum of finite values only costs the exact check).
        sums = torch.stack([g.sum() for g in grads]) if grads else torch.zeros(0)
        finite = bool(torch.isfinite(sums).all()) or all(
            bool(torch.isfinite(g).all()) for g in grads
        )
        flags = self._comm.all_gather_ints([int(error is not None), int(not finite)])
        if error is not None:
            raise error
        invalid = [r for r, (bad, _) in enumerate(flags) if bad]
        if invalid:
            raise RuntimeError(
                f"EmbeddingEngine: the gradients on rank(s) {invalid} were invalid (see the "
                "error there); no rank updated its tables"
            )
        nonfinite = [r for r, (_, bad) in enumerate(flags) if bad]
        if nonfinite and finite:  # another rank's: do what that rank does
            if self.non_finite_gradients == "raise":
                raise ValueError(
                    f"gradients on rank(s) {nonfinite} have NaN or Inf values; no rank updated "
                    "its tables (non_finite_gradients='skip' drops such steps instead)"
                )
            self.skipped_steps += 1
            return
        super()._update(batches, grads)

    def _apply_update(
        self, batches: list[FeatureBatch], grads: list[Tensor], rates: list[float]
    ) -> None:
        """Backward: grad_dist -> per-row sums -> one ops.update over every local shard."""
        with torch.no_grad():
            ex, reducer = self._comm.exchange(), self._comm.reducer()
            ctxs = [
                s.grad_dist(b, g, ex, reducer)
                for s, b, g in zip(
                    self._sharded, self._by_table(batches), self._by_table(grads), strict=True
                )
            ]
            inbox = ex.run() if self._exchanges else ex.run_local()
            reduced = reducer.run()
            jobs = [s.update(inbox, reduced, c) for s, c in zip(self._sharded, ctxs, strict=True)]
            inbox.check_empty()
            jobs = [j for j in jobs if j is not None]
            if jobs:
                ops.update(
                    self.backend,
                    [j.state for j in jobs],
                    [j.features for j in jobs],
                    [j.grads for j in jobs],
                    [rates[j.lr_table] for j in jobs],
                    int(self._step) + 1,
                )
            self._step += 1
