"""embcore: TensorFlow's TPU embedding system for PyTorch on CPUs and GPUs.

The public names are re-exported here; everything else is private.
"""

# first: the CPU kernels' cache directory is named after it, and may be chosen while the
# imports below run
__version__ = "0.1.0"

from embcore.config import CountAdmission, Eviction, FeatureConfig, TableConfig
from embcore.engine import EmbeddingEngine, PreparedBatch
from embcore.inputs import FeatureBatch, RaggedIds
from embcore.optimizers import (
    FTRL,
    SGD,
    Adagrad,
    AdagradMomentum,
    Adam,
    Optimizer,
    RowwiseAdagrad,
    SlotSpec,
)
from embcore.prefetch import Prefetcher
from embcore.storage import DiskStorage


def __getattr__(name: str) -> object:
    # Submodules with heavier imports (torch.distributed.checkpoint), loaded on first use:
    # ec.checkpoint.save(...), ec.sharding.plan(...).
    import importlib

    if name in ("checkpoint", "sharding"):
        return importlib.import_module(f"embcore.{name}")
    raise AttributeError(f"module 'embcore' has no attribute {name!r}")


__all__ = [
    "FTRL",
    "SGD",
    "Adagrad",
    "AdagradMomentum",
    "Adam",
    "CountAdmission",
    "DiskStorage",
    "EmbeddingEngine",
    "Eviction",
    "FeatureBatch",
    "FeatureConfig",
    "Optimizer",
    "Prefetcher",
    "PreparedBatch",
    "RaggedIds",
    "RowwiseAdagrad",
    "SlotSpec",
    "TableConfig",
    "__version__",
]
