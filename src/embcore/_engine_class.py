"""The engine class, for the one name below :mod:`embcore.engine` that builds an engine.

``ShardedEmbeddingEngine`` (:mod:`embcore.sharding.compat`), the name earlier versions gave an
engine over a sharded store, constructs an :class:`embcore.EmbeddingEngine`. The sharding
package sits below the engine (the engine builds its sharded store), so it does not import the
engine: :mod:`embcore.engine` registers its class here when it is imported, which
``import embcore`` does before any of its subpackages can be used.
"""

from __future__ import annotations

__all__ = ["engine_class", "register_engine"]

_registered: list[type] = []


def register_engine(cls: type) -> None:
    """Make ``cls`` the class :func:`engine_class` returns."""
    _registered[:] = [cls]


def engine_class() -> type:
    """The registered engine class (:class:`embcore.EmbeddingEngine`)."""
    if not _registered:  # only while embcore.engine itself is being imported
        raise RuntimeError("embcore: the engine class is not registered yet (import embcore)")
    return _registered[0]
