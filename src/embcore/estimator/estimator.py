"""``Estimator``: TPUEstimator-style training, evaluation, prediction and export on the engine.

The loop of one training step::

    features, labels = next(input_fn())                   raw features, any container
    activations = engine(ids of every embedding column)    (B, dim) / (B, L, dim) per feature
                + dense lookups of "tpu_tensor_core" columns
    spec = model_fn(EmbeddedFeatures(features, activations), labels, mode, params)
    spec.loss.backward()       # the engine updates its tables (gradients x multiplier)
    spec.optimizer.step()      # the dense model and the dense embedding tables
    global_step += 1

What the Estimator owns, and so checkpoints and exports: the embedding tables (engine and
dense), ``model_fn`` itself if it is an ``nn.Module``, every ``nn.Module`` value of ``params``,
and the state of the torch optimizer ``model_fn`` returns. Build the dense model in one of those
two places, so that a fresh process resuming from ``model_dir`` gets it back.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from embcore.errors import UserError, reading
from embcore.estimator import model_dir as io
from embcore.estimator import state
from embcore.estimator.calls import accepted_args, iterate_input
from embcore.estimator.spec import EstimatorSpec, ModeKeys
from embcore.feature_column.config_spec import EmbeddingConfigSpec
from embcore.feature_column.embedding import EmbeddingColumn, embedding_columns_from_config
from embcore.feature_column.lookup import EmbeddedFeatures, EmbeddingLookup

__all__ = ["Estimator"]

#: ``train`` reports here as TensorFlow's Estimator does: ``loss = ..., step = ...`` and
#: ``global_step/sec`` every ``log_step_count_steps`` steps, at INFO level.
logger = logging.getLogger("embcore.estimator")


class Estimator:
    """Train, evaluate, predict and export a model whose embeddings run on the engine.

    Args:
        model_fn: ``model_fn(features, labels, mode, params)`` returning an
            :class:`EstimatorSpec`; it may omit any argument but ``features``. ``features`` is
            an :class:`~embcore.feature_column.EmbeddedFeatures`: the raw feature dict, with
            the embedding columns' activations in ``features.activations`` (what
            ``DenseFeatures(columns)(features)`` arranges). May be an ``nn.Module``.
        model_dir: where checkpoints go; an Estimator resumes from the newest one there.
        embedding_config_spec: what to embed and how (:class:`EmbeddingConfigSpec`).
        params: handed to ``model_fn`` and ``input_fn`` (a shallow copy each call);
            ``nn.Module`` values are checkpointed as ``params.<key>``.
        seed: seeds the tables' default initializers.
        device: where the tables live.
        save_checkpoints_steps: also checkpoint every this many steps (always at the end of
            ``train``).
        keep_checkpoint_max: how many checkpoints to keep.
        log_step_count_steps: ``train`` logs the loss and the step (at the first step and
            every this many steps) and the steps per second, as TensorFlow's Estimator does, to
            the ``embcore.estimator`` logger at INFO level (``None``: no progress logs).
    """

    def __init__(
        self,
        model_fn: Callable[..., EstimatorSpec],
        model_dir: str | os.PathLike | None = None,
        embedding_config_spec: EmbeddingConfigSpec | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        seed: int = 0,
        device: torch.device | str | None = None,
        save_checkpoints_steps: int | None = None,
        keep_checkpoint_max: int = 5,
        log_step_count_steps: int | None = 100,
    ) -> None:
        if not callable(model_fn):
            raise ValueError(f"Estimator: model_fn must be callable, got {model_fn!r}")
        if embedding_config_spec is not None and not isinstance(
            embedding_config_spec, EmbeddingConfigSpec
        ):
            raise TypeError(
                "Estimator: embedding_config_spec must be an EmbeddingConfigSpec, got "
                f"{type(embedding_config_spec).__name__}"
            )
        if params is not None and not isinstance(params, Mapping):
            raise ValueError(f"Estimator: params must be a dict, got {type(params).__name__}")
        for name, value in (
            ("save_checkpoints_steps", save_checkpoints_steps),
            ("keep_checkpoint_max", keep_checkpoint_max),
            ("log_step_count_steps", log_step_count_steps),
        ):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"Estimator: {name} must be an int >= 1, got {value!r}")
        self._model_fn = model_fn
        self._model_args = accepted_args(model_fn)
        self._model_dir = None if model_dir is None else Path(model_dir)
        self._spec = embedding_config_spec
        self._params = dict(params or {})
        self._seed, self._device = seed, device
        self._save_steps, self._keep = save_checkpoints_steps, keep_checkpoint_max
        self._log_steps = log_step_count_steps
        self._columns: tuple[EmbeddingColumn, ...] = (
            embedding_config_spec.embedding_columns if embedding_config_spec else ()
        )
        self._serving_only = False
        self._lookup: EmbeddingLookup | None = None
        self._built = False
        self._profiling = False
        self._global_step = 0
        self._optimizer: torch.optim.Optimizer | None = None
        self._pending_optimizer: tuple[dict[str, Tensor], dict] | None = None

    # ------------------------------------------------------------------------- properties
    @property
    def model_dir(self) -> Path | None:
        return self._model_dir

    @property
    def params(self) -> dict[str, Any]:
        return dict(self._params)

    @property
    def global_step(self) -> int:
        """Training steps run so far (restored from ``model_dir`` on first use)."""
        self._build()
        return self._global_step

    @property
    def embedding_lookup(self) -> EmbeddingLookup | None:
        """The engine and dense tables (built and restored on first use)."""
        self._build()
        return self._lookup

    def latest_checkpoint(self) -> Path | None:
        return None if self._model_dir is None else io.latest_checkpoint(self._model_dir)

    def _modules(self) -> dict[str, nn.Module]:
        modules = {"model": self._model_fn} if isinstance(self._model_fn, nn.Module) else {}
        for key, value in self._params.items():
            if isinstance(value, nn.Module):
                modules[f"params.{key}"] = value
        return modules

    # ----------------------------------------------------------------------- build/restore
    def _build(self) -> None:
        if self._built:
            return
        if self._columns:
            spec = self._spec
            optimizer = None
            options: dict[str, Any] = {}
            if not self._serving_only and spec is not None:
                optimizer = spec.table_optimizers(lambda: self._global_step)
                options = spec.engine_options()
            self._lookup = EmbeddingLookup(
                self._columns,
                optimizer,
                seed=self._seed,
                device=self._device,
                engine_options=options,
            )
        self._profiling = "profile_data_directory" in options if self._columns else False
        self._built = True
        pointer = self._model_dir / "checkpoint.json" if self._model_dir is not None else None
        if pointer is not None and pointer.exists() and not pointer.is_file():
            raise UserError(f"{pointer}: is not a file (an Estimator's list of checkpoints)")
        with reading(pointer or "model_dir", "the checkpoint list an Estimator writes"):
            latest = self.latest_checkpoint()
        if latest is not None:
            with reading(latest, "a checkpoint directory written by an Estimator"):
                self._restore(*io.read_directory(latest, "checkpoint"))

    def _restore(self, tensors: dict[str, Tensor], meta: dict) -> None:
        optimizer = state.restore_tensors(self._lookup, self._modules(), tensors)
        if meta.get("optimizer") is not None:
            self._pending_optimizer = (optimizer, meta["optimizer"])
        self._global_step = int(meta["global_step"])

    def _state(self, with_optimizer: bool) -> tuple[dict[str, Tensor], dict]:
        modules = self._modules()
        tensors = state.collect_tensors(self._lookup, modules, with_slots=with_optimizer)
        meta: dict[str, Any] = {
            "global_step": self._global_step,
            "columns": [c.to_config() for c in self._columns],
            "optimizer": None,
        }
        saved = None
        if with_optimizer and self._optimizer is not None:
            state.check_owned(self._optimizer, self._lookup, modules)
            saved = io.optimizer_state(self._optimizer)
        elif with_optimizer:
            saved = self._pending_optimizer  # restored, not yet used: keep it
        if saved is not None:
            tensors.update({f"optimizer/{k}": v for k, v in saved[0].items()})
            meta["optimizer"] = saved[1]
        return tensors, meta

    def _save(self) -> Path | None:
        if self._model_dir is None:
            return None
        tensors, meta = self._state(with_optimizer=True)
        logger.info("Saving checkpoints for %d into %s.", self._global_step, self._model_dir)
        return io.write_checkpoint(self._model_dir, self._global_step, tensors, meta, self._keep)

    # ------------------------------------------------------------------------------ calls
    def _params_for(self, mode: str) -> dict[str, Any]:
        """The params handed to ``model_fn`` and ``input_fn`` in ``mode``."""
        return dict(self._params)

    def _batches(self, input_fn: Callable[..., Any], mode: str) -> Iterator[tuple[Any, Any]]:
        arguments = {"params": self._params_for(mode), "mode": mode, "config": None}
        return iterate_input(input_fn, arguments)

    def _embed(self, features: Mapping[str, Any], mode: str) -> EmbeddedFeatures:
        lookup = self._lookup
        if lookup is None:
            return EmbeddedFeatures(features, {})
        batch = lookup.transform(features)
        acts: dict[str, Tensor] = {}
        if lookup.engine is not None:
            acts.update(lookup.engine(batch.ids, batch.weights or None))
            multiplier = self._spec.experimental_gradient_multiplier_fn if self._spec else None
            if mode == ModeKeys.TRAIN and multiplier is not None:
                factor = float(multiplier(self._global_step))
                for act in acts.values():
                    if act.requires_grad:  # scales the gradient the engine receives
                        act.register_hook(lambda g, f=factor: g * f)
        acts.update(lookup.dense_activations(batch))
        return EmbeddedFeatures(features, acts, batch.lengths)

    def _call(self, features: EmbeddedFeatures, labels: Any, mode: str) -> EstimatorSpec:
        kwargs: dict[str, Any] = {}
        if "labels" in self._model_args:
            kwargs["labels"] = labels
        elif labels is not None:
            raise ValueError("model_fn does not take labels, but input_fn returns labels")
        if "mode" in self._model_args:
            kwargs["mode"] = mode
        if "params" in self._model_args:
            kwargs["params"] = self._params_for(mode)
        if "config" in self._model_args:
            kwargs["config"] = None
        spec = self._model_fn(features, **kwargs)
        if not isinstance(spec, EstimatorSpec):
            raise ValueError(f"model_fn must return an EstimatorSpec, got {type(spec).__name__}")
        spec.check_for(mode)
        return spec

    def _set_training(self, training: bool) -> None:
        for module in self._modules().values():
            module.train(training)
        if self._lookup is not None:
            self._lookup.train(training)

    # ---------------------------------------------------------------------------- training
    def _adopt(self, optimizer: torch.optim.Optimizer | None) -> None:
        """First sight of the model's optimizer: give it the dense tables, load its state."""
        dense = list(self._lookup.dense_params) if self._lookup is not None else []
        if optimizer is None:
            if dense:
                raise ValueError(
                    "model_fn returned no optimizer, but 'tpu_tensor_core' (dense) columns are "
                    "trained by the model's optimizer; return one in the EstimatorSpec"
                )
            return
        if optimizer is self._optimizer:
            return
        if self._optimizer is not None:
            raise ValueError(
                "model_fn returned a different optimizer than before; create it once (in the "
                "model's __init__ or in params) so that its state carries across steps"
            )
        have = {id(p) for g in optimizer.param_groups for p in g["params"]}
        missing = [p for p in dense if id(p) not in have]
        if missing:
            optimizer.add_param_group({"params": missing})
        if self._pending_optimizer is not None:
            io.load_optimizer_state(optimizer, *self._pending_optimizer)
            self._pending_optimizer = None
        self._optimizer = optimizer

    def _train_step(self, features: Mapping[str, Any], labels: Any) -> Tensor:
        embedded = self._embed(features, ModeKeys.TRAIN)
        spec = self._call(embedded, labels, ModeKeys.TRAIN)
        self._adopt(spec.optimizer)
        if spec.optimizer is not None:
            spec.optimizer.zero_grad(set_to_none=True)
        spec.loss.backward()  # type: ignore[union-attr]
        if spec.optimizer is not None:
            spec.optimizer.step()
        self._global_step += 1
        return spec.loss.detach()  # type: ignore[union-attr]

    def train(
        self,
        input_fn: Callable[..., Any],
        steps: int | None = None,
        max_steps: int | None = None,
    ) -> Estimator:
        """Train for ``steps`` more steps, up to ``max_steps`` in all, or until ``input_fn``'s
        data runs out; then checkpoint (with a ``model_dir``).

        Args:
            input_fn: ``input_fn(params)`` (``params`` and ``mode`` optional) returning an
                iterable of feature dicts or ``(features, labels)`` pairs.
        """
        if self._serving_only:
            raise RuntimeError("Estimator.train: this Estimator was loaded from an export")
        if steps is not None and max_steps is not None:
            raise ValueError("Estimator.train: give steps or max_steps, not both")
        for name, value in (("steps", steps), ("max_steps", max_steps)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"Estimator.train: {name} must be an int >= 1, got {value!r}")
        self._build()
        if self._lookup is not None:
            self._lookup.check_trainable()
        target = max_steps if steps is None else self._global_step + steps
        self._set_training(True)
        saved_at = None
        batches = self._batches(input_fn, ModeKeys.TRAIN)
        loss, since, steps_since, first = None, time.perf_counter(), 0, True
        while target is None or self._global_step < target:
            try:
                features, labels = next(batches)
            except StopIteration:
                break
            loss = self._train_step(features, labels)
            steps_since += 1
            if self._log_steps and (first or self._global_step % self._log_steps == 0):
                since, steps_since = self._log_progress(loss, since, steps_since, first)
                first = False
            if self._save_steps and self._global_step % self._save_steps == 0:
                self._save()
                saved_at = self._global_step
        if saved_at != self._global_step:
            self._save()
        if loss is not None and self._log_steps:
            logger.info("Loss for final step: %s.", f"{float(loss):.6g}")
        if self._profiling:
            self._lookup.engine.write_statistics()  # type: ignore[union-attr]
        return self

    def _log_progress(
        self, loss: Tensor, since: float, steps: int, first: bool
    ) -> tuple[float, int]:
        """TensorFlow's lines: ``loss = 0.693, step = 100 (1.234 sec)``, ``global_step/sec``."""
        now = time.perf_counter()
        if not first:  # there is a rate to report
            logger.info("global_step/sec: %s", f"{steps / max(now - since, 1e-9):.4g}")
            logger.info(
                "loss = %s, step = %d (%.3f sec)", f"{float(loss):.6g}", self._global_step,
                now - since,
            )  # fmt: skip
        else:
            logger.info("loss = %s, step = %d", f"{float(loss):.6g}", self._global_step)
        return now, 0

    # ----------------------------------------------------------------- evaluate / predict
    def evaluate(self, input_fn: Callable[..., Any], steps: int | None = None) -> dict[str, Any]:
        """Mean loss over the batches, each metric's mean over its elements, and
        ``global_step``; at most ``steps`` batches."""
        self._build()
        self._set_training(False)
        loss, batches = 0.0, 0
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        with torch.no_grad():
            for features, labels in self._batches(input_fn, ModeKeys.EVAL):
                if steps is not None and batches >= steps:
                    break
                spec = self._call(self._embed(features, ModeKeys.EVAL), labels, ModeKeys.EVAL)
                loss += float(spec.loss)  # type: ignore[arg-type]
                batches += 1
                for name, value in (spec.eval_metrics or {}).items():
                    v = torch.as_tensor(value, dtype=torch.float64)
                    sums[name] = sums.get(name, 0.0) + float(v.sum())
                    counts[name] = counts.get(name, 0) + v.numel()
        if not batches:
            raise ValueError("Estimator.evaluate: input_fn gave no batches")
        out: dict[str, Any] = {"loss": loss / batches}
        out.update({name: sums[name] / max(counts[name], 1) for name in sums})
        out["global_step"] = self._global_step
        return out

    def predict(
        self, input_fn: Callable[..., Any], yield_single_examples: bool = True
    ) -> Iterator[Any]:
        """Yield ``model_fn``'s predictions, one example at a time (or one batch)."""
        self._build()
        self._set_training(False)
        for features, _ in self._batches(input_fn, ModeKeys.PREDICT):
            with torch.no_grad():
                spec = self._call(self._embed(features, ModeKeys.PREDICT), None, ModeKeys.PREDICT)
            predictions = spec.predictions
            if not yield_single_examples:
                yield predictions
            elif isinstance(predictions, Mapping):
                sizes = {k: len(v) for k, v in predictions.items()}
                if len(set(sizes.values())) != 1:
                    raise ValueError(f"predictions have different batch sizes: {sizes}")
                for i in range(next(iter(sizes.values()))):
                    yield {k: v[i] for k, v in predictions.items()}
            else:
                yield from predictions

    # ------------------------------------------------------------------------------ export
    def export(self, path: str | os.PathLike) -> Path:
        """Write what serving needs (no optimizer state) to the directory ``path``; load it
        with :meth:`from_export`."""
        self._build()
        tensors, meta = self._state(with_optimizer=False)
        return io.write_directory(path, tensors, {**meta, "kind": "export"})

    @classmethod
    def from_export(
        cls,
        path: str | os.PathLike,
        model_fn: Callable[..., EstimatorSpec],
        params: Mapping[str, Any] | None = None,
        *,
        device: torch.device | str | None = None,
    ) -> Estimator:
        """An Estimator that evaluates and predicts with an export: its columns are rebuilt
        from the export, its tables and modules loaded; ``model_fn`` and the modules in
        ``params`` must be those the export was made with (fresh instances are fine)."""
        with reading(path, "a directory written by Estimator.export"):
            tensors, meta = io.read_directory(path, "export")
            estimator = cls(model_fn, params=params, device=device)
            estimator._columns = tuple(embedding_columns_from_config(meta["columns"]))
            estimator._serving_only = True
            estimator._build()
            estimator._restore(tensors, meta)
        return estimator
