"""Load embedding tables and optimizer slots from a TensorFlow checkpoint into an engine.

Two TensorFlow layouts are read, without TensorFlow (see docs/feature_columns.md,
"TensorFlow checkpoints")::

    layout       written by                          table T               slot S of T
    "midlevel"   tf.train.Checkpoint of a            <path>/T/.ATTRIBUTES  <path>/T.S<S>/.ATTRIBUTES
                 TPUEmbedding / ...ForServing        /VARIABLE_VALUE       /VARIABLE_VALUE
    "estimator"  TPUEstimator + EmbeddingConfigSpec  <scope>/X_embedding   .../embedding_weights/
                 (table tbl_X, one part per host)    /embedding_weights    Adagrad, Adam/m, ...

The engine's tables and slot names are TensorFlow's, so the mapping is by name; every shape is
checked and nothing is written unless the whole checkpoint maps.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embcore.compat._tf_bundle import (
    CheckpointError,
    checkpoint_dtypes,
    checkpoint_shapes,
    read_checkpoint,
    read_small_file,
)
from embcore.engine import EmbeddingEngine

__all__ = ["CheckpointError", "load_tf_checkpoint", "resolve_checkpoint_prefix"]

_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"
# TPUEstimator's slot variables, by embcore (= mid-level TensorFlow) slot name and optimizer.
_ESTIMATOR_SLOTS = {
    ("Adagrad", "accumulators"): "Adagrad",
    ("Adam", "momenta"): "Adam/m",
    ("Adam", "velocities"): "Adam/v",
    ("FTRL", "accumulators"): "Ftrl",
    ("FTRL", "linears"): "Ftrl_1",
}


#: the largest ``checkpoint`` state file read (TensorFlow's are a few hundred bytes)
MAX_STATE_BYTES = 1 << 20


def resolve_checkpoint_prefix(path: str | Path) -> Path:
    """A checkpoint prefix from a prefix or a directory (whose ``checkpoint`` file names the
    latest one, as ``tf.train.latest_checkpoint`` reads it).

    The ``checkpoint`` file is read as a regular file of at most 1 MiB (not a link, FIFO or
    device), and the prefix it names must lie inside the directory: a relative name is taken
    from the directory, an absolute one must point into it.

    Raises:
        CheckpointError: no ``.index`` file at the prefix, a directory without checkpoint, or
            a ``checkpoint`` file that is unsafe, malformed or names a place outside.
    """
    path = Path(path)
    if path.is_dir():
        state = path / "checkpoint"
        try:
            text = read_small_file(state, MAX_STATE_BYTES, "checkpoint state").decode()
        except UnicodeDecodeError as e:
            raise CheckpointError(f"{state}: not a text file ({e})") from e
        found = re.findall(r'^model_checkpoint_path:\s*"([^"\\\n]*)"\s*$', text, re.M)
        if len(found) != 1:  # TensorFlow's parser would take the last of several
            raise CheckpointError(
                f"{state}: expected one model_checkpoint_path line, found {len(found)}"
            )
        path = _inside(path, found[0], state)
    index = path.with_name(path.name + ".index")
    if not os.path.lexists(index):  # present: opened (and refused if unsafe) when read
        raise CheckpointError(
            f"{path}: no TensorFlow checkpoint here (expected {path.name}.index beside the "
            "data files; pass the prefix such as .../model.ckpt-100 or its directory)"
        )
    return path


def _inside(directory: Path, named: str, state: Path) -> Path:
    """The prefix ``named`` by ``state``, refused unless it lies inside ``directory``."""
    prefix = Path(named) if Path(named).is_absolute() else directory / named
    home = os.path.realpath(directory)
    where = os.path.realpath(prefix.parent)
    if not named or os.path.commonpath([home, where]) != home:
        local = directory / Path(named).name
        hint = f" (pass the prefix {local} if that is the one)" if named else ""
        raise CheckpointError(
            f"{state}: model_checkpoint_path {named!r} is not inside {directory}; only a "
            f"checkpoint of the directory itself is read from its checkpoint file{hint}"
        )
    return prefix


def _engine_of(target: Any) -> EmbeddingEngine:
    """The engine of an engine, an ``EmbeddingLookup``, ``DenseFeatures``, an ``Estimator`` or
    a ``compat.tpu.TPUEmbedding``."""
    if isinstance(target, EmbeddingEngine):
        return target
    lookup = getattr(target, "embedding_lookup", None)  # Estimator
    if lookup is None and callable(getattr(target, "build", None)):  # DenseFeatures
        lookup = target.build()
    engine = getattr(lookup if lookup is not None else target, "engine", None)
    if not isinstance(engine, EmbeddingEngine):
        raise TypeError(
            "load_tf_checkpoint: expected an EmbeddingEngine, an Estimator, DenseFeatures, "
            "an EmbeddingLookup or a TPUEmbedding with engine tables, got "
            f"{type(target).__name__}"
        )
    return engine


def _escape(name: str) -> str:
    """An object-graph local name as checkpoint keys spell it ('.' -> '..', '/' -> '.S')."""
    return name.replace(".", "..").replace("/", ".S")


def _midlevel_table(table: str, names: list[str]) -> list[str]:
    suffix = f"{_escape(table)}{_VALUE}"
    return [n for n in names if n == suffix or n.endswith("/" + suffix)]


def _midlevel_slot(variable: str, slot: str) -> str:
    return variable[: -len(_VALUE)] + ".S" + _escape(slot) + _VALUE


def _estimator_table(table: str, names: list[str]) -> list[str]:
    column = table[4:] if table.startswith("tbl_") else table
    parents = {column, column + "_embedding"}
    out = []
    for n in names:
        parts = n.split("/")
        if len(parts) >= 2 and parts[-1] == "embedding_weights" and parts[-2] in parents:
            out.append(n)
    return out


def _estimator_slot(variable: str, optimizer: str, slot: str) -> str | None:
    suffix = _ESTIMATOR_SLOTS.get((optimizer, slot))
    return None if suffix is None else f"{variable}/{suffix}"


def _detect(names: list[str]) -> str:
    return "midlevel" if any(n.endswith(_VALUE) for n in names) else "estimator"


def load_tf_checkpoint(
    target: Any,
    path: str | Path,
    *,
    layout: str = "auto",
    slots: bool = True,
    variable_names: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Copy a TensorFlow checkpoint's embedding tables (and optimizer slots) into ``target``.

    Args:
        target: an :class:`~embcore.EmbeddingEngine`, or an ``Estimator``, ``DenseFeatures``,
            ``EmbeddingLookup`` or ``compat.tpu.TPUEmbedding`` (their engine), built from the
            same table configs (names, ``(vocabulary_size, dim)`` and optimizers) as the
            TensorFlow model.
        path: the checkpoint prefix (``.../ckpt-1``, ``.../model.ckpt-100``) or a directory
            with a ``checkpoint`` file.
        layout: ``"midlevel"`` (``tf.train.Checkpoint`` of a ``TPUEmbedding`` /
            ``TPUEmbeddingForServing``), ``"estimator"`` (``TPUEstimator`` with
            ``EmbeddingConfigSpec``), or ``"auto"`` (object-graph keys mean midlevel).
        slots: also load every optimizer slot of the engine's tables (they must be in the
            checkpoint); ``False`` loads the tables only and leaves the slots as they are.
        variable_names: ``{table name: checkpoint name of its table variable}`` where the
            default rule (see the module docstring) does not find it, or finds several.

    Returns:
        ``{engine state key: checkpoint tensor name}`` of everything loaded, such as
        ``{"tbl_a.weight": "model/embedding/tbl_a/.ATTRIBUTES/VARIABLE_VALUE", ...}``.

    Raises:
        CheckpointError: an unreadable, unsafe or malformed checkpoint (naming the file and
            the tensor), or one that does not map onto the engine: a table or slot it lacks
            (naming the table, the slot and the name looked for), one found under several
            names, a shape or dtype that differs (both named), or a dynamic table in the
            engine (TensorFlow tables have fixed rows). The engine is unchanged then.
    """
    if layout not in ("auto", "midlevel", "estimator"):
        raise ValueError(
            f"load_tf_checkpoint: layout must be 'auto', 'midlevel' or 'estimator', got {layout!r}"
        )
    engine = _engine_of(target)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"load_tf_checkpoint: path must be a str or os.PathLike, got {type(path).__name__}"
        )
    prefix = resolve_checkpoint_prefix(path)
    dynamic = [t.name for t in engine.tables if t.dynamic]
    if dynamic:
        raise CheckpointError(
            f"{prefix}: tables {dynamic} are dynamic (vocabulary_size=None); a TensorFlow table "
            "holds the rows of ids 0 .. V-1 of a fixed vocabulary, and its keys, counts and "
            "last-seen steps would have to be made up. Load it into a table with that "
            "vocabulary_size, or build the dynamic table's state (keys, weight, slots, freq, "
            "last_seen, step) yourself and pass it to load_state_dict"
        )
    shapes = checkpoint_shapes(prefix)  # the index only: tensors are read once they map
    dtypes = checkpoint_dtypes(prefix)
    names = sorted(shapes)
    layout = _detect(names) if layout == "auto" else layout
    overrides = dict(variable_names or {})
    unknown = sorted(set(overrides) - set(engine.table_names))
    if unknown:
        raise ValueError(
            f"load_tf_checkpoint: variable_names names tables {unknown} that the engine does "
            f"not have (tables: {engine.table_names})"
        )
    state = engine.state_dict()
    loaded: dict[str, str] = {}

    def take(key: str, name: str, what: str) -> None:
        expected = tuple(state[key].shape)
        if shapes[name] != expected:
            raise CheckpointError(
                f"{prefix}: {what}: checkpoint tensor '{name}' has shape "
                f"{list(shapes[name])}, the engine expects {list(expected)}"
            )
        want = str(state[key].dtype).removeprefix("torch.")
        if dtypes[name] != want:
            raise CheckpointError(
                f"{prefix}: {what}: checkpoint tensor '{name}' is {dtypes[name]}, the engine "
                f"holds {want} (values are never converted)"
            )
        loaded[key] = name

    for table in engine.tables:
        what = f"table '{table.name}'"
        if table.name in overrides:
            found = [overrides[table.name]] if overrides[table.name] in shapes else []
            looked_for = f"'{overrides[table.name]}' (from variable_names)"
        elif layout == "midlevel":
            found = _midlevel_table(table.name, names)
            looked_for = f"'<path>/{_escape(table.name)}{_VALUE}'"
        else:
            found = _estimator_table(table.name, names)
            column = table.name[4:] if table.name.startswith("tbl_") else table.name
            looked_for = f"'<scope>/{column}_embedding/embedding_weights'"
        if not found:
            raise CheckpointError(
                f"{prefix}: {what} is not in the {layout} checkpoint (looked for {looked_for}; "
                f"it holds {len(names)} tensors: {names[:8]}{' ...' if len(names) > 8 else ''}"
                "); pass variable_names={table: checkpoint name} if it is stored elsewhere"
            )
        if len(found) > 1:
            raise CheckpointError(
                f"{prefix}: {what} matches several checkpoint tensors {found}; pick one with "
                "variable_names={table: checkpoint name}"
            )
        variable = found[0]
        take(f"{table.name}.weight", variable, what)
        if not slots or table.optimizer is None:
            continue
        optimizer = type(table.optimizer).__name__
        for spec in table.optimizer.slot_specs():
            key = f"{table.name}.{spec.name}"
            if layout == "midlevel":
                name = _midlevel_slot(variable, spec.name)
            else:
                name = _estimator_slot(variable, optimizer, spec.name)  # type: ignore[assignment]
            where = f"table '{table.name}', {optimizer} slot '{spec.name}'"
            if name is None:
                raise CheckpointError(
                    f"{prefix}: {where}: TPUEstimator checkpoints have no such slot (known: "
                    f"{sorted(f'{o}.{s}' for o, s in _ESTIMATOR_SLOTS)}); pass slots=False "
                    "to load the tables only"
                )
            if name not in shapes:
                raise CheckpointError(
                    f"{prefix}: {where} is not in the checkpoint (looked for '{name}'); was it "
                    "written with another optimizer? Pass slots=False to load the tables only"
                )
            take(key, name, where)
    tensors = read_checkpoint(prefix, list(loaded.values()))  # checksums verified here
    for key, name in loaded.items():
        state[key] = torch.from_numpy(np.ascontiguousarray(tensors[name]))
    engine.load_state_dict(state)  # everything checked and read: one update
    return loaded
