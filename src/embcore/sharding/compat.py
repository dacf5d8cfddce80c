"""``ShardedEmbeddingEngine``: the name earlier versions gave an engine with sharded tables.

An :class:`embcore.EmbeddingEngine` shards its tables itself (a
:class:`~embcore.sharding._store.ShardedStore`) when given ``plan=`` or ``process_group=``, or
under a process group of several ranks; this name remains for code written against it. This
package sits below the engine, so the engine class comes from :mod:`embcore._engine_class`
(where ``embcore.engine`` registers it). See docs/sharding.md.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from embcore._engine_class import engine_class
from embcore.sharding.planner import plan as make_plan

__all__ = ["ShardedEmbeddingEngine"]


class _EngineWithShardedStore(type):
    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, engine_class()) and obj.store.name == "sharded"  # type: ignore[attr-defined]


class ShardedEmbeddingEngine(metaclass=_EngineWithShardedStore):
    """An :class:`EmbeddingEngine` whose tables are sharded, even in one process.

    ``isinstance(engine, ShardedEmbeddingEngine)`` holds for every engine over a sharded store.

    Args:
        feature_config, optimizer, **kwargs: as :class:`EmbeddingEngine`; every rank passes
            the same configuration.
        plan: a :class:`ShardingPlan` for this world size; ``None`` asks the planner
            (:func:`embcore.sharding.plan`) with its defaults.
        process_group: the group to shard over (default: the default group). Without an
            initialized group the engine runs alone with a one-rank plan.
    """

    def __new__(  # type: ignore[misc]
        cls,
        feature_config: Any,
        optimizer: Any = None,
        *,
        plan: Any = None,
        process_group: dist.ProcessGroup | None = None,
        **kwargs: Any,
    ) -> Any:
        if plan is None and process_group is None:
            one = not (dist.is_available() and dist.is_initialized())
            plan = make_plan(
                feature_config, 1 if one else dist.get_world_size(), optimizer=optimizer
            )
        return engine_class()(
            feature_config, optimizer, plan=plan, process_group=process_group, **kwargs
        )
