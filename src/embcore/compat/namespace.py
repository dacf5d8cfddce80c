"""TensorFlow's module paths as namespaces that say what is missing and what to use instead.

``tf.keras.layers.Dense`` is not part of embcore: asking for it raises
:class:`NotProvidedError` (an ``AttributeError``) whose message names the full path, says that
embcore does not provide it and what to use instead, rather than Python's generic "object has
no attribute" (docs/estimator.md, "Porting TPUEstimator code", lists what
``embcore.compat.tf`` covers).
"""

from __future__ import annotations

from typing import Any

__all__ = ["HINTS", "Namespace", "NotProvidedError", "not_provided"]


class NotProvidedError(AttributeError):
    """A TensorFlow name that ``embcore.compat.tf`` does not provide."""


#: For names embcore knows nothing about.
_UNKNOWN = (
    "embcore knows no replacement for this name; write that part with PyTorch (torch.*), "
    "whose functions take and return the torch.Tensor values embcore uses"
)

#: What to use instead, by full path or by last component. Every hint names the concrete
#: replacement (a class, function or method; tests resolve each dotted name).
HINTS: dict[str, str] = {
    # tensors and math: PyTorch's own
    "constant": "use torch.tensor",
    "convert_to_tensor": "use torch.as_tensor",
    "cast": "use torch.Tensor.to(dtype)",
    "concat": "use torch.cat",
    "stack": "use torch.stack",
    "reshape": "use torch.reshape",
    "reduce_mean": "use torch.mean",
    "reduce_sum": "use torch.sum",
    "matmul": "use torch.matmul",
    "sigmoid": "use torch.sigmoid",
    "zeros": "use torch.zeros",
    "ones": "use torch.ones",
    "Variable": "use torch.nn.Parameter inside a torch.nn.Module",
    "Tensor": "tensors are torch.Tensor",
    "SparseTensor": "pass torch.sparse_coo_tensor (or embcore.RaggedIds)",
    "RaggedTensor": "pass embcore.RaggedIds (values and row_splits)",
    "tf.nn.sigmoid_cross_entropy_with_logits": (
        "use torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction='none')"
    ),
    "tf.compat.v1.losses.sigmoid_cross_entropy": (
        "use torch.nn.functional.binary_cross_entropy_with_logits"
    ),
    "tf.losses.BinaryCrossentropy": "use torch.nn.BCEWithLogitsLoss",
    "tf.nn.relu": "use torch.relu",
    "tf.nn.safe_embedding_lookup_sparse": (
        "use embcore.EmbeddingEngine, or tf.nn.embedding_lookup for one dense table"
    ),
    # layers: PyTorch modules (Keras and TensorFlow 1's tf.compat.v1.layers functions)
    "Dense": "use torch.nn.Linear (inside a torch.nn.Module you pass in params or as model_fn)",
    "dense": "use torch.nn.Linear (inside a torch.nn.Module you pass in params or as model_fn)",
    "Model": "use torch.nn.Module",
    "Sequential": "use torch.nn.Sequential",
    "BatchNormalization": "use torch.nn.BatchNorm1d",
    "batch_normalization": "use torch.nn.BatchNorm1d",
    "Dropout": "use torch.nn.Dropout",
    "dropout": "use torch.nn.Dropout",
    "Embedding": "use embcore.EmbeddingEngine (or torch.nn.Embedding for a small dense table)",
    "tf.keras.optimizers": "use torch.optim (SGD, Adagrad, Adam) for the dense model",
    # input pipelines
    "tf.data": (
        "input_fn may return any iterable of feature dicts or (features, labels) pairs: a "
        "generator, a list or a torch.utils.data.DataLoader"
    ),
    "tf.io": "read files with Python, NumPy or pyarrow; embcore.data reads Criteo TSV/Parquet",
    "parse_example": (
        "input_fn returns feature dicts directly (no tf.Example parsing); "
        "embcore.data.parquet.read_criteo_parquet reads Criteo Parquet rows"
    ),
    # TPU system and cluster
    "initialize_tpu_system": "delete the call: embcore runs on torch.device('cpu') or 'cuda'",
    "cluster_resolver": (
        "delete it: embcore runs on this machine; for several processes see docs/sharding.md "
        "(torch.distributed, started by torchrun)"
    ),
    # metrics, summaries, logging
    "tf.compat.v1.metrics": (
        "return per-example values in eval_metrics (embcore.estimator.Estimator.evaluate reports "
        "their mean); embcore.train.metrics.auc and log_loss compute AUC and log loss"
    ),
    "tf.metrics": (
        "return per-example values in eval_metrics (embcore.estimator.Estimator.evaluate reports "
        "their mean)"
    ),
    "tf.summary": "use torch.utils.tensorboard.SummaryWriter",
    "tf.compat.v1.logging": "use Python's logging.getLogger",
    "tf.get_logger": "use logging.getLogger('embcore.estimator')",
    # optimizers embcore does not map
    "FtrlOptimizer": "use embcore.FTRL for the embedding tables; PyTorch has no dense FTRL",
    "RMSPropOptimizer": "use torch.optim.RMSprop",
    "AdadeltaOptimizer": "use torch.optim.Adadelta",
    "ProximalAdagradOptimizer": "use torch.optim.Adagrad",
    # Estimator pieces
    "tf.estimator.LinearClassifier": (
        "write the model as a torch.nn.Module (torch.nn.Linear over "
        "embcore.feature_column.DenseFeatures) and use embcore.compat.tpu.PortedEstimator"
    ),
    "tf.estimator.DNNClassifier": (
        "write the model as a torch.nn.Module (torch.nn.Sequential over "
        "embcore.feature_column.DenseFeatures) and use embcore.compat.tpu.PortedEstimator"
    ),
    "tf.estimator.TrainSpec": (
        "call embcore.estimator.Estimator.train(input_fn, max_steps=...) directly"
    ),
    "tf.estimator.EvalSpec": (
        "call embcore.estimator.Estimator.evaluate(input_fn, steps=...) directly"
    ),
    "tf.estimator.train_and_evaluate": (
        "call embcore.estimator.Estimator.train, then embcore.estimator.Estimator.evaluate"
    ),
    "tf.saved_model": (
        "use embcore.estimator.Estimator.export (safetensors and JSON), or embcore.serving "
        "for a torch.export program"
    ),
}


def _hint(path: str) -> str:
    """The hint for the full path, else for its last component, else for its longest
    prefix (``tf.data.Dataset`` gets ``tf.data``'s)."""
    parts = path.split(".")
    if path in HINTS:
        return HINTS[path]
    if parts[-1] in HINTS:
        return HINTS[parts[-1]]
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in HINTS:
            return HINTS[prefix]
    return _UNKNOWN


def not_provided(path: str) -> NotProvidedError:
    """The error for a TensorFlow name embcore does not provide."""
    return NotProvidedError(
        f"{path} is not provided by embcore (embcore.compat.tf covers TensorFlow's TPU "
        f'embedding, feature-column and Estimator API; see docs/estimator.md, "Porting '
        f'TPUEstimator code"): {_hint(path)}'
    )


class Namespace:
    """A TensorFlow module path (``tf.estimator``) holding the names embcore provides."""

    def __init__(self, path: str, **members: Any) -> None:
        self.__dict__.update(members)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):  # copy, pickle, introspection
            raise AttributeError(name)
        raise not_provided(f"{self._path}.{name}")

    def __dir__(self) -> list[str]:
        return sorted(k for k in self.__dict__ if not k.startswith("_"))

    def __repr__(self) -> str:
        return f"<embcore.compat {self._path}: {', '.join(self.__dir__())}>"
