"""A serving bundle of dynamic tables, rebuilt by embcore from its tensor files.

A dynamic table's bundle entry is its keys (``"<name>.keys"``, ``(R,) int64``, ascending) and
their rows (``"<name>"``, ``(R, dim) float32``) in ``tables.safetensors``. The model that
serves them is built here, by embcore's own code, from the run's config: the DLRM with each
engine replaced by its :class:`embcore.serving.ServingLookup` (binary search among the keys,
an unknown key reads a zero row), so serving reads tensors and JSON only, never a program or
a pickle (docs/serving.md, docs/reliability.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor, nn

from embcore.data.batch import SPARSE_NAMES, capped_vocab_sizes
from embcore.serving import serving_module
from embcore.train.config import Config
from embcore.train.model import build_model

__all__ = ["KEYS", "dynamic_model"]

KEYS = ".keys"  # tables.safetensors: "<table>.keys" holds a dynamic table's keys


def dynamic_model(
    root: Path, config: Config, tables: dict[str, Tensor], manifest: dict
) -> nn.Module:
    """The eval-mode serving model of a bundle whose tables are dynamic, without its dense
    weights (the caller loads ``dense.safetensors``).

    Args:
        root: the bundle directory (for messages).
        config: the run's config (``model.tables = "dynamic"``).
        tables: ``tables.safetensors``: ``{name: (R, dim) float32, name + ".keys": (R,) int64}``
            for every feature of ``SPARSE_NAMES``.
        manifest: ``config.json``: its ``tables`` entry records each table's ``rows``.

    Raises:
        ValueError: the tensors are not the tables of ``config.json`` (naming the file and
            the table).
    """
    where = f"{root}/tables.safetensors"
    want = sorted([*SPARSE_NAMES, *(f"{n}{KEYS}" for n in SPARSE_NAMES)])
    if sorted(tables) != want:
        missing = sorted(set(want) - set(tables))[:3]
        extra = sorted(set(tables) - set(want))[:3]
        raise ValueError(
            f"{where}: expected each dynamic table's rows and keys, missing {missing}, "
            f"unexpected {extra}"
        )
    model = build_model(
        config.model,
        capped_vocab_sizes(config.data.vocab_cap),
        optimizer=None,
        seed=0,
        raw_ids=config.data.raw_ids,
    )
    served = serving_module(model)
    lookup: Any = served.engine
    recorded = manifest.get("tables", {})
    for name in SPARSE_NAMES:
        keys, rows = tables[f"{name}{KEYS}"], tables[name]
        entry = recorded.get(name)
        if not isinstance(entry, dict) or entry.get("rows") != int(keys.shape[0]):
            raise ValueError(
                f"{where}: table '{name}' holds {keys.shape[0]} keys, config.json records "
                f"{entry.get('rows') if isinstance(entry, dict) else None!r} rows"
            )
        try:
            lookup.load_dynamic(name, keys, rows)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
    return served
