"""The tables of an engine sharded over the ranks of a torch.distributed process group.

``ec.EmbeddingEngine(...)`` stores its tables in a :class:`ShardedStore` when a process group
of several ranks is initialized (or ``plan=`` or ``process_group=`` is given). Each rank feeds
its own batch and gets that batch's activations, while the tables live where the plan puts
them; every step computes what one process computes on the concatenation of all ranks'
batches in rank order (docs/sharding.md, docs/architecture.md).

Every call that touches the tables is a collective: all ranks make the same calls in the same
order (as with DistributedDataParallel). ``gather`` assembles full logical tensors on every
rank; checkpoints read each rank's chunks through ``tensors()`` without gathering. Dynamic
tables are placed by key hash; their keys, rows and content are gathered by key
(``table_keys``, ``table_rows``, ``dynamic_state``; docs/sharding.md, "Dynamic tables").
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import Tensor

from embcore import ops
from embcore._comm import STEP_KINDS, Comm, Exchange, OutOfStepError
from embcore._fingerprint import fingerprint64
from embcore._table_store import StoreConfig
from embcore.config import resolve
from embcore.inputs import FeatureBatch
from embcore.rows import Chunks, Records, close_rows, row_class, stored_names
from embcore.sharding.plan import ShardingPlan
from embcore.sharding.planner import plan as make_plan
from embcore.sharding.schemes import SCHEMES, Scheme, ShardEnv, lookup_load
from embcore.stats import StatsCollector, StatsTable

__all__ = ["ShardTensor", "ShardedStore"]


class ShardTensor:
    """A stored tensor of a sharded store: the boxes of it this rank holds."""

    def __init__(self, key: str, table: Scheme, name: str) -> None:
        self.key = key
        self.shape = table.logical_shape(name)
        self.dtype = table.env.storage_dtype if name == "weight" else torch.float32  # slots: f32
        self._table, self._name = table, name

    def chunks(self) -> Chunks:
        return self._table.save_chunks(self._name)

    def load_chunks(self) -> Chunks:
        return self._table.load_chunks(self._name)

    def finish_load(self, chunks: Chunks) -> None:
        self._table.finish_load(self._name, chunks)


class ShardedStore:
    """Tables split over the ranks of a process group by a :class:`ShardingPlan`.

    Args:
        config: as every store (every rank passes the same; ``device`` is this rank's: its
            GPU with NCCL, the CPU with gloo).
        plan: a :class:`ShardingPlan` for this world size; ``None`` asks the planner
            (:func:`embcore.sharding.plan`) with its defaults.
        process_group: the group to shard over (default: the default group). Without an
            initialized group the store runs alone with a one-rank plan.

    Raises:
        ValueError: the plan does not fit the tables or the world size, or ranks disagree on
            the configuration or the plan.
    """

    name: ClassVar[str] = "sharded"
    engine_name: ClassVar[str] = "ShardedEmbeddingEngine"
    background_updates: ClassVar[bool] = False  # an update's collectives stay in order

    def __init__(
        self,
        config: StoreConfig,
        plan: ShardingPlan | None = None,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        if plan is not None and not isinstance(plan, ShardingPlan):
            raise ValueError(
                f"EmbeddingEngine: plan must be an embcore.sharding.ShardingPlan or None, got "
                f"{type(plan).__name__}; ShardingPlan.from_json reads a stored plan"
            )
        self.tables = config.tables
        self.backend = config.backend
        self._device = config.device
        self._comm = Comm(process_group, config.device)
        world = self._comm.world
        if plan is None:  # planned for the resolved tables (an engine-wide storage is theirs)
            features = resolve(config.feature_config, config.optimizer)[0]
            tables = (features, list(self.tables))
            plan = make_plan(tables, world, optimizer=config.optimizer)
        plan.check(list(self.tables), world)
        self._check_everyone_agrees(plan, config.seed)
        self._plan = plan
        env = ShardEnv(
            self._comm,
            config.device,
            config.seed,
            config.backend.NAME,
            config.storage_dtype,
            config.stochastic_rounding,
        )
        self._sharded = [SCHEMES[plan[t.name].scheme](t, plan[t.name], env) for t in self.tables]
        self._exchanges = any(s.scheme != "data_parallel" for s in self._sharded)
        #: the tables of each scheme, whose step ends together (:meth:`Scheme.end_steps`)
        self._by_scheme: dict[type[Scheme], list[Scheme]] = {}
        for s in self._sharded:
            self._by_scheme.setdefault(type(s), []).append(s)
        # every exchange carries (kind, number, phase) of its step: ranks out of step fail
        self._steps = [0] * len(STEP_KINDS)
        self._tag = (0, 0, 0)

    def _check_everyone_agrees(self, plan: ShardingPlan, seed: int) -> None:
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
                        repr(getattr(t.config, "admission", None)),
                        repr(getattr(t.config, "eviction", None)),
                        type(t.optimizer).__name__,
                        {  # callables (rates, slot functions) cannot be compared across ranks
                            k: v
                            for k, v in (
                                t.optimizer.hyperparameters() if t.optimizer else {}
                            ).items()
                            if not callable(v)
                        },
                    )
                    for t in self.tables
                ],
                seed,
            )
        )
        differ = self._comm.differing("EmbeddingEngine", fingerprint64(described))
        if differ:
            raise ValueError(
                f"EmbeddingEngine: ranks {differ} have a different feature config, seed or plan "
                "than rank 0; every rank must build the engine identically"
            )

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def comm(self) -> Comm:
        return self._comm

    @property
    def plan(self) -> ShardingPlan:
        return self._plan

    def describe(self, tables: str) -> str:
        placed = "; ".join(
            f"{name}: {shard.describe()}" for name, shard in self._plan.tables.items()
        )
        return f"rank={self._comm.rank}/{self._comm.world}, {tables}, plan=[{placed}]"

    def close(self) -> None:
        close_rows([s.rows for s in self._sharded if s.rows is not None])

    def _run(self, ex: Any) -> Any:
        return ex.run() if self._exchanges else ex.run_local()

    def _begin(self, kind: str) -> None:
        """Start a step of ``kind`` (``"lookup"``, ``"update"``, ``"gather"``): its exchanges
        carry the kind, the step's number and their phase (:class:`OutOfStepError`)."""
        k = STEP_KINDS.index(kind)
        self._steps[k] += 1
        self._tag = (k, self._steps[k], -1)

    def _exchange(self) -> Exchange:
        """The step's next exchange, tagged."""
        kind, number, phase = self._tag
        self._tag = (kind, number, phase + 1)
        return self._comm.exchange(self._tag)

    # ------------------------------------------------------------------------- the step
    def lookup(
        self,
        features: Sequence[Sequence[FeatureBatch]],
        out: Sequence[Sequence[Tensor]] | None,
        training: bool = False,
    ) -> list[list[Tensor]]:
        """Forward: input_dist -> lookup -> output_dist, one fused exchange per phase.
        ``training``: a training lookup (dynamic tables count, admit and insert keys)."""
        self._begin("lookup")
        ex = self._exchange()
        ctxs = [
            s.input_dist(list(b), ex, training)
            for s, b in zip(self._sharded, features, strict=True)
        ]
        inbox = self._run(ex)
        ex = self._exchange()
        for s, ctx in zip(self._sharded, ctxs, strict=True):
            s.lookup(inbox, ex, ctx)
        inbox.check_empty()
        inbox = self._run(ex)
        late = [s.late(c) for s, c in zip(self._sharded, ctxs, strict=True)]
        if any(late):  # e.g. key-hash owners with a user initializer reply one phase later
            ex = self._exchange()
            per_table: list[Any] = [None] * len(ctxs)
            for i, (s, c) in enumerate(zip(self._sharded, ctxs, strict=True)):  # table order
                if late[i]:
                    s.lookup_late(inbox, ex, c)
                else:
                    per_table[i] = s.output_dist(inbox, c)
            inbox.check_empty()
            inbox = self._run(ex)
            for i, (s, c) in enumerate(zip(self._sharded, ctxs, strict=True)):
                if late[i]:
                    per_table[i] = s.output_dist(inbox, c)
        else:
            per_table = [s.output_dist(inbox, c) for s, c in zip(self._sharded, ctxs, strict=True)]
        inbox.check_empty()
        if out is None:
            return per_table
        for dests, acts in zip(out, per_table, strict=True):
            for dest, act in zip(dests, acts, strict=True):
                dest.copy_(act.reshape(dest.shape[0], -1))
        return [list(dests) for dests in out]

    def update(
        self,
        features: Sequence[Sequence[FeatureBatch]],
        grads: Sequence[Sequence[Tensor]],
        rates: Sequence[float],
        step: int,
    ) -> None:
        """Backward: grad_dist -> per-row sums -> one ops.update over every local shard."""
        self._begin("update")
        ex, reducer = self._exchange(), self._comm.reducer()
        ctxs = [
            s.grad_dist(list(b), list(g), ex, reducer)
            for s, b, g in zip(self._sharded, features, grads, strict=True)
        ]
        inbox = self._run(ex)
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
                step,
            )
        for cls, schemes in self._by_scheme.items():
            cls.end_steps(schemes, self._comm)

    def agree(self, error: Exception | None, non_finite: bool) -> list[int]:
        """A bad gradient on one rank stops every rank, before any collective of the update
        (no rank is left waiting in one)."""
        lookups, updates = self._steps[1], self._steps[2]
        flags = self._comm.all_gather_ints(
            [int(error is not None), int(non_finite), lookups, updates]
        )
        if any(f[2:] != [lookups, updates] for f in flags):
            where = "; ".join(
                f"rank {r} after lookup #{f[2]} and update #{f[3]}" for r, f in enumerate(flags)
            )
            raise OutOfStepError(
                f"embcore.sharding: the ranks are out of step: {where}. A rank left a step "
                "half-way (it caught an error and went on); every rank must make the same "
                "engine calls. End every rank and resume from the last checkpoint."
            )
        if error is not None:
            raise error
        invalid = [r for r, (bad, *_) in enumerate(flags) if bad]
        if invalid:
            raise RuntimeError(
                f"EmbeddingEngine: the gradients on rank(s) {invalid} were invalid (see the "
                "error there); no rank updated its tables"
            )
        return [r for r, (_, bad, *_) in enumerate(flags) if bad]

    # ---------------------------------------------------------------- whole tensors
    def gather(self, items: Sequence[tuple[int, str]]) -> list[Tensor]:
        """Full logical tensors, every rank's pieces in one exchange (a collective). Copies:
        writing to them changes nothing."""
        self._begin("gather")
        ex = self._exchange()
        for t, name in items:
            self._sharded[t].gather_send(name, ex)
        inbox = self._run(ex)
        out = [self._sharded[t].gather_take(name, inbox) for t, name in items]
        inbox.check_empty()
        return out

    def load_full(self, items: Sequence[tuple[int, str, Tensor]]) -> None:
        """Each rank copies its pieces out of the full tensors (no communication)."""
        for t, name, value in items:
            self._sharded[t].load_full(name, value.to(self._device))

    def shape(self, table: int, name: str) -> tuple[int, ...]:
        """The logical shape; for keyed rows ``(keys held, ...)`` (a collective)."""
        return self._sharded[table].shape(name)

    def tensors(self) -> list[ShardTensor]:
        """The fixed tables' tensors; a checkpoint stores dynamic tables by key, through
        :meth:`dynamic_state` (the whole table on every rank) and :meth:`load_dynamic_state`
        (each rank keeps the keys hashed to it)."""
        return [
            ShardTensor(f"{t.name}.{name}", s, name)
            for t, s in zip(self.tables, self._sharded, strict=True)
            if self.records(t.index) == "tensors"
            for name in stored_names(t)
        ]

    def records(self, table: int) -> Records:
        return row_class(self.tables[table]).records

    def flush_before_training_lookup(self) -> bool:
        return any(s.flush_before_training_lookup for s in self._sharded)

    # ---------------------------------------------------------------- keyed rows
    # Read by key through each table's scheme (a key shard per owner: ``key_hash``); every
    # one is a collective.
    def table_keys(self, table: int) -> Tensor:
        """``(R,) int64``: the keys of keyed table ``table`` holding a row on any rank,
        ascending (a collective)."""
        s = self._sharded[table]
        self._begin("gather")
        ex = self._exchange()
        s.keys_send(ex)
        inbox = self._run(ex)
        out = s.keys_take(inbox)
        inbox.check_empty()
        return out

    def table_rows(self, table: int, keys: Tensor) -> Tensor:
        """``(K, dim) float32``: the rows of this rank's ``keys`` in keyed table ``table``,
        zeros for keys without one (a collective; reads only, never inserts)."""
        s = self._sharded[table]
        self._begin("gather")
        ex = self._exchange()
        ctx = s.rows_send(keys, ex)
        inbox = self._run(ex)
        ex = self._exchange()
        s.rows_serve(inbox, ex, ctx)
        inbox.check_empty()
        inbox = self._run(ex)
        out = s.rows_take(inbox, ctx)
        inbox.check_empty()
        return out

    def table_info(self, table: int) -> dict[str, int]:
        """Table ``table``'s counters (``EmbeddingEngine.table_info``): a keyed table's, or a
        disk table's summed over its pieces (a collective)."""
        return self._sharded[table].info()

    def dynamic_state(self, table: int) -> dict[str, Any]:
        """Keyed table ``table``'s whole content, as one process's store gives it (every
        rank's keys, gathered onto every rank: a collective)."""
        return self._sharded[table].content()

    def load_dynamic_state(self, table: int, state: dict[str, Any]) -> None:
        """Replace keyed table ``table``'s content with a whole table's
        :meth:`dynamic_state` (every rank passes the same; each keeps the keys hashed to it,
        whatever number of ranks wrote it). No communication."""
        self._sharded[table].load_content(state)

    # -------------------------------------------------------------------- statistics
    def stats_tables(self) -> list[StatsTable]:
        """Each table with this rank's lookup load under the plan."""
        world, rank = self._comm.world, self._comm.rank
        return [
            StatsTable(
                t.name,
                t.vocabulary_size,
                t.dim,
                len(t.features),
                load_of=lookup_load(self._plan[t.name], t.vocabulary_size, world, rank),
                num_shards=world,
                strategy=self._plan[t.name].describe(),
                cache_counters=getattr(s.rows, "cache_counters", None),
            )
            for t, s in zip(self.tables, self._sharded, strict=True)
        ]

    def write_statistics(self, stats: StatsCollector) -> list[Path]:
        """Rank 0 sums every rank's statistics and writes them (a collective); every rank
        returns the paths once written."""
        comm = self._comm
        if not comm.distributed or comm.world == 1:
            return stats.flush()
        everyone: list[Any] = [None] * comm.world
        stats.count_cache()  # disk tables' counters up to the last step, on every rank
        dist.all_gather_object(everyone, stats.stats, group=comm.group)
        others = [s for r, s in enumerate(everyone) if r != comm.rank]
        paths = stats.flush(others=others, write=comm.rank == 0)
        dist.barrier(group=comm.group)  # the files exist when any rank returns
        return paths
