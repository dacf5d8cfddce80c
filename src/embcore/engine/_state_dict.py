"""The engine's ``state_dict`` layout: ``step``, ``{table}.weight``, ``{table}.{slot}``.

Keys and shapes are the logical tables' whatever the store (a sharded engine's state dict
equals the single-process one's), so state dicts move between stores. A dynamic table's
entries are its keys and everything stored per key (``{table}.keys``, ``{table}.weight``,
``{table}.{slot}``, ``{table}.freq``, ...: docs/dynamic_tables.md), ``(R, ...)`` in key
order. Which form a table takes is its row storage's (``store.records(t)``: ``"tensors"`` or
``"keyed"``). ``load_state_dict(strict=False)`` loads every entry present and reports the rest, as
torch does; see docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from embcore.config import ResolvedTable
from embcore.engine._state_checks import dynamic_entries, fixed_problems
from embcore.engine._store import stored_names

__all__ = ["StateDictMethods", "check_state_dict", "load_state", "save_state", "state_items"]


class StateDictMethods:
    """The engine's ``state_dict``/``load_state_dict`` (mixed into ``EmbeddingEngine``).

    torch calls every module's ``_load_from_state_dict`` with ``strict=True`` whatever the
    caller asked and raises for missing or unexpected keys only afterwards, so the engine
    remembers the ``strict`` of its own ``load_state_dict``: a strict load with a key missing
    or unexpected loads nothing, a non-strict one loads every entry present. Inside a larger
    module's ``load_state_dict`` the engine loads what is present, as torch's modules do, and
    the outer call raises if it was strict.
    """

    _strict_load: bool | None = None

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """torch's ``load_state_dict``; returns ``(missing_keys, unexpected_keys)``."""
        self._strict_load = strict
        try:
            return nn.Module.load_state_dict(self, state_dict, strict=strict, assign=assign)  # type: ignore[arg-type]
        finally:
            self._strict_load = None

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        """``step``, then ``{table}.weight`` and ``{table}.{slot}``: :func:`save_state`."""
        save_state(self, destination, prefix, keep_vars)

    def _load_from_state_dict(
        self, state_dict: dict, prefix: str, local_metadata: dict, strict: bool, *lists: list
    ) -> None:
        missing_keys, unexpected_keys, error_msgs = lists
        strict = bool(self._strict_load)  # torch always passes True (see the class docstring)
        errors = load_state(self, state_dict, prefix, strict, missing_keys, unexpected_keys)
        error_msgs.extend(errors)


def state_items(tables: Sequence[ResolvedTable]) -> dict[str, tuple[int, str]]:
    """State-dict key (without prefix) -> ``(table index, tensor name)``, in order."""
    return {f"{t.name}.{n}": (t.index, n) for t in tables for n in stored_names(t)}


def check_state_dict(
    state_dict: Mapping[str, Any], prefix: str, expected: Mapping[str, tuple[int, ...]]
) -> tuple[list[str], list[str], list[str]]:
    """The ``expected`` keys (with their shapes) that ``state_dict`` lacks, its keys under
    ``prefix`` that are not expected, and one message per value of the wrong shape or type."""
    errors, missing = [], []
    for key, shape in expected.items():
        if key not in state_dict:
            missing.append(key)
            continue
        value = state_dict[key]
        if not isinstance(value, Tensor) or tuple(value.shape) != shape:
            got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
            errors.append(f"{key}: expected shape {shape}, got {got}")
    unexpected = [k for k in state_dict if k.startswith(prefix) and k not in expected]
    return missing, unexpected, errors


def save_state(engine: Any, destination: dict, prefix: str, keep_vars: bool) -> None:
    """``engine``'s ``_save_to_state_dict``: ``step``, then every table's tensors (full
    logical tensors, gathered from every rank for sharded tables: a collective)."""
    engine.flush()  # a checkpoint drains the pipeline, as a TPU training loop ends drained
    destination[f"{prefix}step"] = engine._step if keep_vars else engine._step.detach()
    keyed = {t.index for t in engine.tables if engine.store.records(t.index) == "keyed"}
    items = state_items([t for t in engine.tables if t.index not in keyed])
    gathered = dict(zip(items, engine.store.gather(list(items.values())), strict=True))
    for table in engine.tables:
        if table.index in keyed:
            state = engine.store.dynamic_state(table.index)
            for name, value in state.items():
                destination[f"{prefix}{table.name}.{name}"] = torch.as_tensor(value)
            continue
        for key in state_items([table]):
            value = gathered[key]
            destination[prefix + key] = value if keep_vars else value.detach()


def load_state(
    engine: Any, state_dict: dict, prefix: str, strict: bool, missing: list, unexpected: list
) -> list[str]:
    """``engine``'s ``_load_from_state_dict``: extends ``missing`` and ``unexpected``, loads
    nothing when a value is wrong or a dynamic table's state is partial (the messages are
    returned) or, with ``strict``, a key is missing or unexpected; else loads every entry
    present (a dynamic table whole, with all its parts, or not at all)."""
    items = {prefix + k: v for k, v in state_items(engine.tables).items()}
    keyed = {t.index for t in engine.tables if engine.store.records(t.index) == "keyed"}
    expected = {f"{prefix}step": ()} | {
        k: engine.store.shape(*v) for k, v in items.items() if v[0] not in keyed
    }
    dynamic: dict[int, dict[str, Any]] = {}
    lacking: list[str] = []
    partial: list[str] = []
    for table in engine.tables:  # every table is checked before the first copy
        if table.index in keyed:
            entries = dynamic_entries(table, state_dict, prefix, strict)
            head = f"{prefix}{table.name}."
            lacking += entries.lacking
            partial += entries.errors
            expected |= {head + k: tuple(getattr(v, "shape", ())) for k, v in entries.given.items()}
            dynamic[table.index] = entries.given
    absent, extra, errors = check_state_dict(state_dict, prefix, expected)
    lacking += absent
    missing.extend(lacking)
    unexpected.extend(extra)
    errors += partial + fixed_problems(
        state_dict,
        [k for k, v in items.items() if v[0] not in keyed],
        f"{prefix}step",
    )
    if errors or (strict and (lacking or extra)):
        return errors  # load nothing: a failed load leaves the engine as it was
    if not any(k in state_dict for k in expected):
        return []  # nothing of this engine's (a larger module's non-strict load)
    engine._pipeline.wait()
    with torch.no_grad():
        fixed = [(*v, state_dict[k]) for k, v in items.items() if k in state_dict]
        engine.store.load_full([x for x in fixed if x[0] not in keyed])
        for t, given in dynamic.items():
            if given:  # whole (checked above), or absent and left as it is
                engine.store.load_dynamic_state(t, given)
        if f"{prefix}step" in state_dict:
            engine._step.copy_(state_dict[f"{prefix}step"])
    engine.discard_pending()
    return []
