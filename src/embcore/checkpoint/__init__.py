"""Checkpoints of embedding engines on ``torch.distributed.checkpoint`` (DCP): atomic, verified.

A checkpoint stores every table and slot as its full logical tensor, under the engine's
state-dict keys (``{table}.weight``, ``{table}.{slot}``, ``step``), whatever the sharding
(never a ``mod``-interleaved layout). So a checkpoint written by N ranks under one plan loads
into M ranks under another, into one process, or into a CPU serving engine
(``optimizer=None``: slots in the checkpoint are ignored), with identical values::

    ec.checkpoint.save(engine, "ckpt/step-1000")      # every rank calls it
    ec.checkpoint.load(engine, "ckpt/step-1000")

Dynamic tables (``vocabulary_size=None``) are stored as records by key (keys, rows, slots,
counts, last-seen steps, pending counts: no row numbers), and ``save(engine, path,
base=earlier)`` writes a delta holding only what changed since ``earlier``; a load reads the
chain (see docs/dynamic_tables.md).

Atomic (a save writes its own temporary directory and publishes it with one rename), verified
(a load checks the manifest, DCP's metadata and every chunk's sha256 before it changes
anything) and safe to read from anyone (file names confined to the checkpoint directory, no
code unpickled). The modules: ``_save``, ``_load`` (the protocols), ``_manifest``,
``_digest`` (safe reads, checksums), ``_dcp`` (DCP adapters), ``_engine_view`` (the only
module that looks inside an engine), and for dynamic tables ``_records`` (keyed records and
their digests), ``_dynamic`` (a table's state as records, whole or as a delta), ``_chain``
(bases of deltas) and ``_delta`` (between the two). See docs/reliability.md.
"""

from __future__ import annotations

from embcore.checkpoint._errors import CheckpointError
from embcore.checkpoint._load import load, read_manifest, verify
from embcore.checkpoint._save import save
from embcore.checkpoint._verified import Verified

__all__ = ["CheckpointError", "Verified", "load", "read_manifest", "save", "verify"]
