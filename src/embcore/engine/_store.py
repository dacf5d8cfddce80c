"""Choosing an engine's store: the :data:`STORES` registry, :func:`choose_store`, and the
checks of the store options the engine validates.

The contract itself (:class:`TableStore`, :class:`StoreConfig`) is :mod:`embcore._table_store`;
:class:`~embcore.engine._local.LocalStore` keeps every table in this process,
:class:`~embcore.sharding._store.ShardedStore` splits them over the ranks of a process group.
A new kind of store is one module defining a store plus one entry in :data:`STORES` and a
rule in :func:`choose_store`; a new way of holding one table's rows is a row storage
(``embcore.rows``). See docs/architecture.md.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
import torch.distributed as dist

from embcore._table_store import CounterTensor, StoreConfig, TableStore
from embcore.ops import Backend
from embcore.rows import Chunks, StoredTensor, stored_names

__all__ = [
    "STORES",
    "Chunks",
    "CounterTensor",
    "StoreConfig",
    "StoredTensor",
    "TableStore",
    "check_rounding",
    "check_storage_dtype",
    "choose_store",
    "make_store",
    "stored_names",
]


#: every dtype some backend stores tables in (``Backend.STORAGE_DTYPES`` says which)
_STORAGE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_rounding(value: Any, storage_dtype: torch.dtype) -> bool:
    """Check ``stochastic_rounding``: a bool, and ``True`` only for half-precision rows."""
    if not isinstance(value, bool) or (value and storage_dtype == torch.float32):
        raise ValueError(
            f"EmbeddingEngine: stochastic_rounding={value!r} needs a bool, and True needs "
            "storage_dtype=torch.float16 or torch.bfloat16 (float32 rows are not rounded), "
            f"got storage_dtype={storage_dtype}"
        )
    return value


def check_storage_dtype(value: Any, backend: Backend) -> torch.dtype:
    """Check ``storage_dtype`` against the dtypes the chosen backend stores."""
    if not isinstance(value, torch.dtype) or value not in _STORAGE_DTYPES:
        raise ValueError(
            f"EmbeddingEngine: storage_dtype must be torch.float32, torch.float16 or "
            f"torch.bfloat16, got {value!r}"
        )
    if value not in backend.STORAGE_DTYPES:
        raise ValueError(
            f"EmbeddingEngine: storage_dtype={value} needs backend 'triton' (CUDA tables with "
            f"Triton installed), got backend {backend.NAME!r}; use storage_dtype=torch.float32 "
            "on the CPU and reference backends"
        )
    return value


#: Store name -> ``module:class``, imported when an engine picks it.
STORES: dict[str, str] = {
    "local": "embcore.engine._local:LocalStore",
    "sharded": "embcore.sharding._store:ShardedStore",
}


def choose_store(plan: Any, process_group: Any) -> str:
    """The store an engine gets: sharded when given a plan or a process group, or under an
    initialized process group of several ranks; else local."""
    if plan is not None or process_group is not None:
        return "sharded"
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return "sharded"
    return "local"


def make_store(config: StoreConfig, **options: Any) -> TableStore:
    """Build the store :func:`choose_store` picks; ``options`` (``plan``, ``process_group``)
    go to every store's constructor."""
    name = choose_store(options.get("plan"), options.get("process_group"))
    module, cls = STORES[name].split(":")
    return getattr(importlib.import_module(module), cls)(config, **options)
