"""The embedding engine: the user's front (inputs, autograd, the TPU embedding API's calls)
over a table store that holds the rows and runs the kernels.

* :mod:`._engine`: :class:`EmbeddingEngine`; :mod:`._batch`: :class:`PreparedBatch`;
* :mod:`._store`: the :class:`TableStore` contract and the choice of a store;
  :mod:`._local`: the single-process store (``embcore.sharding`` has the sharded one);
* :mod:`._autograd`, :mod:`._enqueue`: the two ways to train; :mod:`._compiled`: the
  engine under ``torch.compile`` (the ``torch.ops.embcore`` operators);
* :mod:`._gradients`, :mod:`._rates`, :mod:`._pipeline`: what happens between a gradient
  and an update.

See docs/architecture.md.
"""

from embcore import ops  # noqa: F401  (the dispatch every store calls)
from embcore._engine_class import register_engine
from embcore.engine._batch import PreparedBatch
from embcore.engine._engine import EmbeddingEngine

__all__ = ["EmbeddingEngine", "PreparedBatch"]

register_engine(EmbeddingEngine)  # for ShardedEmbeddingEngine, below the engine
