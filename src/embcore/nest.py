"""Nested structures of features, in ``tf.nest`` order.

A feature configuration may be a single leaf or any nesting of dicts, lists and tuples.
Flattening follows ``tf.nest`` (docs/semantics.md §1.13): dict keys are visited in sorted order,
lists and tuples in their own order. Activations and gradients come back in the same structure.

Paths name a leaf for error messages: ``"watched"``, ``"0/user"``, ``""`` for a single leaf.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["flatten_with_paths", "map_up_to", "pack"]


def _children(node: Any) -> Iterator[tuple[Any, Any]]:
    if isinstance(node, dict):
        for key in sorted(node):
            yield key, node[key]
    else:
        yield from enumerate(node)


def _is_container(node: Any) -> bool:
    return isinstance(node, (dict, list, tuple))


def flatten_with_paths(
    structure: Any, is_leaf: Callable[[Any], bool] | None = None
) -> list[tuple[str, Any]]:
    """Flatten ``structure`` into ``[(path, leaf), ...]`` in ``tf.nest`` order."""
    out: list[tuple[str, Any]] = []

    def walk(node: Any, path: str) -> None:
        if (is_leaf is not None and is_leaf(node)) or not _is_container(node):
            out.append((path, node))
            return
        for key, child in _children(node):
            walk(child, f"{path}/{key}" if path else str(key))

    walk(structure, "")
    return out


def pack(structure: Any, flat: list[Any], is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """Rebuild ``structure`` with its leaves replaced, in order, by ``flat``."""
    it = iter(flat)

    def build(node: Any) -> Any:
        if (is_leaf is not None and is_leaf(node)) or not _is_container(node):
            return next(it)
        if isinstance(node, dict):
            # Keep the user's key order in the output; values are consumed in sorted order.
            built = {key: build(child) for key, child in _children(node)}
            return {key: built[key] for key in node}
        items = [build(child) for _, child in _children(node)]
        return type(node)(items) if isinstance(node, list) else tuple(items)

    return build(structure)


def map_up_to(
    shallow: Any,
    deep: Any,
    what: str,
    is_leaf: Callable[[Any], bool] | None = None,
    missing_ok: bool = False,
) -> list[Any]:
    """Walk ``deep`` along the containers of ``shallow``; return the leaves of ``deep``.

    ``deep`` must have every container of ``shallow``; at a leaf of ``shallow`` anything may
    stand in ``deep`` (a tensor, a sparse tensor, ``None``). Mismatches raise ``ValueError``
    (missing or unknown keys, wrong lengths) or ``TypeError`` (wrong container type), naming
    the path and ``what`` the structure is ("features", "weights", "gradients"). With
    ``missing_ok``, a dict key absent from ``deep`` reads as ``None`` (unknown keys still raise).
    """
    out: list[Any] = []

    def walk(s: Any, d: Any, path: str) -> None:
        if (is_leaf is not None and is_leaf(s)) or not _is_container(s):
            out.append(d)
            return
        where = f"at '{path}'" if path else "at the top level"
        if isinstance(s, dict):
            if not isinstance(d, dict):
                raise TypeError(
                    f"{what} {where}: expected a dict with keys {sorted(s)}, got {type(d).__name__}"
                )
            missing = [] if missing_ok else sorted(set(s) - set(d), key=str)
            unknown = sorted(set(d) - set(s), key=str)
            if missing or unknown:
                raise ValueError(
                    f"{what} {where}: keys do not match the feature config; "
                    f"missing {missing}, unknown {unknown}; expected exactly {sorted(s, key=str)}"
                )
        else:
            if not isinstance(d, (list, tuple)):
                raise TypeError(
                    f"{what} {where}: expected a {type(s).__name__} of length {len(s)}, "
                    f"got {type(d).__name__}"
                )
            if len(d) != len(s):
                raise ValueError(
                    f"{what} {where}: expected {len(s)} entries as in the feature config, "
                    f"got {len(d)}"
                )
        for key, child in _children(s):
            sub = d.get(key) if isinstance(d, dict) else d[key]
            walk(child, sub, f"{path}/{key}" if path else str(key))

    walk(shallow, deep, "")
    return out
