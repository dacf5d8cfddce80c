"""TensorFlow's module paths as namespaces that say what is missing and what to use instead.

``tf.keras.layers.Dense`` is not part of embcore: asking for it raises
:class:`NotProvidedError` (an ``AttributeError``) whose message names the full path, says that
embcore does not provide it and what to use instead, rather than Python's generic "object has
no attribute" (docs/differences.md lists what ``embcore.compat.tf`` covers).
"""

from __future__ import annotations

from typing import Any

__all__ = ["HINTS", "Namespace", "NotProvidedError", "not_provided"]


class NotProvidedError(AttributeError):
    """A TensorFlow name that ``embcore.compat.tf`` does not provide."""


_TORCH = "use the PyTorch equivalent"

#: What to use instead, by full path or by last component.
HINTS: dict[str, str] = {
    # tensors and math: PyTorch's own
    "constant": "use torch.tensor",
    "convert_to_tensor": "use torch.as_tensor",
    "cast": "use tensor.to(dtype)",
    "concat": "use torch.cat",
    "stack": "use torch.stack",
    "reshape": "use tensor.reshape",
    "reduce_mean": "use torch.mean",
    "reduce_sum": "use torch.sum",
    "matmul": "use torch.matmul",
    "sigmoid": "use torch.sigmoid",
    "zeros": "use torch.zeros",
    "ones": "use torch.ones",
    "Variable": "use torch.nn.Parameter inside an nn.Module",
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
    # Keras: PyTorch modules
    "Dense": "use torch.nn.Linear (inside an nn.Module you pass in params or as model_fn)",
    "Model": "use torch.nn.Module",
    "Sequential": "use torch.nn.Sequential",
    "BatchNormalization": "use torch.nn.BatchNorm1d",
    "Dropout": "use torch.nn.Dropout",
    "tf.keras.optimizers": "use torch.optim (SGD, Adagrad, Adam) for the dense model",
    # input pipelines
    "tf.data": (
        "input_fn may return any iterable of feature dicts or (features, labels) pairs: a "
        "generator, a list or a torch DataLoader"
    ),
    "tf.io": "read files with Python, NumPy or pyarrow; embcore.data reads Criteo TSV/Parquet",
    "parse_example": "input_fn returns feature dicts directly; no tf.Example parsing",
    # TPU system and cluster
    "initialize_tpu_system": "not needed: embcore runs on this machine's CPU or GPU",
    "cluster_resolver": (
        "not needed: embcore runs on this machine; for several processes see "
        "docs/sharding.md (torchrun)"
    ),
    "TPUClusterResolver": "not needed: embcore runs on this machine's CPU or GPU",
    # metrics, summaries, logging
    "tf.compat.v1.metrics": (
        "return per-example values in eval_metrics (the Estimator reports their mean); "
        "embcore.train.metrics has auc and log_loss"
    ),
    "tf.metrics": "return per-example values in eval_metrics (the Estimator reports their mean)",
    "tf.summary": "use torch.utils.tensorboard.SummaryWriter",
    "tf.compat.v1.logging": "use Python's logging module",
    "tf.get_logger": "use logging.getLogger('embcore.estimator')",
    # optimizers embcore does not map
    "FtrlOptimizer": "use embcore.FTRL for the embedding tables; PyTorch has no dense FTRL",
    "RMSPropOptimizer": "use torch.optim.RMSprop",
    "AdadeltaOptimizer": "use torch.optim.Adadelta",
    "ProximalAdagradOptimizer": "use torch.optim.Adagrad",
    "tf.estimator.LinearClassifier": "write the model as an nn.Module and use TPUEstimator",
    "tf.estimator.DNNClassifier": "write the model as an nn.Module and use TPUEstimator",
    "tf.estimator.train_and_evaluate": "call estimator.train(...) and estimator.evaluate(...)",
    "tf.saved_model": "use Estimator.export / embcore export (safetensors and JSON)",
}


def _hint(path: str) -> str:
    parts = path.split(".")
    for i in range(len(parts), 0, -1):  # the longest matching prefix of the path
        prefix = ".".join(parts[:i])
        if prefix in HINTS:
            return HINTS[prefix]
    return HINTS.get(parts[-1], _TORCH)


def not_provided(path: str) -> NotProvidedError:
    """The error for a TensorFlow name embcore does not provide."""
    return NotProvidedError(
        f"{path} is not provided by embcore (embcore.compat.tf covers TensorFlow's TPU "
        f"embedding, feature-column and Estimator API; see docs/differences.md): {_hint(path)}"
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
