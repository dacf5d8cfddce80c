"""Small stand-ins for the TensorFlow runtime around the TPU embedding API's examples.

They exist so that TensorFlow training loops run on PyTorch with their imports changed; each
does the one thing the examples need, eagerly, on one process:

* ``GradientTape``: ``tape.gradient(loss, activations)`` is ``torch.autograd.grad`` over any
  nesting of dicts, lists and tuples; ``watch`` makes a leaf tensor require grad.
* ``function``: returns the function unchanged (PyTorch runs eagerly).
* ``TPUStrategy``: a single-replica strategy: ``scope()`` does nothing, ``run(fn, args)``
  calls ``fn(*args)``, datasets from functions are the function's result.
* ``Checkpoint``: saves objects with ``state_dict()`` to ``<prefix>-<n>.safetensors``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from embcore import nest

__all__ = [
    "Checkpoint",
    "GradientTape",
    "InputContext",
    "InputOptions",
    "TPUStrategy",
    "embedding_lookup",
    "function",
    "tf_range",
]


def function(func: Callable[..., Any] | None = None, **_options: Any) -> Any:
    """``@tf.function`` / ``@tf.function(...)``: the function itself."""
    if func is None:
        return lambda f: f
    return func


def tf_range(*args: Any) -> range:
    """``tf.range`` over Python ints (tensors are converted)."""
    return range(*(int(a) for a in args))


def embedding_lookup(params: Tensor, ids: Tensor) -> Tensor:
    """``tf.nn.embedding_lookup`` on one table: the rows of ``params`` at ``ids``."""
    return torch.nn.functional.embedding(torch.as_tensor(ids, dtype=torch.int64), params)


class GradientTape:
    """``with GradientTape() as tape: ...; tape.gradient(target, sources)``.

    PyTorch records every operation on tensors that require grad, so the tape only computes
    gradients. A non-persistent tape, as in TensorFlow, answers one ``gradient`` call.
    """

    def __init__(self, persistent: bool = False, watch_accessed_variables: bool = True) -> None:
        self.persistent = persistent
        self._used = False

    def __enter__(self) -> GradientTape:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def watch(self, tensors: Any) -> None:
        """Make leaf tensors in ``tensors`` require grad (non-leaves already carry a graph)."""
        for _, t in nest.flatten_with_paths(tensors):
            if isinstance(t, Tensor) and t.is_leaf and not t.requires_grad:
                t.requires_grad_(True)

    def gradient(self, target: Tensor, sources: Any, output_gradients: Any = None) -> Any:
        """d(target)/d(source) in the structure of ``sources``; ``None`` where unconnected."""
        if self._used and not self.persistent:
            raise RuntimeError(
                "GradientTape.gradient can only be called once on a non-persistent tape; use "
                "GradientTape(persistent=True)"
            )
        self._used = True
        flat = [t for _, t in nest.flatten_with_paths(sources)]
        wanted = [i for i, t in enumerate(flat) if isinstance(t, Tensor) and t.requires_grad]
        grads: list[Any] = [None] * len(flat)
        if wanted:
            computed = torch.autograd.grad(
                target,
                [flat[i] for i in wanted],
                grad_outputs=output_gradients,
                retain_graph=self.persistent,
                allow_unused=True,
            )
            for i, g in zip(wanted, computed, strict=True):
                grads[i] = g
        return nest.pack(sources, grads)


@dataclass(frozen=True)
class InputOptions:
    """``tf.distribute.InputOptions``: accepted; prefetching has no meaning here."""

    experimental_prefetch_to_device: bool = True
    experimental_fetch_to_device: bool | None = None
    experimental_per_replica_buffer_size: int = 1


@dataclass(frozen=True)
class InputContext:
    """What a dataset function receives: one pipeline, one replica."""

    num_input_pipelines: int = 1
    input_pipeline_id: int = 0
    num_replicas_in_sync: int = 1

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        if global_batch_size % self.num_replicas_in_sync:
            raise ValueError(
                f"global batch size {global_batch_size} is not divisible by "
                f"{self.num_replicas_in_sync} replicas"
            )
        return global_batch_size // self.num_replicas_in_sync


class TPUStrategy:
    """A single-replica stand-in for ``tf.distribute.TPUStrategy`` (arguments accepted)."""

    num_replicas_in_sync = 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def scope(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def run(self, fn: Callable[..., Any], args: Iterable[Any] = (), kwargs: Any = None) -> Any:
        return fn(*args, **(kwargs or {}))

    def experimental_distribute_datasets_from_function(
        self, dataset_fn: Callable[[InputContext], Any], options: InputOptions | None = None
    ) -> Any:
        return dataset_fn(InputContext())

    distribute_datasets_from_function = experimental_distribute_datasets_from_function

    def experimental_distribute_dataset(
        self, dataset: Any, options: InputOptions | None = None
    ) -> Any:
        return dataset


class _Status:
    """What ``Checkpoint.restore`` returns; everything was matched strictly already."""

    def assert_consumed(self) -> _Status:
        return self

    def assert_existing_objects_matched(self) -> _Status:
        return self

    def expect_partial(self) -> _Status:
        return self


class Checkpoint:
    """``tf.train.Checkpoint(model=..., embedding=...)`` for objects with ``state_dict()``.

    ``save(prefix)`` writes ``<prefix>-<n>.safetensors`` (n counts saves) and returns
    ``<prefix>-<n>``; ``restore(path)`` loads such a file strictly into every object.
    """

    def __init__(self, **objects: Any) -> None:
        for name, obj in objects.items():
            if not hasattr(obj, "state_dict") or not hasattr(obj, "load_state_dict"):
                raise ValueError(
                    f"Checkpoint: '{name}' must have state_dict() and load_state_dict(), got "
                    f"{type(obj).__name__}"
                )
        self._objects = objects
        self.save_counter = 0

    def save(self, file_prefix: str | os.PathLike) -> str:
        # the main job's file format: written atomically, every tensor's sha256 checked on read
        from embcore.train.run_state import save_checkpoint

        self.save_counter += 1
        path = f"{os.fspath(file_prefix)}-{self.save_counter}"
        tensors = {
            f"{name}/{key}": value.detach().cpu().contiguous().clone()
            for name, obj in self._objects.items()
            for key, value in obj.state_dict().items()
        }
        save_checkpoint(path + ".safetensors", tensors, {"saved_by": "embcore.compat.Checkpoint"})
        return path

    def restore(self, save_path: str | os.PathLike) -> _Status:
        from embcore.train.run_state import load_checkpoint

        path = os.fspath(save_path)
        if not path.endswith(".safetensors"):
            path += ".safetensors"
        tensors, _ = load_checkpoint(path)
        for name, obj in self._objects.items():
            prefix = name + "/"
            obj.load_state_dict(
                {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            )
        return _Status()
