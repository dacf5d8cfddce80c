"""``EmbeddingEngine.close()`` and the engine as a context manager.

Closing releases now, rather than when the garbage collector gets to it, what the tables hold
outside the process's memory: a disk table's working file and its directory's lock, so that
another engine may open the directory at once. A closed engine refuses further steps with one
clear error. See docs/disk_tables.md ("Closing").
"""

from __future__ import annotations

from typing import Any

__all__ = ["Closing"]


class Closing:
    """The ``close`` / ``with`` part of :class:`embcore.EmbeddingEngine`."""

    _closed: bool = False

    def close(self) -> None:
        """Release every table's files and locks (a table in ``DiskStorage``: its working
        file, whose rows are then gone: save a checkpoint first). A pipelined update not yet
        applied is dropped (call :meth:`flush` first to keep it). Afterwards a step raises
        ``RuntimeError``; closing again does nothing. In a sharded engine every rank closes.
        """
        if self._closed:
            return
        engine: Any = self
        try:
            engine._pipeline.wait()  # an update running in the background finishes first
        finally:
            engine._pipeline.discard()
            engine._pending = None
            self._closed = True
            close = getattr(engine.store, "close", None)  # a store without files may lack it
            if close is not None:
                close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(
                "EmbeddingEngine: this engine was closed (close() or the end of its with "
                "block) and its tables released; make a new engine, and load a checkpoint "
                "into it, to go on"
            )
