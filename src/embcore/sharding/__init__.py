"""Sharded training over a torch.distributed process group, with single-process semantics.

Under ``torchrun`` (an initialized process group of several ranks),
``embcore.EmbeddingEngine(...)`` shards its tables by a :class:`ShardingPlan`: each rank feeds
its own batch and gets its activations, and every step equals one process training on the
concatenation of all ranks' batches. See ``docs/sharding.md``.

* :mod:`~embcore.sharding.plan`: :class:`ShardingPlan`, :class:`TableShard` (frozen, JSON);
* :mod:`~embcore.sharding.planner`: :func:`plan`, :func:`estimate` (the cost model);
* :mod:`~embcore.sharding.schemes`: :data:`SCHEMES`, one module per scheme;
* :mod:`~embcore.sharding.maps`: the ``div``/``mod`` row maps;
  :mod:`~embcore.sharding.keyhash`: the key -> shard map of dynamic tables;
* :mod:`~embcore.sharding._store`: :class:`ShardedStore`, where a sharded engine keeps its
  tables; :mod:`~embcore.sharding.compat`: the ``ShardedEmbeddingEngine`` compatibility name.
"""

from embcore.sharding.compat import ShardedEmbeddingEngine
from embcore.sharding.plan import ShardingPlan, TableShard
from embcore.sharding.planner import RankLoad, TableLoad, estimate, plan
from embcore.sharding.schemes import SCHEMES

__all__ = [
    "SCHEMES",
    "RankLoad",
    "ShardedEmbeddingEngine",
    "ShardingPlan",
    "TableLoad",
    "TableShard",
    "estimate",
    "plan",
]
